#!/usr/bin/env python3
"""What lineage events cost the jobs they describe (not a test; docs/lineage.md).

    <venv>/bin/python bench/lineage_bench.py --quiver target/release/quiver [--rows 2000000] [--reps 3]

(`./run bench-lineage` installs everything and runs this.) Three settings, in one run,
alternating repetition by repetition so the machine's drift falls on all of them:

- `off`: no `lineage:` section;
- `file`: the file transport (every event appended under the file's lock);
- `http-stalled`: the http transport to a loopback port that takes connections and never
  answers (the job's exit waits on it half a second at most: a job shorter than that
  pays for it; these jobs are longer).

1. `quiver ingest` of one Parquet file (--rows rows, 6 float64 features, --rows / 10
   drivers) into a fresh repository: rows/s, from the process's start to its exit;
2. `quiver materialize` of that table into an emptied private Redis: rows/s, the same;
3. `bench/stream_bench.py --throughput-only` (a backlog of --events messages streamed
   into Redis and Delta, a RUNNING event a second) per setting: events/s and events per
   CPU-second of the quiver process.

Prints the medians and the ratio of each setting to `off` (the issue's target: at least
0.98).
"""
import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchlib import free_port, lineage_section, stop_all, wait_port

MODES = ("off", "file", "http-stalled")
FEATURES = """entities:
  - name: driver
    join_keys: [{name: driver_id, dtype: int64}]
feature_views:
  - name: drivers
    entities: [driver]
    ttl: 1d
    online: true
    source: {timestamp_field: event_timestamp}
    features:
""" + "".join(f"      - {{name: f{i}, dtype: float64}}\n" for i in range(6))


CPU = {}


def timed(cmd):
    """Wall seconds of `cmd`; its CPU seconds (user + system, every thread) in CPU[cmd[3]]."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    CPU[cmd[3]] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return secs


def repo(work, name, mode, rport, db):
    path = os.path.join(work, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    with open(os.path.join(path, "quiver.yaml"), "w") as fh:
        fh.write(f"project: lineagebench\nregistry: registry.json\noffline_store:\n  path: data\n"
                 f"online_store:\n  type: redis\n  url: redis://127.0.0.1:{rport}/{db}\n" + lineage_section(mode))
    with open(os.path.join(path, "features.yaml"), "w") as fh:
        fh.write(FEATURES)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-stream", action="store_true")
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    work = tempfile.mkdtemp(prefix="quiver-lineage-bench.")
    procs = []
    try:
        rport = free_port()
        procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no"], stdout=subprocess.DEVNULL))
        wait_port(rport, "redis")
        rng = np.random.default_rng(7)
        n = args.rows
        now = int(time.time() * 1_000_000)
        table = pa.table({
            "driver_id": pa.array(rng.integers(0, max(n // 10, 1), n), pa.int64()),
            "event_timestamp": pa.array(now - rng.integers(0, 3_600_000_000, n), pa.timestamp("us", tz="UTC")),
            **{f"f{i}": pa.array(rng.random(n)) for i in range(6)},
        })
        data = os.path.join(work, "drivers.parquet")
        pq.write_table(table, data)
        ingest = {m: [] for m in MODES}
        materialize = {m: [] for m in MODES}
        cpu = {(job, m): [] for job in ("ingest", "materialize") for m in MODES}
        start = "2000-01-01T00:00:00Z"
        for rep in range(args.reps):
            for m in (MODES if rep % 2 == 0 else MODES[::-1]):
                path = repo(work, f"repo-{m}", m, rport, 0)
                timed([quiver, "--repo", path, "apply"])
                ingest[m].append(n / timed([quiver, "--repo", path, "ingest", "drivers", data]))
                cpu[("ingest", m)].append(CPU["ingest"])
                subprocess.run(["redis-cli", "-p", str(rport), "flushall"], check=True, capture_output=True)
                materialize[m].append(n / timed([quiver, "--repo", path, "materialize", start, "now"]))
                cpu[("materialize", m)].append(CPU["materialize"])
                if m != "off":
                    events = os.path.join(path, "lineage.jsonl")
                    if m == "file" and not os.path.exists(events):
                        sys.exit(f"{m}: no lineage events were written")
            print(f"rep {rep + 1}: " + ", ".join(f"{m} ingest {ingest[m][-1]:,.0f} rows/s, materialize {materialize[m][-1]:,.0f} rows/s"
                                                  for m in MODES), flush=True)
        for what, runs in (("ingest", ingest), ("materialize", materialize)):
            base = statistics.median(runs["off"])
            base_cpu = statistics.median(cpu[(what, "off")])
            print(f"{what} ({n:,} rows, median of {args.reps}): " + "; ".join(
                f"{m} {statistics.median(runs[m]):,.0f} rows/s ({statistics.median(runs[m]) / base:.3f}x), "
                f"{statistics.median(cpu[(what, m)]):.2f} CPU-s ({base_cpu / statistics.median(cpu[(what, m)]):.3f}x)" for m in MODES),
                flush=True)
        if args.skip_stream:
            return
        here = os.path.dirname(os.path.abspath(__file__))
        stream = {m: [] for m in MODES}
        per_cpu = {m: [] for m in MODES}
        for rep in range(args.reps):
            for m in (MODES if rep % 2 == 0 else MODES[::-1]):
                out = subprocess.run([sys.executable, os.path.join(here, "stream_bench.py"), "--quiver", quiver,
                                      "--events", str(args.events), "--throughput-only", "--lineage", m],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"stream_bench --lineage {m} failed:\n{out.stdout}\n{out.stderr[-3000:]}")
                found = re.search(r"= ([\d,]+) events/s; quiver used [\d.]+ CPU-s = ([\d,]+) events per CPU-second", out.stdout)
                stream[m].append(float(found.group(1).replace(",", "")))
                per_cpu[m].append(float(found.group(2).replace(",", "")))
            print(f"rep {rep + 1}: " + ", ".join(f"{m} stream {stream[m][-1]:,.0f} events/s ({per_cpu[m][-1]:,.0f}/CPU-s)"
                                                  for m in MODES), flush=True)
        base, base_cpu = statistics.median(stream["off"]), statistics.median(per_cpu["off"])
        print(f"stream ({args.events:,} events, median of {args.reps}): " + "; ".join(
            f"{m} {statistics.median(stream[m]):,.0f} events/s ({statistics.median(stream[m]) / base:.3f}x), "
            f"{statistics.median(per_cpu[m]):,.0f} per CPU-s ({statistics.median(per_cpu[m]) / base_cpu:.3f}x)" for m in MODES))
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
