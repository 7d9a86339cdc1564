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
//! All three steps run on all cores (scoped threads over disjoint slices). Memory: a
//! `u32` row id and an `i64` time per feature row, a `u32` per entity and thread, plus
//! the output.

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

/// Feature rows grouped by entity, each group sorted by (ts, created, seq). The event
/// times are copied next to the row ids so that sorting and searching a run reads
/// contiguous memory; created times and seqs are read only to break ties. Windowed
/// aggregations sweep the same runs.
#[derive(Debug)]
pub struct EntityRuns {
    /// `rows[offsets[e]..offsets[e + 1]]` are entity `e`'s rows.
    pub offsets: Vec<u32>,
    pub rows: Vec<u32>,
    /// `ts[i]` is the event time of `rows[i]`.
    pub ts: Vec<i64>,
}

impl EntityRuns {
    /// Groups and sorts `input`'s feature rows on `threads` threads (its spine and
    /// TTL play no part).
    pub fn build(input: &AsOfInput<'_>, threads: usize) -> Self {
        let n_ent = input.n_entities as usize;
        let n = input.feature_entity.len();
        // A stable, parallel counting sort: each thread counts its chunk of rows per
        // entity, the counts give every (entity, chunk) its own slots, and each thread
        // scatters its chunk into them, so rows keep their relative order.
        let chunk = n.div_ceil(threads).max(1 << 16);
        let chunks: Vec<&[u32]> = input.feature_entity.chunks(chunk).collect();
        let counts = count_per_chunk(&chunks, n_ent);
        let mut offsets = vec![0u32; n_ent + 1];
        // cursors[c][e]: where chunk c writes its first row of entity e.
        let mut cursors: Vec<Vec<u32>> = vec![vec![0; n_ent]; chunks.len()];
        let mut at = 0u32;
        for e in 0..n_ent {
            offsets[e] = at;
            for (c, count) in counts.iter().enumerate() {
                cursors[c][e] = at;
                at += count[e];
            }
        }
        offsets[n_ent] = at;
        drop(counts);
        let total = at as usize;
        let mut rows = vec![0u32; total];
        let mut ts = vec![0i64; total];
        scatter(input, &chunks, chunk, cursors, &mut rows, &mut ts);
        sort_runs(input, &offsets, &mut rows, &mut ts, threads);
        EntityRuns { offsets, rows, ts }
    }

    fn winner(&self, input: &AsOfInput<'_>, i: usize) -> u32 {
        let e = input.spine_entity[i];
        if e == NO_ENTITY {
            return NO_ROW;
        }
        let t = input.spine_ts[i];
        let range = self.offsets[e as usize] as usize..self.offsets[e as usize + 1] as usize;
        let (rows, ts) = (&self.rows[range.clone()], &self.ts[range]);
        let mut j = ts.partition_point(|&v| v <= t);
        let winner = loop {
            if j == 0 {
                return NO_ROW;
            }
            j -= 1;
            match input.feature_created {
                Some(created) if input.created_cutoff && created[rows[j] as usize] > t => continue,
                _ => break j,
            }
        };
        match input.ttl_us {
            Some(ttl) if ts[winner] < t.saturating_sub(ttl) => NO_ROW,
            _ => rows[winner],
        }
    }
}

/// Rows per entity in each chunk of `feature_entity`, one thread per chunk.
fn count_per_chunk(chunks: &[&[u32]], n_ent: usize) -> Vec<Vec<u32>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|ids| {
                s.spawn(move || {
                    let mut count = vec![0u32; n_ent];
                    for &e in *ids {
                        if e != NO_ENTITY {
                            count[e as usize] += 1;
                        }
                    }
                    count
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("count")).collect()
    })
}

/// Each chunk's rows (and their event times) into its own slots, one thread per chunk.
fn scatter(input: &AsOfInput<'_>, chunks: &[&[u32]], chunk: usize, cursors: Vec<Vec<u32>>, rows: &mut [u32], ts: &mut [i64]) {
    // Each chunk writes only the slots its cursors cover, which are disjoint by
    // construction; the base addresses cross into the threads as integers.
    let (rows_ptr, ts_ptr) = (rows.as_mut_ptr() as usize, ts.as_mut_ptr() as usize);
    std::thread::scope(|s| {
        for (c, (ids, mut cursor)) in chunks.iter().zip(cursors).enumerate() {
            s.spawn(move || {
                let base = c * chunk;
                for (k, &e) in ids.iter().enumerate() {
                    if e != NO_ENTITY {
                        let slot = &mut cursor[e as usize];
                        let r = base + k;
                        // SAFETY: `slot` ranges over this chunk's own slots of
                        // entity `e` (disjoint from every other chunk's), all
                        // below the length of both slices.
                        unsafe {
                            *(rows_ptr as *mut u32).add(*slot as usize) = r as u32;
                            *(ts_ptr as *mut i64).add(*slot as usize) = input.feature_ts[r];
                        }
                        *slot += 1;
                    }
                }
            });
        }
    });
}

/// Sorts each entity's run, splitting the entities into chunks of about equal row counts.
fn sort_runs(input: &AsOfInput<'_>, offsets: &[u32], rows: &mut [u32], ts: &mut [i64], threads: usize) {
    let n_ent = offsets.len() - 1;
    let target = rows.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let mut rest_rows: &mut [u32] = rows;
        let mut rest_ts: &mut [i64] = ts;
        let mut e = 0usize;
        while e < n_ent {
            let first = e;
            let base = offsets[first] as usize;
            while e < n_ent && (offsets[e] as usize - base) < target {
                e += 1;
            }
            let len = offsets[e] as usize - base;
            let (part_rows, tail) = std::mem::take(&mut rest_rows).split_at_mut(len);
            rest_rows = tail;
            let (part_ts, tail) = std::mem::take(&mut rest_ts).split_at_mut(len);
            rest_ts = tail;
            let offsets = &offsets[first..=e];
            s.spawn(move || {
                let mut scratch: Vec<(i64, i64, i64, u32)> = Vec::new();
                for w in offsets.windows(2) {
                    let range = (w[0] as usize - base)..(w[1] as usize - base);
                    sort_run(input, &mut part_rows[range.clone()], &mut part_ts[range], &mut scratch);
                }
            });
        }
    });
}

/// Sorts one entity's run by (ts, created, seq). A run already in that order (the
/// common case: ingestion sorts each file by key and time) is only checked, reading
/// created times and seqs just where event times tie.
fn sort_run(input: &AsOfInput<'_>, rows: &mut [u32], ts: &mut [i64], scratch: &mut Vec<(i64, i64, i64, u32)>) {
    let tie_key = |r: u32| {
        let r = r as usize;
        (input.feature_created.map_or(0, |c| c[r]), input.feature_seq[r])
    };
    let in_order = (1..ts.len()).all(|k| ts[k - 1] < ts[k] || (ts[k - 1] == ts[k] && tie_key(rows[k - 1]) < tie_key(rows[k])));
    if in_order {
        return;
    }
    scratch.clear();
    scratch.extend(rows.iter().zip(ts.iter()).map(|(&r, &t)| {
        let created = input.feature_created.map_or(0, |c| c[r as usize]);
        (t, created, input.feature_seq[r as usize], r)
    }));
    scratch.sort_unstable();
    for (k, &(t, _, _, r)) in scratch.iter().enumerate() {
        ts[k] = t;
        rows[k] = r;
    }
}
