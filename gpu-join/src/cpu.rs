//! The CPU as-of kernel: the reference every other engine must match, and the fallback.
//!
//! 1. Bucket the feature rows by entity (a counting sort: one pass to count, one to
//!    scatter), so each entity's rows are one contiguous run.
//! 2. Sort each run by (ts, created, seq); runs are short, and already sorted when
//!    the data was ingested in time order.
//! 3. For each spine row, binary-search its entity's run for the last row with
//!    `ts <= t`; under the created cutoff, step back to the first with `created <= t`;
//!    then apply the TTL.
//!
//! Steps 2 and 3 run on all cores (scoped threads over disjoint slices). Memory: one
//! `u32` per feature row and per entity, plus the output.

use std::num::NonZeroUsize;

use crate::kernel::{AsOfInput, AsOfKernel, KernelError, NO_ENTITY, NO_ROW};

/// The CPU engine.
#[derive(Debug, Clone)]
pub struct CpuKernel {
    threads: usize,
}

impl Default for CpuKernel {
    fn default() -> Self {
        CpuKernel::new()
    }
}

impl CpuKernel {
    /// Uses every core.
    pub fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
        CpuKernel { threads }
    }

    /// Uses `threads` threads (at least one).
    #[must_use]
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }
}

impl AsOfKernel for CpuKernel {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn join(&self, input: &AsOfInput<'_>) -> Result<Vec<u32>, KernelError> {
        input.validate()?;
        let runs = EntityRuns::build(input, self.threads);
        let mut out = vec![NO_ROW; input.spine_entity.len()];
        let chunk = out.len().div_ceil(self.threads).max(4096);
        std::thread::scope(|s| {
            for (i, part) in out.chunks_mut(chunk).enumerate() {
                let runs = &runs;
                s.spawn(move || {
                    let start = i * chunk;
                    for (k, slot) in part.iter_mut().enumerate() {
                        *slot = runs.winner(input, start + k);
                    }
                });
            }
        });
        Ok(out)
    }
}

/// Feature rows grouped by entity, each group sorted by (ts, created, seq).
struct EntityRuns {
    /// `rows[offsets[e]..offsets[e + 1]]` are entity `e`'s rows.
    offsets: Vec<u32>,
    rows: Vec<u32>,
}

impl EntityRuns {
    fn build(input: &AsOfInput<'_>, threads: usize) -> Self {
        let n_ent = input.n_entities as usize;
        let mut offsets = vec![0u32; n_ent + 1];
        for &e in input.feature_entity {
            if e != NO_ENTITY {
                offsets[e as usize + 1] += 1;
            }
        }
        for e in 0..n_ent {
            offsets[e + 1] += offsets[e];
        }
        let mut cursor = offsets[..n_ent].to_vec();
        let mut rows = vec![0u32; offsets[n_ent] as usize];
        for (r, &e) in input.feature_entity.iter().enumerate() {
            if e != NO_ENTITY {
                let c = &mut cursor[e as usize];
                rows[*c as usize] = r as u32;
                *c += 1;
            }
        }
        drop(cursor);

        // Sort each run, splitting the entities into chunks of about equal row counts.
        let key = |r: u32| {
            let r = r as usize;
            (
                input.feature_ts[r],
                input.feature_created.map_or(0, |c| c[r]),
                input.feature_seq[r],
            )
        };
        let target = rows.len().div_ceil(threads).max(1);
        std::thread::scope(|s| {
            let mut rest: &mut [u32] = &mut rows;
            let mut e = 0usize;
            while e < n_ent {
                let first = e;
                let base = offsets[first] as usize;
                while e < n_ent && (offsets[e] as usize - base) < target {
                    e += 1;
                }
                let len = offsets[e] as usize - base;
                let (part, tail) = rest.split_at_mut(len);
                rest = tail;
                let offsets = &offsets[first..=e];
                s.spawn(move || {
                    for w in offsets.windows(2) {
                        let run = &mut part[(w[0] as usize - base)..(w[1] as usize - base)];
                        if !run.is_sorted_by_key(|&r| key(r)) {
                            run.sort_unstable_by_key(|&r| key(r));
                        }
                    }
                });
            }
        });
        EntityRuns { offsets, rows }
    }

    fn winner(&self, input: &AsOfInput<'_>, i: usize) -> u32 {
        let e = input.spine_entity[i];
        if e == NO_ENTITY {
            return NO_ROW;
        }
        let t = input.spine_ts[i];
        let run = &self.rows[self.offsets[e as usize] as usize..self.offsets[e as usize + 1] as usize];
        let mut j = run.partition_point(|&r| input.feature_ts[r as usize] <= t);
        let winner = loop {
            if j == 0 {
                return NO_ROW;
            }
            j -= 1;
            let r = run[j];
            match input.feature_created {
                Some(created) if input.created_cutoff && created[r as usize] > t => continue,
                _ => break r,
            }
        };
        match input.ttl_us {
            Some(ttl) if input.feature_ts[winner as usize] < t.saturating_sub(ttl) => NO_ROW,
            _ => winner,
        }
    }
}
