#!/usr/bin/env python3
"""What keeping the serving window's profiles costs `quiver serve` (docs/monitoring.md):
the serving log on, with and without `monitoring.reference` (not a test).

    <feast-venv>/bin/python bench/monitor_serve_bench.py --quiver target/release/quiver [--entities 100000] [--duration 10]

(`./run bench-monitor` runs this after the offline benchmark.) The data, repository and
Redis of bench/serve_bench.py (2 views x 10 features, a service `all20` of the 20).
Two servers log every answer to their own Delta tables; the second also keeps the
serving window's counts against a training set of `all20` (every driver, exported
here) and exports the gauges.
For 1, 10 and 100 entities x 20 features:

1. the user-space instructions per request of each (cachegrind; `instructions()` of
   serve_bench.py: the difference between N2 and N1 requests over one keep-alive
   connection, so start-up cancels; the log's writer thread and its commits included):
   steady from run to run, unlike throughput on a shared 2-core machine;
2. wrk throughput of each at 8 connections, the two runs back to back, three rounds,
   medians.

Needs redis-server, wrk and valgrind on PATH.
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
from benchlib import free_port, stop_all, wait_http, wrk
from serve_bench import VIEWS, generate, instructions, quiver_repo, timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--entities", type=int, default=100_000)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    work = tempfile.mkdtemp(prefix="quiver-monitor-serve.")
    procs = []
    rport = free_port()
    procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL))
    try:
        time.sleep(0.5)
        rng = random.Random(42)
        now = datetime.now(timezone.utc)
        files = generate(work, args.entities, 5, now, rng)
        repo = quiver_repo(work, files, rport)
        q = [quiver, "--repo", repo]
        timed(q + ["apply"])
        for view, path in files.items():
            timed(q + ["ingest", view, path])
        start, end = (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ"), (now + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        timed(q + ["materialize", start, end])
        # The reference: a training set of every driver now (its profile is read from the
        # manifest at start, the same work every time, so start-up cancels out of the
        # instruction counts; an offline reference is profiled from Delta at start).
        spine = os.path.join(work, "spine.parquet")
        pq.write_table(pa.table({"driver_id": pa.array(range(1, args.entities + 1), pa.int64()),
                                 "event_timestamp": pa.array([now] * args.entities, pa.timestamp("us", tz="UTC"))}), spine)
        training = os.path.join(work, "training")
        timed(q + ["export", "--service", "all20", "--spine", spine, "--out", training])
        logged = dict(os.environ, QUIVER_SERVING_LOG_ENABLED="true", QUIVER_SERVING_LOG_PATH=os.path.join(work, "log_a"))
        profiled = dict(os.environ, QUIVER_SERVING_LOG_ENABLED="true", QUIVER_SERVING_LOG_PATH=os.path.join(work, "log_b"),
                        QUIVER_MONITORING_REFERENCE=f"training:{training}")
        features = [f"{v}:{f}" for v, fs in VIEWS.items() for f in fs]
        ids = rng.sample(range(1, args.entities + 1), 100)
        counts = {1: (200, 2200), 10: (100, 1100), 100: (50, 450)}
        inst = {}
        # Under cachegrind a server runs ~50x slower, so a log committing every second
        # would commit a number of times that depends on timing, and each commit costs
        # millions of instructions: counted, the log commits once, at shutdown, with
        # every row (its cost still scales with the requests).
        once = dict(QUIVER_SERVING_LOG_BATCH_MS="3600000", QUIVER_SERVING_LOG_BATCH_ROWS="10000000")
        for n, (n1, n2) in counts.items():
            body = {"entities": {"driver_id": ids[:n]}, "features": features}
            port = free_port()
            a = instructions(q + ["serve", "--port", str(port)], port, body, (n1, n2), work, env=dict(logged, **once))
            port = free_port()
            b = instructions(q + ["serve", "--port", str(port)], port, body, (n1, n2), work, env=dict(profiled, **once))
            inst[n] = (a, b)
            print(f"{n} entities: {a:,.0f} instructions per request with the serving log, {b:,.0f} with its profiles too ({b / a:.3f})",
                  flush=True)
        if args.rounds == 0:
            return
        ports = (free_port(), free_port())
        servers = [subprocess.Popen(q + ["serve", "--port", str(p)], env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for p, e in zip(ports, (logged, profiled))]
        procs += servers
        for p in ports:
            wait_http(f"http://127.0.0.1:{p}/health", "quiver serve", timeout=120)
        rps = {n: ([], []) for n in counts}
        for _ in range(args.rounds):
            for n in counts:
                body = {"entities": {"driver_id": ids[:n]}, "features": features}
                for k, p in enumerate(ports):
                    rps[n][k].append(wrk(f"http://127.0.0.1:{p}/get-online-features", body, args.duration, work)[0])
        print()
        print("| entities x 20 features | instructions/request, serving log | log and profiles | ratio "
              f"| req/s, serving log (median of {args.rounds}) | log and profiles | ratio |")
        print("|---|---|---|---|---|---|---|")
        for n, (a, b) in inst.items():
            ra, rb = statistics.median(rps[n][0]), statistics.median(rps[n][1])
            print(f"| {n} | {a:,.0f} | {b:,.0f} | {b / a:.3f} | {ra:,.0f} | {rb:,.0f} | {rb / ra:.3f} |")
        print(f"(wrk, both servers and Redis share this machine's {os.cpu_count()} cores)")
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
