//! The as-of kernel's input: entity ids, times and ingestion order of every scanned
//! row, filled on all cores.

use std::collections::HashMap;

use arrow::array::{ArrayRef, AsArray};
use arrow::datatypes::{Int64Type, TimestampMicrosecondType};
use quiver_sdk::{Definitions, FeatureView};

use super::scan::Scan;
use crate::error::{Error, Result};
use crate::input::widen;
use crate::keys::EntityIndex;
use crate::schema::{ViewLayout, key_type, timestamp_type};

/// The kernel's per-row arrays for one view's scanned rows.
pub(super) struct KernelColumns {
    pub(super) entity: Vec<u32>,
    pub(super) ts: Vec<i64>,
    pub(super) created: Vec<i64>,
    pub(super) seq: Vec<i64>,
}

impl KernelColumns {
    /// The kernel's input for these rows and the spine's entities and times.
    pub(super) fn input<'a>(
        &'a self,
        index: &'a EntityIndex,
        times: &'a [i64],
        ttl_us: Option<i64>,
        created_cutoff: bool,
    ) -> quiver_gpu_join::AsOfInput<'a> {
        quiver_gpu_join::AsOfInput {
            spine_entity: &index.spine_ids,
            spine_ts: times,
            feature_entity: &self.entity,
            feature_ts: &self.ts,
            feature_created: (!self.created.is_empty()).then_some(self.created.as_slice()),
            feature_seq: &self.seq,
            n_entities: index.n_entities,
            ttl_us,
            created_cutoff,
        }
    }

    /// Flattens the scan into entity ids, times and seqs, splitting the batches over
    /// the cores (the hash lookups dominate). With `arrivals` (commit time per table
    /// version, and a shift), a row's created time is when its version was committed,
    /// shifted ([`super::Arrival`]).
    pub(super) fn fill(
        scan: &Scan,
        index: &EntityIndex,
        defs: &Definitions,
        view: &FeatureView,
        has_created: bool,
        arrivals: Option<(Option<&HashMap<u64, i64>>, i64)>,
    ) -> Result<KernelColumns> {
        let n = scan.rows;
        let mut out = KernelColumns {
            entity: vec![0; n],
            ts: vec![0; n],
            created: if has_created { vec![0; n] } else { Vec::new() },
            seq: vec![0; n],
        };
        let keys = defs.join_keys(view);
        let layout = ViewLayout::scanned(defs, view);
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let per_thread = n.div_ceil(threads).max(1);
        // Batch ranges of about `per_thread` rows each.
        let mut ranges = Vec::new();
        let (mut first, mut rows) = (0, 0);
        for (b, batch) in scan.batches.iter().enumerate() {
            rows += batch.num_rows();
            if rows >= per_thread || b + 1 == scan.batches.len() {
                ranges.push((first, b + 1, rows));
                first = b + 1;
                rows = 0;
            }
        }
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let mut entity: &mut [u32] = &mut out.entity;
            let mut ts: &mut [i64] = &mut out.ts;
            let mut created: &mut [i64] = &mut out.created;
            let mut seq: &mut [i64] = &mut out.seq;
            let mut handles = Vec::new();
            for &(b0, b1, len) in &ranges {
                let (e, rest) = std::mem::take(&mut entity).split_at_mut(len);
                entity = rest;
                let (t, rest) = std::mem::take(&mut ts).split_at_mut(len);
                ts = rest;
                let (c, rest) = if has_created { std::mem::take(&mut created).split_at_mut(len) } else { (&mut [][..], &mut [][..]) };
                created = rest;
                let (q, rest) = std::mem::take(&mut seq).split_at_mut(len);
                seq = rest;
                let (batches, keys, layout) = (&scan.batches[b0..b1], &keys, &layout);
                handles.push(s.spawn(move || -> Result<()> {
                    let mut at = 0;
                    for batch in batches {
                        let m = batch.num_rows();
                        let key_arrays: Vec<ArrayRef> = keys
                            .iter()
                            .enumerate()
                            .map(|(i, k)| widen(batch.column(i), &key_type(k.dtype)).map_err(Error::Request))
                            .collect::<Result<_>>()?;
                        index.lookup(&key_arrays, &mut e[at..at + m])?;
                        let micros = |i: usize| -> Result<ArrayRef> { Ok(arrow::compute::cast(batch.column(i), &timestamp_type())?) };
                        t[at..at + m].copy_from_slice(micros(layout.event_time())?.as_primitive::<TimestampMicrosecondType>().values());
                        let seq = layout.seq().expect("scanned rows");
                        let seqs = batch.column(seq).as_primitive::<Int64Type>().values();
                        if let Some((commits, shift)) = arrivals {
                            for (c, &q) in c[at..at + m].iter_mut().zip(seqs.iter()) {
                                let committed = commits.and_then(|t| t.get(&((q >> 32) as u64)));
                                *c = committed.map_or(i64::MIN, |t| t.saturating_add(shift));
                            }
                        } else if let Some(created) = layout.created_time() {
                            c[at..at + m].copy_from_slice(micros(created)?.as_primitive::<TimestampMicrosecondType>().values());
                        }
                        q[at..at + m].copy_from_slice(seqs);
                        at += m;
                    }
                    Ok(())
                }));
            }
            handles.into_iter().map(|h| h.join().expect("no panic in the flatten")).collect()
        });
        results.into_iter().collect::<Result<()>>()?;
        Ok(out)
    }
}
