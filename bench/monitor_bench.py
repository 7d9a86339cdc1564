#!/usr/bin/env python3
"""Profiling an offline window for monitoring, beside DuckDB computing the same
statistics (not a test).

    <venv>/bin/python bench/monitor_bench.py --quiver target/release/quiver [--rows 10000000] [--reps 3]

(`./run bench-monitor` installs everything and runs this.) One Parquet file of --rows
rows x 10 features — 6 float64 (normal, skewed, with 2% nulls), 2 int64, 2 strings (8
and 1,000 distinct values) — ingested into one view, over 30 days of event times. Each
rep times `quiver monitor --reference offline:<days 0-15> --current offline:<days
15-30> --json` over the 10 features: both windows profiled (every row, every feature:
rows x 10 values) and compared. Beside it, DuckDB over the view's own Delta data files
(the same Parquet Quiver reads) computes per window and feature what a profile holds:
count, nulls (`count(*) FILTER (WHERE f IS NULL)`), min, max, avg, stddev and the nine
deciles (`approx_quantile`) of numbers, `histogram` of strings. Medians of wall time;
values/s = rows x 10 / wall.
"""
import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FLOATS = [f"x{i}" for i in range(6)]
INTS = ["n0", "n1"]
STRINGS = ["s0", "s1"]


def generate(rows, path):
    rng = np.random.default_rng(11)
    base = np.datetime64("2026-01-01T00:00:00", "us").astype(np.int64)
    cols = {
        "user_id": pa.array(rng.integers(0, 1_000_000, rows)),
        "event_timestamp": pa.array(base + rng.integers(0, 86_400_000_000 * 30, rows), pa.timestamp("us", tz="UTC")),
    }
    for i, name in enumerate(FLOATS):
        values = rng.lognormal(0, 1, rows) if i % 2 else rng.normal(i, 1 + i, rows)
        cols[name] = pa.array(values, mask=rng.random(rows) < 0.02)
    for i, name in enumerate(INTS):
        cols[name] = pa.array(rng.integers(0, 10 ** (2 + 3 * i), rows))
    for name, distinct in zip(STRINGS, (8, 1000)):
        words = np.array([f"v{k}" for k in range(distinct)])
        cols[name] = pa.array(words[rng.zipf(1.3, rows) % distinct])
    pq.write_table(pa.table(cols), path)


def repo(work, quiver, data):
    r = os.path.join(work, "repo")
    os.makedirs(r)
    with open(os.path.join(r, "quiver.yaml"), "w") as fh:
        fh.write("project: monbench\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n  type: embedded\n  path: online.db\n")
    features = [f"      - {{name: {f}, dtype: float64}}" for f in FLOATS] + [f"      - {{name: {f}, dtype: int64}}" for f in INTS] \
        + [f"      - {{name: {f}, dtype: string}}" for f in STRINGS]
    with open(os.path.join(r, "features.yaml"), "w") as fh:
        fh.write("entities:\n  - {name: user, join_keys: [{name: user_id, dtype: int64}]}\nfeature_views:\n  - name: events\n"
                 "    entities: [user]\n    source: {timestamp_field: event_timestamp}\n    features:\n" + "\n".join(features) + "\n")
    for cmd in (["apply"], ["ingest", "events", data]):
        p = subprocess.run([quiver, "--repo", r] + cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"quiver {cmd}: {p.stderr}")
    return r


DUCKDB = r"""
import sys, duckdb
files, floats, ints, strings = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3].split(","), sys.argv[4].split(",")
con = duckdb.connect()
con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({files!r})")
out = []
for lo, hi in (("2026-01-01", "2026-01-16"), ("2026-01-16", "2026-01-31")):
    parts = ["count(*)"]
    for f in floats + ints:
        parts += [f"count(*) FILTER (WHERE {f} IS NULL)", f"min({f})", f"max({f})", f"avg({f})", f"stddev_samp({f})",
                  f"approx_quantile({f}, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])"]
    for f in strings:
        parts += [f"count(*) FILTER (WHERE {f} IS NULL)", f"histogram({f})"]
    w = f"event_timestamp >= TIMESTAMPTZ '{lo} 00:00:00+00' AND event_timestamp < TIMESTAMPTZ '{hi} 00:00:00+00'"
    out.append(con.execute(f"SELECT {', '.join(parts)} FROM t WHERE {w}").fetchone()[0])
print(out)
"""


def timed(cmd, ok=(0,)):
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode not in ok:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return wall, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="a Python with duckdb")
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    work = tempfile.mkdtemp(prefix="quiver-monitor-bench.")
    try:
        data = os.path.join(work, "events.parquet")
        print(f"== data: {args.rows:,} rows x 10 features (6 float64 with 2% nulls, 2 int64, 2 strings)", flush=True)
        generate(args.rows, data)
        r = repo(work, quiver, data)
        files = sorted(glob.glob(os.path.join(r, "data", "events", "*.parquet")))
        features = ",".join(f"events:{f}" for f in FLOATS + INTS + STRINGS)
        monitor = [quiver, "--repo", r, "monitor", "--features", features, "--reference", "offline:2026-01-01..2026-01-16",
                   "--current", "offline:2026-01-16..2026-01-31", "--json"]
        duck = [args.python, "-c", DUCKDB, ",".join(files), ",".join(FLOATS), ",".join(INTS), ",".join(STRINGS)]
        q_walls, d_walls = [], []
        for rep in range(args.reps):
            # Exit 1 is a breach (the windows differ at random): the timing holds.
            w, out = timed(monitor, ok=(0, 1))
            q_walls.append(w)
            w, _ = timed(duck)
            d_walls.append(w)
            print(f"rep {rep + 1}: quiver monitor {q_walls[-1]:.2f} s, duckdb {d_walls[-1]:.2f} s", flush=True)
        import json
        report = json.loads(out)
        counted = sum(f["count"]["reference"] + f["count"]["current"] for f in report["features"])
        if counted != args.rows * 10:
            sys.exit(f"quiver profiled {counted} values, expected {args.rows * 10}")
        q, d = statistics.median(q_walls), statistics.median(d_walls)
        values = args.rows * 10
        print()
        print("| engine | wall s (median of %d) | values/s | vs duckdb |" % args.reps)
        print("|---|---|---|---|")
        print(f"| quiver monitor (both windows profiled, compared) | {q:.2f} | {values / q / 1e6:.1f}M | {q / d:.2f}x the time |")
        print(f"| duckdb (the same statistics, approx_quantile, histogram) | {d:.2f} | {values / d / 1e6:.1f}M | 1.00x |")
        print(f"\n{values:,} values profiled by quiver (every row of both windows, 10 features); {os.cpu_count()} cores")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
