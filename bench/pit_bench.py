#!/usr/bin/env python3
"""Quiver's point-in-time join beside the shared peers, on the same data, in one run.

    python bench/pit_bench.py --quiver PATH [--scale medium] [--reps 3]
                              [--peers duckdb,polars] [--shared DIR]

1. Generates the shared benchmark data (../shared/bench/gen_data.py) into
   $PITDATA/<scale> unless it is there already.
2. Sets up a Quiver repository for it ($PITDATA/quiver_<scale>: init, the shared
   features.yaml, apply) and ingests the three views (timed, reported apart: ingestion
   is a one-off cost, not part of a training-set build).
3. Runs `quiver historical --service bench_all` and each peer round robin
   (q p1 p2 q p1 p2 ...), each under /usr/bin/time -v, and takes medians.
4. Checks with ../shared/bench/check_equal.py that Quiver's result equals each
   peer's, cell by cell.
5. Prints wall time, CPU time, peak memory and Quiver's ratio to each peer.

Wall = the whole process (interpreter start and imports included for the peers).
Nothing here is a test: the numbers depend on the machine and its load.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from benchlib import time_v

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA_ROOT = os.environ.get("PITDATA", "/tmp/pitdata")
PY = sys.executable

PEERS = {
    "duckdb": (["peer_duckdb.py"], ["--dedup", "hugeint"]),
    "polars": (["peer_polars.py"], ["--dedup", "sort", "--sort-by", "time"]),
    "pandas": (["peer_pandas.py"], []),
    "numpy-ref": (["peer_numpy.py"], []),
}
VIEWS = ["driver_hourly", "driver_daily", "customer_profile"]


def timed(cmd, cwd=None):
    """Runs cmd under /usr/bin/time -v; returns (wall s, cpu s, peak RSS bytes, stdout)."""
    wall, cpu, rss, out, se = time_v(cmd, cwd)
    # The CUDA engine's phase times (QUIVER_LOG=quiver_gpu_join=info), passed through.
    for line in se.splitlines():
        if "cuda join" in line:
            print("   ", re.sub(r"\x1b\[[0-9;]*m", "", line.strip()), flush=True)
    return wall, cpu, rss, out


def gb(b):
    return f"{b / 1e9:.2f} GB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True, help="the quiver binary to measure")
    ap.add_argument("--scale", default="medium", choices=["tiny", "small", "medium", "large"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peers", default="duckdb,polars")
    ap.add_argument("--engines", default="cpu", help="quiver engines to run: cpu, gpu or cpu,gpu")
    ap.add_argument("--shared", default=os.environ.get("QUIVER_SHARED", os.path.join(ROOT, "..", "shared")))
    args = ap.parse_args()
    shared_bench = os.path.join(os.path.abspath(args.shared), "bench")
    peers = [p for p in args.peers.split(",") if p]
    for p in peers:
        if p not in PEERS:
            sys.exit(f"unknown peer {p} (known: {', '.join(PEERS)})")
    quiver = os.path.abspath(args.quiver)

    data = os.path.join(DATA_ROOT, args.scale)
    out_dir = os.path.join(DATA_ROOT, f"out_{args.scale}")
    os.makedirs(out_dir, exist_ok=True)
    if not os.path.exists(os.path.join(data, "spine.parquet")):
        print(f"generating {args.scale} data into {data}", flush=True)
        subprocess.run([PY, os.path.join(shared_bench, "gen_data.py"), "--scale", args.scale, "--out", data], check=True)

    # A fresh Quiver repository over the same data.
    repo = os.path.join(DATA_ROOT, f"quiver_{args.scale}")
    shutil.rmtree(repo, ignore_errors=True)
    subprocess.run([quiver, "init", repo], check=True, capture_output=True)
    shutil.copy(os.path.join(shared_bench, "features.yaml"), os.path.join(repo, "features.yaml"))
    subprocess.run([quiver, "apply"], cwd=repo, check=True, capture_output=True)
    ingest = {}
    for v in VIEWS:
        wall, cpu, rss, out = timed([quiver, "ingest", v, os.path.join(data, f"features_{v}.parquet")], cwd=repo)
        ingest[v] = dict(wall=wall, cpu=cpu, rss=rss)
        print(f"ingest {v}: {wall:.2f} s, peak {gb(rss)} -- {out.strip()}", flush=True)

    spine = os.path.join(data, "spine.parquet")
    engines = args.engines.split(",")
    # "quiver" is the first engine's run; others are "quiver-<engine>".
    mine = ["quiver"] + [f"quiver-{e}" for e in engines[1:]]
    engine_of = dict(zip(mine, engines))
    runs = {name: [] for name in mine + peers}
    outputs = {name: os.path.join(out_dir, f"{name}.parquet") for name in mine}
    for p in peers:
        outputs[p] = os.path.join(out_dir, f"{p}.parquet")
    for rep in range(args.reps):
        for name in mine + peers:
            if os.path.exists(outputs[name]):
                os.remove(outputs[name])
            if name in engine_of:
                cmd = [quiver, "historical", "--spine", spine, "--service", "bench_all",
                       "--out", outputs[name], "--engine", engine_of[name]]
                r = timed(cmd, cwd=repo)
            else:
                script, extra = PEERS[name]
                r = timed([PY, os.path.join(shared_bench, *script), data, outputs[name]] + extra)
            runs[name].append(r[:3])
            print(f"rep {rep + 1} {name:10s} wall {r[0]:6.2f} s  cpu {r[1]:6.2f} s  peak {gb(r[2])}", flush=True)

    # Same answers? Every engine byte for byte, and against each peer.
    checks = {}
    for name in mine[1:]:
        with open(outputs["quiver"], "rb") as a, open(outputs[name], "rb") as b:
            checks[name] = a.read() == b.read()
        print(f"check quiver ({engines[0]}) vs {name}: {'BYTE-IDENTICAL' if checks[name] else 'DIFFERENT'}", flush=True)
    for p in peers:
        c = subprocess.run([PY, os.path.join(shared_bench, "check_equal.py"), outputs["quiver"], outputs[p],
                            "--data", data], capture_output=True, text=True)
        checks[p] = c.returncode == 0
        last = (c.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"check quiver vs {p}: {'IDENTICAL' if checks[p] else 'DIFFERENT'} -- {last}", flush=True)

    med = {n: (statistics.median(w for w, _, _ in r), statistics.median(c for _, c, _ in r),
               max(m for _, _, m in r), min(w for w, _, _ in r), max(w for w, _, _ in r))
           for n, r in runs.items()}
    print()
    print(f"scale {args.scale}, {args.reps} reps, round robin; load average before: {os.getloadavg()[0]:.2f}")
    print(f"| engine | wall s median (min-max) | cpu s | peak RSS | quiver / this |")
    print(f"|---|---|---|---|---|")
    for n, (w, c, m, lo, hi) in med.items():
        ratio = "" if n == "quiver" else f"{med['quiver'][0] / w:.2f}x wall, {med['quiver'][2] / m:.2f}x memory"
        print(f"| {n} | {w:.2f} ({lo:.2f}-{hi:.2f}) | {c:.2f} | {gb(m)} | {ratio} |")
    result = dict(scale=args.scale, reps=args.reps, ingest=ingest, runs=runs, checks=checks,
                  when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    with open(os.path.join(out_dir, "quiver_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    if not all(checks.values()):
        sys.exit("results differ")


if __name__ == "__main__":
    main()
