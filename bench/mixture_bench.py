#!/usr/bin/env python3
"""What mixing costs the loader (not a test; docs/mixing.md).

    <sdk venv>/bin/python bench/mixture_bench.py [--rows 1000000] [--reps 3]
        [--weights "1,1,1 0.5,0.3,0.2"] [--workers 0,2]

(`./run bench-mixture` builds the SDK and runs this.) Three training sets of --rows rows x
10 float64 columns each (Parquet shards of 500,000 rows in row groups of 65,536, as `quiver
export` writes them), and one set holding the same 3 x --rows rows. Then, for each
mixture's weights and for 0 and 2 data-loader workers, shuffled, batches of 1,024 rows,
one epoch each, alternating:

1. one set's loader (`TrainingSet.to_torch`) over the single set;
2. `Mixture` of the three sets, every source `stop` (the epoch ends when the first runs
   out), through the same loader calls: with equal weights (`1,1,1`, the first setting)
   it reads every row once, the same rows as one set's loader; with 0.5 / 0.3 / 0.2 it
   hands out 2 x --rows rows and reads the windows the sources that do not stop leave part
   read as well.

A new dataset each epoch (`to_torch`), as the loop over epochs here makes it. Prints rows/s
(rows handed to the training loop over wall time, iterator creation included) and the
ratio (the issue's target: at least 0.9x).
"""
import argparse
import hashlib
import json
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import quiver as qv

SHARD_ROWS = 500_000
GROUP_ROWS = 65_536


def write_set(path, n, offset, rng):
    os.makedirs(path)
    shards = []
    for s, lo in enumerate(range(0, n, SHARD_ROWS)):
        hi = min(n, lo + SHARD_ROWS)
        cols = {"id": np.arange(offset + lo, offset + hi, dtype=np.int64)}
        cols.update({f"f{i}": rng.random(hi - lo) for i in range(10)})
        name = f"part-{s:05d}.parquet"
        pq.write_table(pa.table(cols), os.path.join(path, name), row_group_size=GROUP_ROWS)
        digest = hashlib.sha256(open(os.path.join(path, name), "rb").read()).hexdigest()
        shards.append({"file": name, "rows": hi - lo, "sha256": digest})
    manifest = {"format_version": 1, "training_set_id": hashlib.sha256(path.encode()).hexdigest()[:32],
                "project": "bench", "registry_version": 1,
                "options": {"service": "bench", "format": "parquet", "shard_rows": SHARD_ROWS, "created_cutoff": False,
                            "group_rows": GROUP_ROWS},
                "delta_versions": {}, "spine": {"path": "-", "sha256": "0", "rows": n}, "features": [],
                "schema": [["id", "Int64"]] + [[f"f{i}", "Float64"] for i in range(10)], "rows": n, "shards": shards}
    with open(os.path.join(path, "manifest.json"), "w") as fh:
        json.dump(manifest, fh)
    return qv.TrainingSet(path)


def epoch(make, workers):
    began = time.perf_counter()
    ds = make()
    rows = 0
    for batch in ds.loader(num_workers=workers):
        rows += len(batch["f0"])
    return rows, time.perf_counter() - began


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--weights", default="1,1,1 0.5,0.3,0.2",
                    help="the mixtures' weights of sets a, b, c: one setting or several, separated by spaces")
    ap.add_argument("--workers", default="0,2")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="quiver-mixture-bench.")
    try:
        rng = np.random.default_rng(3)
        n = args.rows
        sets = {name: write_set(os.path.join(work, name), n, k * n, rng) for k, name in enumerate(("a", "b", "c"))}
        # The same rows as one set: the three sets' shards side by side.
        one = os.path.join(work, "one")
        os.makedirs(one)
        shards = []
        for name, ts in sets.items():
            for shard, f in zip(ts.manifest["shards"], ts.files):
                target = f"{name}-{shard['file']}"
                os.link(f, os.path.join(one, target))
                shards.append({**shard, "file": target})
        manifest = dict(sets["a"].manifest, training_set_id="1" * 32, rows=3 * n, shards=shards)
        with open(os.path.join(one, "manifest.json"), "w") as fh:
            json.dump(manifest, fh)
        single = qv.TrainingSet(one)
        print(f"{3 * n:,} rows x 10 float64 in 3 sets (and as one set), shuffled, batches of 1,024", flush=True)
        for setting in args.weights.split():
            weights = dict(zip("abc", (float(w) for w in setting.split(","))))
            mixture = qv.Mixture(sets, weights=weights)
            print(f"mixture weights {weights}, every source `stop`", flush=True)
            for workers in (int(w) for w in args.workers.split(",")):
                runs = {"one set": [], "mixture": []}
                for rep in range(args.reps):
                    order = ["one set", "mixture"] if rep % 2 == 0 else ["mixture", "one set"]
                    for what in order:
                        if what == "one set":
                            make = lambda: single.to_torch(batch_size=1024, shuffle=True, seed=rep)  # noqa: E731
                        else:
                            make = lambda: mixture.to_torch(batch_size=1024, shuffle=True, seed=rep)  # noqa: E731
                        rows, secs = epoch(make, workers)
                        runs[what].append(rows / secs)
                    print(f"weights {setting}, workers {workers}, rep {rep + 1}: "
                          + ", ".join(f"{k} {v[-1]:,.0f} rows/s" for k, v in runs.items()), flush=True)
                a, b = statistics.median(runs["one set"]), statistics.median(runs["mixture"])
                print(f"weights {setting}, workers {workers} (median of {args.reps}): one set {a:,.0f} rows/s, "
                      f"mixture {b:,.0f} rows/s = {b / a:.3f}x", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
