#!/usr/bin/env python3
"""Write-bound materialization into Redis beside Redis's own pipelined SET (not a test).

    python bench/materialize_bench.py --quiver target/release/quiver [--entities 1000000] [--reps 2]

(`./run bench-serve` runs it after `serve_bench.py`.) One private redis-server on a free
loopback port. The data: `--entities` drivers with one row each, 8 features (4 int64,
4 float64), event times in the last hour, one Parquet file, ingested into one view
(with a 1 day TTL, so every key is written with an expiry). Then, per repetition, into
an emptied Redis:

1. `quiver materialize` over the whole range, end to end (the Delta scan, the latest
   row per entity, the encoding, the guarded writes): rows/s;
2. the same again into the full Redis (every key overwritten: the guard compares each
   stored row first);
3. `redis-benchmark -t set -P 64 -d <row bytes>` with as many keys on the same Redis:
   the limit of plain pipelined writes, without a guard or an expiry;
4. `redis-cli --pipe` of exactly the commands a materialization into an empty Redis
   sends — `SET <key> <row> NX PXAT <expiry>`, one per entity, keys and rows of the
   same sizes — the limit of what Redis can take for this job.

Prints the median rows/s of each and the ratios to the limit — for 1. also the rate of
its writes alone (after the Delta scan, from its debug timings) — Redis's own CPU per
million writes under 1. and under 4., and checks that the keys Redis holds after the
first materialization are one per entity.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchlib import cpu_seconds, free_port, stop_all, wait_port

US = 1_000_000


def run(cmd, env=None):
    began = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    secs = time.perf_counter() - began
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return secs, res.stdout + res.stderr


def redis_cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, check=True).stdout.strip()


def mass_insert(port, work, n, row_bytes):
    """Seconds `redis-cli --pipe` takes for the commands a materialization into an empty
    Redis sends: `SET quiver:matbench:drivers:i<id> <row> NX PXAT <expiry>` per entity."""
    path = os.path.join(work, "setnx.resp")
    if not os.path.exists(path):
        expiry = str(int(time.time() * 1000) + 2 * 86_400_000).encode()
        row = b"x" * row_bytes
        with open(path, "wb") as fh:
            for i in range(1, n + 1):
                key = b"quiver:matbench:drivers:i%d" % i
                fh.write(b"*6\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$2\r\nNX\r\n$4\r\nPXAT\r\n$%d\r\n%s\r\n"
                         % (len(key), key, len(row), row, len(expiry), expiry))
    with open(path, "rb") as fh:
        began = time.perf_counter()
        out = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], stdin=fh, capture_output=True, text=True, check=True).stdout
        secs = time.perf_counter() - began
    if f"errors: 0, replies: {n}" not in out:
        sys.exit(f"redis-cli --pipe: {out}")
    return secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--entities", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    work = tempfile.mkdtemp(prefix="quiver-materialize-bench.")
    procs = []
    rport = free_port()
    procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL))
    try:
        wait_port(rport, "redis-server")
        rng = np.random.default_rng(5)
        n = args.entities
        now = int(time.time() * US)
        ts_type = pa.timestamp("us", tz="UTC")
        cols = {"driver_id": np.arange(1, n + 1, dtype=np.int64),
                "event_timestamp": pa.array(now - rng.integers(60 * US, 3600 * US, n), ts_type)}
        for i in range(8):
            cols[f"f{i}"] = rng.integers(0, 1_000_000, n, dtype=np.int64) if i % 2 == 0 else rng.uniform(0, 100, n)
        path = os.path.join(work, "drivers.parquet")
        pq.write_table(pa.table(cols), path)
        repo = os.path.join(work, "repo")
        os.makedirs(repo)
        with open(os.path.join(repo, "quiver.yaml"), "w") as fh:
            fh.write(f"project: matbench\nregistry: registry.json\noffline_store:\n  path: data\n"
                     f"online_store:\n  type: redis\n  url: redis://127.0.0.1:{rport}/0\n")
        lines = ["entities:", "  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}", "feature_views:",
                 "  - name: drivers", "    entities: [driver]", "    ttl: 1d", "    features:"]
        lines += [f"      - {{name: f{i}, dtype: {'int64' if i % 2 == 0 else 'float64'}}}" for i in range(8)]
        with open(os.path.join(repo, "features.yaml"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
        q = [quiver, "--repo", repo]
        run(q + ["apply"])
        run(q + ["ingest", "drivers", path])
        window = ["2000-01-01T00:00:00Z", "2100-01-01T00:00:00Z"]
        fresh, again, limit, piped, writes = [], [], [], [], []
        redis_pid = procs[0].pid
        redis_cpu = {"quiver": [], "pipe": []}
        row_bytes = None
        for rep in range(args.reps):
            redis_cli(rport, "FLUSHALL")
            cpu = cpu_seconds(redis_pid)
            # The debug line says how long the scan took and how long the writes.
            secs, out = run(q + ["materialize", *window], env=dict(os.environ, QUIVER_LOG="quiver::materialize=debug"))
            redis_cpu["quiver"].append(cpu_seconds(redis_pid) - cpu)
            keys = int(redis_cli(rport, "DBSIZE"))
            if keys != n:
                sys.exit(f"Redis holds {keys} keys after materializing {n} entities:\n{out}")
            fresh.append(n / secs)
            phases = re.search(r"scan_s=([\d.]+) encode_and_write_s=([\d.]+)", re.sub(r"\x1b\[[0-9;]*m", "", out))
            if not phases:
                sys.exit(f"quiver materialize printed no phase timings:\n{out}")
            writes.append(n / float(phases.group(2)))
            print(f"rep {rep + 1}: scan {float(phases.group(1)):.2f} s, encode and write {float(phases.group(2)):.2f} s", flush=True)
            secs, _ = run(q + ["materialize", *window])
            again.append(n / secs)
            if row_bytes is None:
                key = redis_cli(rport, "RANDOMKEY")
                row_bytes = int(redis_cli(rport, "STRLEN", key))
            redis_cli(rport, "FLUSHALL")
            bench = subprocess.run(["redis-benchmark", "-p", str(rport), "-t", "set", "-P", "64", "-d", str(row_bytes),
                                    "-r", str(n), "-n", str(n), "-q", "--csv"], capture_output=True, text=True, check=True).stdout
            header, fields = ([f.strip('"') for f in line.split(",")] for line in bench.strip().splitlines()[:2])
            limit.append(float(dict(zip(header, fields))["rps"]))
            redis_cli(rport, "FLUSHALL")
            cpu = cpu_seconds(redis_pid)
            piped.append(n / mass_insert(rport, work, n, row_bytes))
            redis_cpu["pipe"].append(cpu_seconds(redis_pid) - cpu)
            print(f"rep {rep + 1}: materialize into an empty Redis {fresh[-1]:,.0f} rows/s, over its own rows "
                  f"{again[-1]:,.0f} rows/s; redis-benchmark SET -P 64 {limit[-1]:,.0f}/s; "
                  f"redis-cli --pipe SET NX PXAT {piped[-1]:,.0f}/s", flush=True)
        f, a, lim, pipe = statistics.median(fresh), statistics.median(again), statistics.median(limit), statistics.median(piped)
        w = statistics.median(writes)
        print()
        print(f"write-bound materialization, {n:,} entities x 1 row x 8 features ({row_bytes} bytes a row), "
              f"{os.cpu_count()} cores, median of {args.reps}")
        print(f"{'case':<48} {'rows/s':>12} {'vs SET -P 64':>13} {'vs the same SETs':>17}")
        print(f"{'quiver materialize, empty Redis':<48} {f:>12,.0f} {f / lim:>12.2f}x {f / pipe:>16.2f}x")
        print(f"{'  of which the writes alone (after the scan)':<48} {w:>12,.0f} {w / lim:>12.2f}x {w / pipe:>16.2f}x")
        print(f"{'quiver materialize, every key overwritten':<48} {a:>12,.0f} {a / lim:>12.2f}x")
        print(f"{'redis-benchmark SET -P 64 (no guard, no TTL)':<48} {lim:>12,.0f} {1:>12.2f}x")
        print(f"{'redis-cli --pipe: SET NX PXAT, one per entity':<48} {pipe:>12,.0f} {pipe / lim:>12.2f}x {1:>16.2f}x")
        print(f"Redis's own CPU per 1M writes: under quiver materialize {statistics.median(redis_cpu['quiver']) * 1e6 / n:.2f} s, "
              f"under redis-cli --pipe {statistics.median(redis_cpu['pipe']) * 1e6 / n:.2f} s")
    finally:
        stop_all(procs, timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
