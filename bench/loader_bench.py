#!/usr/bin/env python3
"""The PyTorch loader's speed with row-level shuffle on, beside a plain pyarrow-Parquet
IterableDataset with the same shuffle over the same files (not a test).

    <sdk-venv>/bin/python bench/loader_bench.py --quiver target/release/quiver
        [--rows 1000000] [--shards 16] [--batch-size 1024] [--reps 5]

(`./run bench-export` runs this after the export benchmark.) Makes a repository with one
view of 10 float64 features, ingests `--rows` rows, exports them with `--rows-of` (no
spine) into `--shards` shards, then times one epoch of each loader over the 10 joined
feature columns, with 0 and 2 DataLoader workers, alternating which goes first, medians
of `--reps`:

- quiver: `TrainingSet(...).to_torch(batch_size, columns, shuffle=True, seed=1)` through
  `.loader(num_workers=N)` (rank 0 of 1);
- plain: an IterableDataset that reads the same Parquet row groups with pyarrow, in a
  seeded order split across workers, permutes the rows of every 4 row groups (the same
  window) and yields dicts of tensors (`torch.from_numpy` of slices).

An epoch's time includes starting the workers. Rows/s = rows of the epoch / its wall time.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import quiver as qv

FEATURES = [f"f{i}" for i in range(10)]


class PlainParquet(IterableDataset):
    """The peer: pyarrow reads row groups in a seeded order, dealt to workers; every 4
    row groups' rows are permuted and cut into batches."""

    def __init__(self, files, columns, batch_size, seed):
        self.files, self.columns, self.batch_size, self.seed = files, columns, batch_size, seed

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        readers = [pq.ParquetFile(f) for f in self.files]
        groups = [(k, g) for k, r in enumerate(readers) for g in range(r.num_row_groups)]
        order = np.random.default_rng([self.seed, 0]).permutation(len(groups))
        windows = [order[i:i + 4] for i in range(0, len(order), 4)]
        for j, window in enumerate(windows):
            if j % workers != worker:
                continue
            tables = [readers[groups[i][0]].read_row_group(groups[i][1], columns=self.columns) for i in window]
            arrays = {c: np.concatenate([t.column(c).to_numpy() for t in tables]) for c in self.columns}
            n = len(arrays[self.columns[0]])
            perm = np.random.default_rng([self.seed, 0, j]).permutation(n)
            arrays = {c: a[perm] for c, a in arrays.items()}
            for s in range(0, n, self.batch_size):
                yield {c: torch.from_numpy(a[s:s + self.batch_size]) for c, a in arrays.items()}


def epoch(loader):
    began, rows = time.perf_counter(), 0
    for batch in loader:
        rows += len(next(iter(batch.values())))
    return rows, time.perf_counter() - began


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    work = tempfile.mkdtemp(prefix="quiver-loader-bench.")
    try:
        repo = os.path.join(work, "repo")
        subprocess.run([quiver, "init", repo], check=True, capture_output=True)
        lines = ["entities:", "  - name: item", "    join_keys: [{name: item_id, dtype: int64}]", "feature_views:",
                 "  - name: items", "    entities: [item]", "    source: {timestamp_field: event_timestamp}",
                 "    features:"]
        lines += [f"      - {{name: {f}, dtype: float64}}" for f in FEATURES]
        lines += ["feature_services:", "  - name: all10", "    features: [" + ", ".join(f"items:{f}" for f in FEATURES) + "]"]
        with open(os.path.join(repo, "features.yaml"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
        rng = np.random.default_rng(0)
        cols = {"item_id": pa.array(np.arange(args.rows, dtype=np.int64)),
                "event_timestamp": pa.array(np.full(args.rows, 1_764_547_200_000_000, dtype=np.int64)).cast(
                    pa.timestamp("us", tz="UTC"))}
        for f in FEATURES:
            cols[f] = pa.array(rng.standard_normal(args.rows))
        pq.write_table(pa.table(cols), os.path.join(work, "items.parquet"))
        run = lambda *a: subprocess.run([quiver, *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
        run("apply")
        run("ingest", "items", os.path.join(work, "items.parquet"))
        out = os.path.join(work, "ts")
        run("export", "--service", "all10", "--rows-of", "items", "--out", out,
            "--shard-rows", str(-(-args.rows // args.shards)))
        ts = qv.TrainingSet(out)
        columns = [f"items__{f}" for f in FEATURES]
        results = {}
        for workers in (0, 2):
            for rep in range(args.reps):
                # Alternating which goes first (the first epoch of a process pays for
                # cold caches).
                for name in (("quiver", "plain") if rep % 2 == 0 else ("plain", "quiver")):
                    if name == "quiver":
                        data = ts.to_torch(batch_size=args.batch_size, columns=columns, shuffle=True, seed=1)
                        loader = data.loader(num_workers=workers)
                    else:
                        loader = DataLoader(PlainParquet(ts.files, columns, args.batch_size, 1), batch_size=None,
                                            num_workers=workers)
                    rows, secs = epoch(loader)
                    assert rows == ts.num_rows, rows
                    results.setdefault((name, workers), []).append(rows / secs)
                print(f"rep {rep + 1}, {workers} workers: quiver {results[('quiver', workers)][-1]:,.0f} rows/s, "
                      f"plain pyarrow {results[('plain', workers)][-1]:,.0f} rows/s", flush=True)
        print()
        print(f"{ts.num_rows:,} rows x 10 float64 features in {len(ts.files)} shards, batches of {args.batch_size:,}, "
              f"row-level shuffle on; one epoch, medians of {args.reps}")
        print("| workers | quiver to_torch rows/s | plain pyarrow IterableDataset rows/s | ratio |")
        print("|---|---|---|---|")
        for workers in (0, 2):
            a, b = statistics.median(results[("quiver", workers)]), statistics.median(results[("plain", workers)])
            print(f"| {workers} | {a:,.0f} | {b:,.0f} | {a / b:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
