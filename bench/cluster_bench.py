#!/usr/bin/env python3
"""The point-in-time join on a Ballista cluster beside the local join, on the same data.

    python bench/cluster_bench.py --quiver PATH [--scale small] [--reps 3]
                                  [--executors 1,2] [--partitions 8] [--shared DIR]

1. Uses the shared benchmark data and Quiver repository of bench/pit_bench.py
   ($PITDATA/<scale>, $PITDATA/quiver_<scale>), setting them up if absent.
2. For each executor count: starts `quiver cluster scheduler` and that many
   `quiver cluster executor` processes (2 task slots each) on loopback, then runs
   `quiver historical --service bench_all` locally and with `--cluster` round robin,
   each under /usr/bin/time -v, and takes medians; stops the cluster.
3. Checks every cluster result is byte-identical to the local one.
4. Prints wall time, the client's CPU and peak memory, the executors' peak memory,
   and the cluster / local wall-time ratio.

All processes share this machine's cores: the figures are the cluster's overhead
(staging, shuffle files, Arrow Flight, one join per partition), not a speed-up.
Nothing here is a test: the numbers depend on the machine and its load.
"""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

from benchlib import time_v

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA_ROOT = os.environ.get("PITDATA", "/tmp/pitdata")
PY = sys.executable
VIEWS = ["driver_hourly", "driver_daily", "customer_profile"]


def free_ports(n):
    """n distinct free ports (the sockets are all held until each is chosen)."""
    held = [socket.socket() for _ in range(n)]
    for s in held:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in held]
    for s in held:
        s.close()
    return ports


def wait_port(port, timeout=60):
    began = time.time()
    while time.time() - began < timeout:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    sys.exit(f"nothing listens on {port}")


def peak_rss(pid):
    """VmHWM of a running process, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def setup(quiver, scale, shared_bench):
    data = os.path.join(DATA_ROOT, scale)
    if not os.path.exists(os.path.join(data, "spine.parquet")):
        print(f"generating {scale} data into {data}", flush=True)
        subprocess.run([PY, os.path.join(shared_bench, "gen_data.py"), "--scale", scale, "--out", data], check=True)
    repo = os.path.join(DATA_ROOT, f"quiver_{scale}")
    if not os.path.exists(os.path.join(repo, "registry.json")):
        shutil.rmtree(repo, ignore_errors=True)
        subprocess.run([quiver, "init", repo], check=True, capture_output=True)
        shutil.copy(os.path.join(shared_bench, "features.yaml"), os.path.join(repo, "features.yaml"))
        subprocess.run([quiver, "apply"], cwd=repo, check=True, capture_output=True)
        for v in VIEWS:
            subprocess.run([quiver, "ingest", v, os.path.join(data, f"features_{v}.parquet")], cwd=repo, check=True)
    return data, repo


class Cluster:
    def __init__(self, quiver, n, log_dir):
        ports = free_ports(1 + 2 * n)
        self.port = ports[0]
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
        env["QUIVER_LOG"] = "warn"
        self.procs = []
        os.makedirs(log_dir, exist_ok=True)
        log = open(os.path.join(log_dir, "scheduler.log"), "w")
        self.procs.append(subprocess.Popen([quiver, "cluster", "scheduler", "--port", str(self.port)],
                                           stdout=log, stderr=log, env=env))
        wait_port(self.port)
        self.executors = []
        for i in range(n):
            work = os.path.join(log_dir, f"executor{i}")
            os.makedirs(work, exist_ok=True)
            log = open(os.path.join(log_dir, f"executor{i}.log"), "w")
            p = subprocess.Popen([quiver, "cluster", "executor", "--scheduler", f"127.0.0.1:{self.port}",
                                  "--port", str(ports[1 + 2 * i]), "--grpc-port", str(ports[2 + 2 * i]),
                                  "--concurrency", "2", "--work-dir", work], stdout=log, stderr=log, env=env)
            self.procs.append(p)
            self.executors.append(p)
        time.sleep(3)  # registration

    def url(self, partitions):
        return f"df://127.0.0.1:{self.port}?partitions={partitions}"

    def stop(self):
        peaks = [peak_rss(p.pid) for p in self.executors]
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        return peaks


def gb(b):
    return f"{b / 1e9:.2f} GB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--scale", default="small", choices=["tiny", "small", "medium", "large"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--executors", default="1,2")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--shared", default=os.environ.get("QUIVER_SHARED", os.path.join(ROOT, "..", "shared")))
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    data, repo = setup(quiver, args.scale, os.path.join(os.path.abspath(args.shared), "bench"))
    spine = os.path.join(data, "spine.parquet")
    out_dir = os.path.join(DATA_ROOT, f"out_cluster_{args.scale}")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    local_out = os.path.join(out_dir, "local.parquet")
    rows = {}
    all_same = True
    for n in [int(x) for x in args.executors.split(",")]:
        cluster = Cluster(quiver, n, os.path.join(out_dir, f"logs_{n}"))
        runs = {"local": [], "cluster": []}
        remote_out = os.path.join(out_dir, f"cluster_{n}.parquet")
        try:
            for rep in range(args.reps):
                for name in runs:
                    cmd = [quiver, "historical", "--spine", spine, "--service", "bench_all"]
                    if name == "local":
                        cmd += ["--out", local_out]
                    else:
                        cmd += ["--out", remote_out, "--cluster", cluster.url(args.partitions)]
                    wall, cpu, rss, out, err = time_v(cmd, repo)
                    if "historical:" not in out:
                        sys.exit(f"{name} failed: {err.strip()[-2000:]}")
                    runs[name].append((wall, cpu, rss))
                    print(f"{n} executor(s) rep {rep + 1} {name:8s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  peak {gb(rss)}",
                          flush=True)
        finally:
            peaks = cluster.stop()
        with open(local_out, "rb") as a, open(remote_out, "rb") as b:
            same = a.read() == b.read()
        all_same &= same
        print(f"check local vs cluster with {n} executor(s): {'BYTE-IDENTICAL' if same else 'DIFFERENT'}", flush=True)
        rows[n] = (runs, peaks, same)

    print()
    print(f"scale {args.scale}, {args.reps} reps, {args.partitions} partitions, round robin, all processes on "
          f"{os.cpu_count()} cores; load average: {os.getloadavg()[0]:.2f}")
    print("| executors | local wall s | cluster wall s | cluster / local | client cpu s | client peak | executors' peak | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for n, (runs, peaks, same) in rows.items():
        lw = statistics.median(w for w, _, _ in runs["local"])
        cw = statistics.median(w for w, _, _ in runs["cluster"])
        cc = statistics.median(c for _, c, _ in runs["cluster"])
        cm = max(m for _, _, m in runs["cluster"])
        print(f"| {n} | {lw:.2f} | {cw:.2f} | {cw / lw:.2f}x | {cc:.2f} | {gb(cm)} | "
              f"{' + '.join(gb(p) for p in peaks)} | {'yes' if same else 'NO'} |")
    if not all_same:
        sys.exit("results differ")


if __name__ == "__main__":
    main()
