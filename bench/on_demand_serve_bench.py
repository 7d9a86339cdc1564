#!/usr/bin/env python3
"""On-demand features online: Quiver beside itself without them, and beside Feast's
on-demand feature view in its fastest mode (`mode="python"`), on the same Redis (not a
test).

    <feast-venv>/bin/python bench/on_demand_serve_bench.py --quiver target/release/quiver
        [--entities 100000] [--duration 10] [--feast-workers 2] [--no-instructions]

(`./run bench-on-demand` installs everything and runs this.) The data and stores are
bench/serve_bench.py's (one private redis-server: Quiver in db 0, Feast in db 1); the
request is a service of the 10 stored features of `driver_a` plus 5 on-demand features —
arithmetic, a CASE, a string function of a request field, a division by a request field,
and the age of the row at `request_time` — for 1, 10 and 100 entities:

1. both servers answer the same values for the same request first (all but the age:
   Feast's on-demand view sees no event time, so it computes its age from its own clock);
2. wrk (2 threads, 8 connections) loads `quiver serve` with the on-demand features and
   with the baseline — the same 15 cells, the 5 on-demand ones replaced by 5 stored
   features of `driver_b` — and `feast serve` with them: requests/s, p50/p99;
3. cachegrind counts quiver serve's user-space instructions per request for the baseline,
   with the on-demand features by the row evaluator (the default), and by DataFusion
   (`QUIVER_ON_DEMAND_EVALUATOR=vectorized`) (N1 then N2 requests over one connection; the
   difference over N2 - N1). The count moves by a few percent at most between runs,
   unlike req/s on a shared machine.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone

import requests
from benchlib import free_port, stop_all, wait_http, wrk
from serve_bench import VIEWS, feast_repo, generate, instructions, quiver_repo, timed

STORED = [f"driver_a:{f}" for f in VIEWS["driver_a"]]
# The baseline: as many cells, all stored.
BASELINE = STORED + [f"driver_b:{f}" for f in VIEWS["driver_b"][:5]]
ON_DEMAND = ["scoring:ratio", "scoring:band", "scoring:city_up", "scoring:per_amount", "scoring:age_s"]

QUIVER_ON_DEMAND = """
on_demand_views:
  - name: scoring
    inputs: [driver_a]
    request: [{name: amount, dtype: float64}, {name: pickup_city, dtype: string}]
    features:
      - {name: ratio, dtype: float64, expr: "driver_a.a0 * driver_a.a1 + driver_a.a2"}
      - {name: band, dtype: string, expr: "CASE WHEN driver_a.a3 > 50 THEN 'high' ELSE 'low' END"}
      - {name: city_up, dtype: string, expr: "upper(pickup_city)"}
      - {name: per_amount, dtype: float64, expr: "amount / NULLIF(driver_a.a4, 0)"}
      - {name: age_s, dtype: float64, expr: "date_part('epoch', request_time - driver_a.event_timestamp)"}
"""

FEAST_ON_DEMAND = '''
from feast import RequestSource
from feast.on_demand_feature_view import on_demand_feature_view
from feast.types import String

request = RequestSource(name="request", schema=[Field(name="amount", dtype=Float64), Field(name="pickup_city", dtype=String)])


@on_demand_feature_view(
    sources=[driver_a, request],
    schema=[Field(name="ratio", dtype=Float64), Field(name="band", dtype=String), Field(name="city_up", dtype=String),
            Field(name="per_amount", dtype=Float64), Field(name="age_s", dtype=Float64)],
    mode="python",
)
def scoring(inputs):
    from datetime import datetime, timezone  # Feast runs the function's own source: imports inside
    now = datetime.now(timezone.utc).timestamp()
    return {
        "ratio": [a * b + c for a, b, c in zip(inputs["a0"], inputs["a1"], inputs["a2"])],
        "band": ["high" if v > 50 else "low" for v in inputs["a3"]],
        "city_up": [c.upper() for c in inputs["pickup_city"]],
        "per_amount": [a / d if d else None for a, d in zip(inputs["amount"], inputs["a4"])],
        "age_s": [now for _ in inputs["a0"]],
    }
'''


def body(ids, on_demand, rng):
    entities = {"driver_id": ids}
    features = list(STORED if on_demand else BASELINE)
    if on_demand:
        entities["amount"] = [round(rng.uniform(1, 500), 2) for _ in ids]
        entities["pickup_city"] = [rng.choice(["paris", "Berlin", "tokyo"]) for _ in ids]
        features += ON_DEMAND
    return {"entities": entities, "features": features}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--entities", type=int, default=100_000)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--feast-workers", type=int, default=2)
    ap.add_argument("--no-instructions", action="store_true", help="skip the cachegrind counts (they need valgrind)")
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    feast = os.path.join(os.path.dirname(sys.executable), "feast")
    work = tempfile.mkdtemp(prefix="quiver-on-demand-bench.")
    procs = []
    rport = free_port()
    procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL))
    try:
        time.sleep(0.5)
        rng = random.Random(40)
        now = datetime.now(timezone.utc)
        files = generate(work, args.entities, 2, now, rng)
        start, end = (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S"), (now + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
        qrepo = quiver_repo(work, files, rport)
        with open(os.path.join(qrepo, "features.yaml"), "a") as fh:
            fh.write(QUIVER_ON_DEMAND)
        q = [quiver, "--repo", qrepo]
        timed(q + ["apply"])
        for view, path in files.items():
            timed(q + ["ingest", view, path])
        timed(q + ["materialize", start + "Z", end + "Z"])
        frepo = feast_repo(work, files, rport)
        with open(os.path.join(frepo, "features.py"), "a") as fh:
            fh.write(FEAST_ON_DEMAND)
        timed([feast, "-c", frepo, "apply"])
        timed([feast, "-c", frepo, "materialize", start, end])

        qport, fport = free_port(), free_port()
        procs.append(subprocess.Popen(q + ["serve", "--port", str(qport)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen([feast, "-c", frepo, "serve", "-p", str(fport), "--no-access-log",
                                       "-w", str(args.feast_workers), "--max-requests", "0"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        qurl, furl = f"http://127.0.0.1:{qport}/get-online-features", f"http://127.0.0.1:{fport}/get-online-features"
        wait_http(qurl.replace("/get-online-features", "/health"), "quiver serve")
        wait_http(furl.replace("/get-online-features", "/health"), "feast serve")

        ids = rng.sample(range(1, args.entities + 1), 100)
        check = body(ids, True, rng)
        qa = requests.post(qurl, json=check, timeout=30).json()
        fa = requests.post(furl, json=check, timeout=30).json()
        if "metadata" not in fa or "metadata" not in qa:
            sys.exit(f"an answer without features:\nquiver {json.dumps(qa)[:1500]}\nfeast {json.dumps(fa)[:1500]}")
        by_name = lambda ans: {n: r["values"] for n, r in zip(ans["metadata"]["feature_names"], ans["results"])}  # noqa: E731
        qv, fv = by_name(qa), by_name(fa)
        for name in [f.split(":")[1] for f in STORED + ON_DEMAND if not f.endswith("age_s")]:
            if qv.get(name) != fv.get(name):
                sys.exit(f"quiver and feast disagree on {name}:\n{qv.get(name)}\n{fv.get(name)}")
        print("both servers return the same 100 x 14 values (and their own ages)", flush=True)

        rows = []
        for n in (1, 10, 100):
            plain, computed = body(ids[:n], False, rng), body(ids[:n], True, rng)
            qp = wrk(qurl, plain, args.duration, work)
            qo = wrk(qurl, computed, args.duration, work)
            fo = wrk(furl, computed, args.duration, work)
            rows.append((n, qp, qo, fo))
            print(f"{n} entities: quiver {qp[0]:.0f} req/s for 15 stored cells, {qo[0]:.0f} with 5 on-demand (p50 {qo[1]:.2f} ms p99 "
                  f"{qo[2]:.2f}); feast {fo[0]:.0f} req/s (p50 {fo[1]:.2f} p99 {fo[2]:.2f})", flush=True)
        counted = {}
        if not args.no_instructions:
            for n, (n1, n2) in {1: (200, 1200), 10: (100, 600), 100: (50, 250)}.items():
                counts = []
                for computed, evaluator in ((False, "row"), (True, "row"), (True, "vectorized")):
                    port = free_port()
                    env = {**os.environ, "QUIVER_ON_DEMAND_EVALUATOR": evaluator}
                    counts.append(instructions(q + ["serve", "--port", str(port)], port, body(ids[:n], computed, rng), (n1, n2), work,
                                               env=env))
                counted[n] = counts
                print(f"{n} entities: {counts[0]:,.0f} instructions per request for 15 stored cells, {counts[1]:,.0f} with 5 "
                      f"on-demand by the row evaluator ({counts[1] / counts[0]:.3f}x), {counts[2]:,.0f} by DataFusion "
                      f"({counts[2] / counts[0]:.3f}x)", flush=True)

        print()
        print(f"driver_a's 10 stored features plus 5 on-demand features, against the baseline of the same 10 plus 5 stored "
              f"features of driver_b; {args.entities:,} drivers; wrk 2 threads 8 connections "
              f"{args.duration} s; feast serve -w {args.feast_workers}, mode=\"python\"")
        print()
        print("| entities | quiver req/s, 15 stored cells | with 5 on-demand | ratio | quiver p50 / p99 ms with | feast req/s with | quiver / feast |")
        print("|---|---|---|---|---|---|---|")
        for n, qp, qo, fo in rows:
            print(f"| {n} | {qp[0]:,.0f} | {qo[0]:,.0f} | {qo[0] / qp[0]:.2f} | {qo[1]:.2f} / {qo[2]:.2f} | {fo[0]:,.0f} | "
                  f"{qo[0] / fo[0]:.1f}x |")
        if counted:
            print()
            print("| entities | instructions per request, 15 stored cells | with 5 on-demand, row evaluator | ratio | by DataFusion | ratio |")
            print("|---|---|---|---|---|---|")
            for n, (a, b, c) in counted.items():
                print(f"| {n} | {a:,.0f} | {b:,.0f} | {b / a:.3f}x | {c:,.0f} | {c / a:.3f}x |")
        print(json.dumps({"rows": rows, "instructions": counted}))
    finally:
        stop_all(procs)


if __name__ == "__main__":
    main()
