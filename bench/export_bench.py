#!/usr/bin/env python3
"""Training-set export beside DuckDB's join + COPY, and the loader's speed (not a test).

    <sdk-venv>/bin/python bench/export_bench.py --quiver target/release/quiver
        [--scale medium] [--shards 1,4,16,64] [--reps 3]

(`./run bench-export` builds and runs this.) Needs the data and repository that
`./run bench` leaves in $PITDATA (default /tmp/pitdata): `<scale>/` and
`quiver_<scale>/`. Times `quiver export` into each number of shards and the shared
`peer_duckdb.py` (join + COPY to Parquet) on the same data under /usr/bin/time, round
robin, medians of `--reps`; checks the export equals DuckDB's result with the shared
`check_equal.py`, then reads the last export back with `quiver.TrainingSet(...)` for
the loaders' speed.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from benchlib import time_v

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd, cwd=None):
    """(wall s, peak RSS bytes) of cmd."""
    wall, _, rss, _, _ = time_v(cmd, cwd)
    return wall, rss


def size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs if f.endswith((".parquet", ".arrow")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--scale", default="medium")
    ap.add_argument("--shards", default="1,4,16,64", help="numbers of shards to export into")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shared", default=os.environ.get("QUIVER_SHARED", os.path.join(ROOT, "..", "shared")))
    ap.add_argument("--python", default=os.path.expanduser("~/.cache/quiver/venv/bin/python"),
                    help="a Python with duckdb and pyarrow for the peer")
    args = ap.parse_args()
    pitdata = os.environ.get("PITDATA", "/tmp/pitdata")
    data, repo = os.path.join(pitdata, args.scale), os.path.join(pitdata, f"quiver_{args.scale}")
    if not os.path.isdir(repo):
        sys.exit(f"{repo} is missing: run `./run bench --scale {args.scale}` first")
    spine = os.path.join(data, "spine.parquet")
    work = tempfile.mkdtemp(prefix="quiver-export-bench.")
    rows = []
    try:
        import pyarrow.parquet as pq
        import statistics
        spine_rows = pq.ParquetFile(spine).metadata.num_rows
        counts = [int(x) for x in args.shards.split(",")]
        runs = {n: [] for n in counts}
        runs["duckdb"] = []
        duck = os.path.join(work, "duckdb.parquet")
        last = None
        for rep in range(args.reps):
            for n in counts:
                out = os.path.join(work, f"export_{n}")
                shutil.rmtree(out, ignore_errors=True)
                per = -(-spine_rows // n)
                runs[n].append(timed([os.path.abspath(args.quiver), "export", "--service", "bench_all", "--spine", spine,
                                      "--out", out, "--shard-rows", str(per), "--engine", "cpu"], cwd=repo))
                print(f"rep {rep + 1}: quiver export into {n} shards of {per:,}: {runs[n][-1][0]:.2f} s, "
                      f"peak {runs[n][-1][1] / 1e9:.2f} GB", flush=True)
                last = out
            if os.path.exists(duck):
                os.remove(duck)
            runs["duckdb"].append(timed([args.python, os.path.join(args.shared, "bench", "peer_duckdb.py"), data, duck]))
            print(f"rep {rep + 1}: duckdb: {runs['duckdb'][-1][0]:.2f} s, peak {runs['duckdb'][-1][1] / 1e9:.2f} GB", flush=True)
        for n in counts:
            wall, rss = statistics.median(w for w, _ in runs[n]), max(r for _, r in runs[n])
            rows.append((f"quiver export, {n} shards of {-(-spine_rows // n):,} rows", wall, rss, size(os.path.join(work, f"export_{n}"))))
        wall, rss = statistics.median(w for w, _ in runs["duckdb"]), max(r for _, r in runs["duckdb"])
        rows.append(("DuckDB join + COPY to Parquet", wall, rss, size(duck)))
        walls = [w for name, w, _, _ in rows if name.startswith("quiver")]
        print(f"\nquiver export: slowest / fastest shard count {max(walls) / min(walls):.2f}x; "
              f"slowest vs DuckDB {max(walls) / wall:.2f}x the time ({args.reps} reps, medians)", flush=True)
        # Same answer: the shared checker compares a file against the peer's.
        merged = os.path.join(work, "export_merged.parquet")
        subprocess.run([args.python, "-c", f"import glob, pyarrow.dataset as ds, pyarrow.parquet as pq; "
                        f"pq.write_table(ds.dataset(sorted(glob.glob({last!r} + '/part-*.parquet'))).to_table(), {merged!r})"],
                       check=True)
        check = subprocess.run([args.python, os.path.join(args.shared, "bench", "check_equal.py"), merged, duck,
                                "--data", data], capture_output=True, text=True)
        print("check export vs duckdb:", "IDENTICAL" if check.returncode == 0 else "DIFFERENT", "--",
              (check.stdout.strip().splitlines() or [""])[-1], flush=True)
        import quiver as qv
        ts = qv.TrainingSet(last)
        began, n_batches = time.perf_counter(), 0
        for _ in ts.iter_batches(1024, shuffle_shards=True, seed=1):
            n_batches += 1
        loader = n_batches / (time.perf_counter() - began)
        torch_lines = torch_loader(ts)
        print()
        print("| run | wall s | peak RSS | rows/s | output MB/s |")
        print("|---|---|---|---|---|")
        for name, wall, rss, nbytes in rows:
            print(f"| {name} | {wall:.2f} | {rss / 1e9:.2f} GB | {spine_rows / wall:,.0f} | {nbytes / 1e6 / wall:.1f} |")
        print(f"\nloader: {loader:,.0f} batches/s of 1,024 rows (TrainingSet.iter_batches, shuffled shards)")
        for line in torch_lines:
            print(line)
        if check.returncode != 0:
            sys.exit("the export differs from DuckDB's result")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def torch_loader(ts, max_batches=2000):
    """The PyTorch loader's batches/s, and whether it holds back a simple training loop:
    a two-layer MLP's steps/s on batches already in memory, against the same loop fed
    by the loader (0 and 2 DataLoader workers)."""
    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        return ["torch loader: PyTorch is not installed in this venv (./run bench-export installs it)"]
    torch.manual_seed(0)
    first = next(iter(ts.to_torch(batch_size=1024)))
    features = [n for n, t in first.items() if t.dtype.is_floating_point and t.dim() == 1]
    label = features[0]
    inputs = features[1:]

    def xy(batch):
        x = torch.stack([batch[f].float() for f in inputs], dim=1).nan_to_num()
        return x, batch[label].float().nan_to_num()

    model = torch.nn.Sequential(torch.nn.Linear(len(inputs), 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def loader_rate(workers, train):
        loader = DataLoader(ts.to_torch(batch_size=1024, columns=features, shuffle_shards=True, seed=1),
                            batch_size=None, num_workers=workers)
        it = iter(loader)
        next(it)  # worker start-up is not counted
        began, n = time.perf_counter(), 0
        for batch in it:
            if train:
                step(*xy(batch))
            n += 1
            if n >= max_batches:
                break
        return n / (time.perf_counter() - began)

    cached = [b for _, b in zip(range(500), ts.to_torch(batch_size=1024, columns=features))]

    def in_memory():
        began = time.perf_counter()
        for b in cached:
            step(*xy(b))
        return len(cached) / (time.perf_counter() - began)

    # Three rounds, round robin, medians: this machine is noisy.
    runs = {k: [] for k in ("w0", "w0 train", "w2", "w2 train", "memory")}
    for _ in range(3):
        runs["w0"].append(loader_rate(0, False))
        runs["w0 train"].append(loader_rate(0, True))
        runs["w2"].append(loader_rate(2, False))
        runs["w2 train"].append(loader_rate(2, True))
        runs["memory"].append(in_memory())
    med = {k: sorted(v)[1] for k, v in runs.items()}
    lines = []
    for w in (0, 2):
        lines.append(f"torch DataLoader ({w} workers): {med[f'w{w}']:,.0f} batches/s of 1,024 rows alone; "
                     f"MLP training loop fed by it: {med[f'w{w} train']:,.0f} steps/s")
    lines.append(f"the same MLP loop on {len(cached)} batches already in memory: {med['memory']:,.0f} steps/s "
                 f"({len(inputs)} inputs -> 64 -> 1); medians of 3 rounds")
    return lines


if __name__ == "__main__":
    main()
