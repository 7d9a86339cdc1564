#!/usr/bin/env python3
"""Runtime layouts for serving, alternating on one Redis (not a test; issue #19).

    python bench/serve_layouts.py --quiver Q --floor F [--duration 6] [--rounds 3] [--sizes 1,100]
                                  [--layouts floor,per-core,quiver,quiver-1] [--spins 3000,6000]
                                  [--before Q0]

Under the same wrk as `serve_bench.py` (2 threads, 8 connections), in turn, round after
round: the read+write floor (examples/serve_floor.rs) on tokio's multi-thread runtime
(one worker per core, as `quiver serve`), the floor thread-per-core
(`QUIVER_FLOOR_PER_CORE=1`: a current-thread runtime, an `SO_REUSEPORT` listener and a
store connection per core), `quiver serve`, and `quiver serve` with one worker
(`TOKIO_WORKER_THREADS=1`). Alternating puts every layout through the same moments of
a shared machine; compare within a round. Data: 20,000 drivers x 2 rows x 2 views x 10
features (serve_bench.py's generator), the 20 features of 1 and 100 drivers per request.

`--spins` adds the floor made to spin that many ns of CPU per request
(`QUIVER_FLOOR_SPIN_NS`): how the tail moves with a server's CPU per request alone,
everything else equal. `--before` adds `quiver serve` of another build (the one before a
change) on the same repository. Each line also gives the server's CPU per request (user
+ system, from /proc over the wrk run).
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import shutil
from datetime import datetime, timedelta, timezone

import requests
from benchlib import cpu_seconds, free_port, stop_all, wait_http, wait_port, wrk
from serve_bench import VIEWS, floor_command, generate, quiver_repo, timed


def measure(cmd, env, url_of, body, duration, work):
    """(req/s, p50 ms, p99 ms, µs of the server's CPU per request) under wrk."""
    port = free_port()
    proc = subprocess.Popen([str(port) if x == "{port}" else x for x in cmd], env=dict(os.environ, **env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(url_of(port), cmd[0])
        before = cpu_seconds(proc.pid)
        rps, p50, p99 = wrk(f"http://127.0.0.1:{port}/get-online-features", body, duration, work)
        return rps, p50, p99, (cpu_seconds(proc.pid) - before) / (rps * duration) * 1e6
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--floor", required=True, help="the serve_floor example binary")
    ap.add_argument("--duration", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="1,100")
    ap.add_argument("--layouts", default="floor,per-core,quiver,quiver-1", help="which of floor, per-core, quiver, quiver-1")
    ap.add_argument("--spins", default="", help="ns of CPU per request for extra floor layouts, comma-separated")
    ap.add_argument("--before", help="another quiver binary, served beside --quiver (a build before a change)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="quiver-serve-layouts.")
    rport = free_port()
    procs = [subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)]
    try:
        wait_port(rport, "redis-server")
        rng = random.Random(42)
        now = datetime.now(timezone.utc)
        files = generate(work, 20_000, 2, now, rng)
        q = [os.path.abspath(args.quiver), "--repo", quiver_repo(work, files, rport)]
        timed(q + ["apply"])
        for view, path in files.items():
            timed(q + ["ingest", view, path])
        window = [(now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ"), (now + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")]
        timed(q + ["materialize", *window])
        features = [f"{v}:{f}" for v, fs in VIEWS.items() for f in fs]
        ids = rng.sample(range(1, 20_001), 100)
        health = lambda port: f"http://127.0.0.1:{port}/health"  # noqa: E731
        print("| entities | round | layout | req/s | p50 ms | p99 ms | server CPU µs / request |")
        print("|---|---|---|---|---|---|---|")
        for n in (int(s) for s in args.sizes.split(",")):
            body = {"entities": {"driver_id": ids[:n]}, "features": features}
            keys = [f"quiver:servebench:{view}:i{i}" for view in VIEWS for i in ids[:n]]
            # The floor answers with quiver's own answer to this request.
            port = free_port()
            server = subprocess.Popen(q + ["serve", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_http(health(port), "quiver serve")
                answer = requests.post(f"http://127.0.0.1:{port}/get-online-features", json=body, timeout=30).content
            finally:
                server.terminate()
                server.wait(timeout=30)
            floor = floor_command(args.floor, rport, keys, answer, work, "{port}")
            floor_url = lambda port: f"http://127.0.0.1:{port}/get-online-features"  # noqa: E731
            known = {
                "floor": ("floor, multi-thread runtime", (floor, {}, floor_url)),
                "per-core": ("floor, thread per core", (floor, {"QUIVER_FLOOR_PER_CORE": "1"}, floor_url)),
                "quiver": ("quiver serve", (q + ["serve", "--port", "{port}"], {}, health)),
                "quiver-1": ("quiver serve, one worker", (q + ["serve", "--port", "{port}"], {"TOKIO_WORKER_THREADS": "1"}, health)),
            }
            layouts = dict(known[k] for k in args.layouts.split(","))
            if args.before:
                layouts["quiver serve, the build before"] = ([os.path.abspath(args.before), *q[1:], "serve", "--port", "{port}"], {}, health)
            for spin in filter(None, args.spins.split(",")):
                layouts[f"floor + {int(spin) / 1000:g} µs CPU per request"] = (floor, {"QUIVER_FLOOR_SPIN_NS": spin}, floor_url)
            for r in range(args.rounds):
                for name, (cmd, env, url_of) in layouts.items():
                    rps, p50, p99, cpu = measure(cmd, env, url_of, body, args.duration, work)
                    print(f"| {n} | {r + 1} | {name} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {cpu:.1f} |", flush=True)
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
