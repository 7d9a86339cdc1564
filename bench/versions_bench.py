#!/usr/bin/env python3
"""What versions of definitions cost a lookup (not a test; docs/versions.md).

    <venv>/bin/python bench/versions_bench.py --quiver target/release/quiver [--reps 3]

(`./run bench-versions` installs everything and runs this, then bench/stream_bench.py
with one and with two live versions.) Starts a private redis-server, builds serve_bench's
repository (2 views x 10 features, the service `all20` over all 20) on fewer drivers,
ingests and materializes it, and copies the repository. In the copy, a breaking change
to one view (a feature's type) makes its version 2 beside version 1, and `all20` is
pinned to version 1 of that view — the deployed model of docs/versions.md. Both
repositories read the same Redis keys.

It checks that the pinned service answers exactly what the service answered before the
change, then counts the user-space instructions per single-entity request of `quiver
serve` on each (cachegrind: the total for 1200 requests less that for 200, over 1000),
--reps times, alternating, and prints the medians and their ratio (the issue's target:
at most 1.02).
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta, timezone

import requests
from benchlib import free_port, stop_all, wait_http
from serve_bench import INT_FEATURES, VIEWS, generate, instructions, quiver_repo, timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--entities", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    work = tempfile.mkdtemp(prefix="quiver-versions-bench.")
    procs = []
    rport = free_port()
    procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL))
    try:
        rng = random.Random(42)
        now = datetime.now(timezone.utc)
        files = generate(work, args.entities, 2, now, rng)
        before = quiver_repo(work, files, rport)
        timed([quiver, "--repo", before, "apply"])
        for view, path in files.items():
            timed([quiver, "--repo", before, "ingest", view, path])
        start, end = (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ"), (now + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        timed([quiver, "--repo", before, "materialize", start, end])

        after = os.path.join(work, "pinned_repo")
        shutil.copytree(before, after)
        view = next(iter(VIEWS))
        retyped = sorted(f for f in VIEWS[view] if f in INT_FEATURES)[0]
        path = os.path.join(after, "features.yaml")
        text = open(path).read()
        changed = text.replace(f"{{name: {retyped}, dtype: int64}}", f"{{name: {retyped}, dtype: float64}}", 1)
        assert changed != text
        open(path, "w").write(changed)
        _, out = timed([quiver, "--repo", after, "apply"])
        if f"^ feature_view {view}: version 2 beside version 1" not in out or "stays on version 1: feature_service all20" not in out:
            sys.exit(f"the breaking change did not make a version 2 read by nobody:\n{out}")
        pinned = json.load(open(os.path.join(after, "registry.json")))["definitions"]["feature_services"][0]["features"]
        print(f"after the change: {view} has versions 1 and 2; all20 reads {sum('@1:' in f for f in pinned)} of its 20 features "
              f"at {view}@1", flush=True)

        ident = rng.randint(1, args.entities)
        body = {"entities": {"driver_id": [ident]}, "feature_service": "all20"}
        answers = []
        for repo in (before, after):
            port = free_port()
            proc = subprocess.Popen([quiver, "--repo", repo, "serve", "--port", str(port)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            try:
                wait_http(f"http://127.0.0.1:{port}/health", "quiver serve")
                answers.append(requests.post(f"http://127.0.0.1:{port}/get-online-features", json=body, timeout=30).content)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        if answers[0] != answers[1]:
            sys.exit(f"the pinned service's answer changed:\n{answers[0][:800]}\n{answers[1][:800]}")
        print("the pinned service answers byte for byte what the service answered before the change", flush=True)

        counted = {before: [], after: []}
        for rep in range(args.reps):
            for repo in (before, after):
                port = free_port()
                counted[repo].append(instructions([quiver, "--repo", repo, "serve", "--port", str(port)], port, body, (200, 1200), work))
            print(f"rep {rep + 1}: before {counted[before][-1]:,.0f}, pinned {counted[after][-1]:,.0f} instructions per request",
                  flush=True)
        a, b = statistics.median(counted[before]), statistics.median(counted[after])
        print(f"single-entity lookup of the 20-feature service (cachegrind, median of {args.reps}): before the change {a:,.0f}, "
              f"pinned to version 1 beside version 2 {b:,.0f} instructions per request: {b / a:.4f}x", flush=True)
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
