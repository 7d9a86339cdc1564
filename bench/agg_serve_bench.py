#!/usr/bin/env python3
"""Online lookups of windowed aggregations beside plain features (not a test).

    <venv>/bin/python bench/agg_serve_bench.py --quiver target/release/quiver
        [--riders 10000] [--events-per-rider 50] [--duration 10]

(`./run bench-agg` runs this after the offline benchmark.) One private redis-server on a
free loopback port. One repository with two views of the same riders:

- `rides`, an event log (docs/aggregations.md): ~50 rides per rider over the last 7 days and 10
  aggregations of them (count, sum, avg, stddev, min, max, last_k over 1h, 1d and 7d);
- `profile`, a plain view: one row per rider, 10 features.

Both are materialized into Redis, then `quiver serve` answers
`POST /get-online-features` for 1, 10 and 100 riders x the 10 aggregations, and for the
same riders x the 10 plain features, under wrk (2 threads, 8 connections): p50/p99 and
requests/s, with the ratio aggregation / plain. redis-benchmark GET at 8 connections on
the same Redis is the limit of one round trip. Before timing, the served `n_7d` of 100
riders is checked against a count made here from the generated events (the window rule
`floor(now - 7d, 1h) <= ts <= now`).

A record carries its answer at the time it was written, good until the first event
enters or leaves one of its windows; a lookup before then reads that answer, one after
it computes the windows from the record's tiles. Right after materialization nearly
every lookup is the former. With --aged-hours H (default 3; 0: skip) the same
aggregation lookups are timed again with `quiver serve` running H hours in the future
(libfaketime, wall clock only), where nearly every record's answer has changed and is
computed from its tiles.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import requests
from benchlib import free_port, stop_all, wait_http, wrk

US = 1_000_000
HOUR, DAY = 3600 * US, 86400 * US
AGGS = [
    ("n_1h", "count", "fare", "1h"),
    ("fare_sum_1h", "sum", "fare", "1h"),
    ("n_1d", "count", "fare", "1d"),
    ("fare_avg_1d", "avg", "fare", "1d"),
    ("minutes_max_1d", "max", "minutes", "1d"),
    ("n_7d", "count", "fare", "7d"),
    ("fare_sum_7d", "sum", "fare", "7d"),
    ("fare_std_7d", "stddev", "fare", "7d"),
    ("minutes_min_7d", "min", "minutes", "7d"),
    ("last_cities_7d", "last_k", "city", "7d"),
]
PLAIN = [f"p{i}" for i in range(10)]


def faketime_lib():
    """libfaketime's preload library (Debian's package `faketime`), or exit saying so."""
    for path in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"):
        if os.path.exists(path):
            return path
    sys.exit("libfaketime is missing (apt-get install faketime), or pass --aged-hours 0")


def run(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.stdout + res.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--riders", type=int, default=10_000)
    ap.add_argument("--events-per-rider", type=int, default=50)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--aged-hours", type=float, default=3)
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    work = tempfile.mkdtemp(prefix="quiver-agg-serve-bench.")
    procs = []
    rport = free_port()
    procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL))
    try:
        rng = np.random.default_rng(11)
        now = int(time.time() * US)
        n = args.riders * args.events_per_rider
        rider = rng.integers(1, args.riders + 1, n, dtype=np.int64)
        # The last 7 days, ending a minute ago.
        ts = now - 60 * US - rng.integers(0, 7 * DAY - HOUR, n, dtype=np.int64)
        fare = np.round(rng.uniform(3, 80, n), 2)
        cities = np.array([f"city_{i}" for i in range(20)])
        ts_type = pa.timestamp("us", tz="UTC")
        events = pa.table({
            "rider_id": rider,
            "event_timestamp": pa.array(ts, ts_type),
            "fare": fare,
            "minutes": rng.integers(2, 120, n, dtype=np.int64),
            "city": pa.array(cities[rng.integers(0, 20, n)]),
        })
        ids = np.arange(1, args.riders + 1, dtype=np.int64)
        profile = {"rider_id": ids, "event_timestamp": pa.array(np.full(args.riders, now - HOUR), ts_type)}
        for i, name in enumerate(PLAIN):
            profile[name] = rng.integers(0, 1000, args.riders, dtype=np.int64) if i % 3 == 0 else rng.uniform(0, 1, args.riders)
        pq.write_table(events, os.path.join(work, "rides.parquet"))
        pq.write_table(pa.table(profile), os.path.join(work, "profile.parquet"))

        repo = os.path.join(work, "repo")
        os.makedirs(repo)
        with open(os.path.join(repo, "quiver.yaml"), "w") as fh:
            fh.write(f"project: aggserve\nregistry: registry.json\noffline_store:\n  path: data\n"
                     f"online_store:\n  type: redis\n  url: redis://127.0.0.1:{rport}/0\n")
        lines = ["entities:", "  - {name: rider, join_keys: [{name: rider_id, dtype: int64}]}", "feature_views:",
                 "  - name: rides", "    entities: [rider]",
                 "    features: [{name: fare, dtype: float64}, {name: minutes, dtype: int64}, {name: city, dtype: string}]",
                 "    aggregations:"]
        lines += [f"      - {{name: {a}, function: {f}, column: {c}, window: {w}{', k: 3' if f == 'last_k' else ''}}}"
                  for a, f, c, w in AGGS]
        lines += ["  - name: profile", "    entities: [rider]", "    ttl: 1d", "    features:"]
        lines += [f"      - {{name: {p}, dtype: {'int64' if i % 3 == 0 else 'float64'}}}" for i, p in enumerate(PLAIN)]
        with open(os.path.join(repo, "features.yaml"), "w") as fh:
            fh.write("\n".join(lines) + "\n")
        q = [quiver, "--repo", repo]
        run(q + ["apply"])
        run(q + ["ingest", "rides", os.path.join(work, "rides.parquet")])
        run(q + ["ingest", "profile", os.path.join(work, "profile.parquet")])
        began = time.perf_counter()
        written = int(time.time() * US)
        out = run(q + ["materialize", "2000-01-01T00:00:00Z", "2100-01-01T00:00:00Z"])
        print(f"== {args.riders:,} riders x {args.events_per_rider} rides (event log, 10 aggregations) and x 1 row "
              f"(plain view, 10 features); materialized in {time.perf_counter() - began:.2f} s", flush=True)
        print(out.strip(), flush=True)

        def serve(ahead_us=0):
            """`quiver serve` with its wall clock `ahead_us` in the future; its URL."""
            port = free_port()
            env = dict(os.environ)
            if ahead_us:
                env.update(LD_PRELOAD=faketime_lib(), FAKETIME=f"+{ahead_us / US:.0f}s", DONT_FAKE_MONOTONIC="1")
            procs.append(subprocess.Popen(q + ["serve", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          env=env))
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/health", "quiver serve")
            return url

        sample = [int(x) for x in rng.choice(ids, 100, replace=False)]
        aggs = [f"rides:{a}" for a, *_ in AGGS]
        plain = [f"profile:{p}" for p in PLAIN]

        def check(url, ahead_us=0):
            """The served count over 7 days equals one counted here (at the time just
            before or just after the request: the tail moves on the hour)."""
            before = int(time.time() * US) + ahead_us
            answer = requests.post(url + "/get-online-features", json={"entities": {"rider_id": sample}, "features": ["rides:n_7d"]},
                                   timeout=30).json()
            after = int(time.time() * US) + ahead_us
            served = answer["results"][1]["values"]

            def counts(t):
                tail = (t - 7 * DAY) // HOUR * HOUR
                inside = (ts >= tail) & (ts <= t)
                return [int(np.count_nonzero(inside & (rider == r))) for r in sample]

            if served != counts(before) and served != counts(after):
                sys.exit(f"served n_7d differs from the events' count: {served[:10]} vs {counts(after)[:10]}")

        url = serve()
        check(url)
        print("served n_7d of 100 riders equals the count of their generated events", flush=True)

        rows = []
        for k in (1, 10, 100):
            a = wrk(url + "/get-online-features", {"entities": {"rider_id": sample[:k]}, "features": aggs}, args.duration, work)
            p = wrk(url + "/get-online-features", {"entities": {"rider_id": sample[:k]}, "features": plain}, args.duration, work)
            rows.append((k, a, p))
            print(f"{k} riders: aggregations {a[0]:.0f} req/s p50 {a[1]:.2f} ms p99 {a[2]:.2f} ms | "
                  f"plain {p[0]:.0f} req/s p50 {p[1]:.2f} ms p99 {p[2]:.2f} ms", flush=True)
        aged = []
        if args.aged_hours:
            ahead = int(args.aged_hours * HOUR)
            aged_url = serve(ahead)
            check(aged_url, ahead)
            print(f"served n_7d {args.aged_hours:g} h later (server clock ahead) equals the count of the events", flush=True)
            # Which of the sample's stored answers have changed by then (an event left a
            # window: its tail passed the end of the hop holding the window's oldest event).
            windows = {"1h": (HOUR, 5 * 60 * US), "1d": (DAY, HOUR), "7d": (7 * DAY, HOUR)}
            changed = 0
            for r in sample[:100]:
                mine = ts[rider == r]
                until = None
                for w, h in windows.values():
                    inside = mine[(mine >= (written - w) // h * h) & (mine <= written)]
                    if inside.size:
                        leave = inside.min() // h * h + h + w
                        until = leave if until is None else min(until, leave)
                changed += until is not None and until <= written + ahead
            print(f"{changed} of the 100 riders' stored answers have changed by then (answered from the tiles)", flush=True)
            for k in (1, 10, 100):
                a = wrk(aged_url + "/get-online-features", {"entities": {"rider_id": sample[:k]}, "features": aggs}, args.duration, work)
                aged.append(a)
                print(f"{k} riders, {args.aged_hours:g} h later: aggregations {a[0]:.0f} req/s p50 {a[1]:.2f} ms p99 {a[2]:.2f} ms",
                      flush=True)
        bench = subprocess.run(["redis-benchmark", "-p", str(rport), "-t", "get", "-c", "8", "-n", "200000", "-q", "--csv"],
                               capture_output=True, text=True, check=True).stdout
        fields = [f.strip('"') for f in bench.strip().splitlines()[-1].split(",")]
        header = [f.strip('"') for f in bench.strip().splitlines()[0].split(",")]
        got = dict(zip(header, fields))
        print()
        print(f"online lookups, quiver serve on Redis, wrk 2 threads / 8 connections / {args.duration} s, {os.cpu_count()} cores")
        print(f"{'riders':>6} {'aggregations (10)':>30} {'plain features (10)':>30} {'p50 ratio':>10} {'p99 ratio':>10}")
        for k, a, p in rows:
            print(f"{k:>6} {f'{a[1]:.2f} / {a[2]:.2f} ms, {a[0]:,.0f}/s':>30} {f'{p[1]:.2f} / {p[2]:.2f} ms, {p[0]:,.0f}/s':>30} "
                  f"{a[1] / p[1]:>9.2f}x {a[2] / p[2]:>9.2f}x")
        if aged:
            print(f"the same aggregations {args.aged_hours:g} h after materialization (answers from the tiles; "
                  f"p50 ratio to the plain lookups above):")
            for (k, _, p), a in zip(rows, aged):
                print(f"{k:>6} {f'{a[1]:.2f} / {a[2]:.2f} ms, {a[0]:,.0f}/s':>30} {'':>30} {a[1] / p[1]:>9.2f}x {a[2] / p[2]:>9.2f}x")
        print(f"redis-benchmark GET, 8 connections: {float(got['rps']):,.0f}/s, p50 {float(got['p50_latency_ms']):.3f} ms, "
              f"p99 {float(got['p99_latency_ms']):.3f} ms")
    finally:
        stop_all(procs, timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
