#!/usr/bin/env python3
"""Windowed aggregations offline beside DuckDB and Polars (not a test).

    <venv>/bin/python bench/agg_bench.py --quiver target/release/quiver
        [--spine-rows 1000000] [--events 5000000] [--entities 100000] [--reps 3] [--no-polars]

(`./run bench-agg` builds and runs this.) Generates an event log (rider, event time,
fare with 5% nulls, minutes, city) and a spine, then computes 12 aggregations (count,
sum, avg, stddev, min, max, last_k over 1h, 1d and 7d windows with their default hops,
docs/aggregations.md) three ways on the same files, each under /usr/bin/time:

- `quiver historical` on a repository whose features.yaml defines them;
- DuckDB: a range join of spine and events on the key and the widest window, then
  GROUP BY spine row with one FILTERed aggregate per feature (the SQL a user writes);
- Polars: the same as a join on the key, a filter and a group_by (lazy, streaming off).

All three results are checked equal (integers and lists exactly, floats to 1e-9
relative) before any time is printed; the engines run round robin `--reps` times and
the ratios are of median wall times against DuckDB's.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchlib import time_v

US = 1_000_000
HOUR, DAY = 3600 * US, 86400 * US
# (name, function, column, window, hop): hops are the defaults of docs/aggregations.md for these windows.
AGGS = [
    ("n_1h", "count", "fare", "1h", HOUR, 5 * 60 * US),
    ("fare_sum_1h", "sum", "fare", "1h", HOUR, 5 * 60 * US),
    ("n_1d", "count", "fare", "1d", DAY, HOUR),
    ("fare_sum_1d", "sum", "fare", "1d", DAY, HOUR),
    ("fare_avg_1d", "avg", "fare", "1d", DAY, HOUR),
    ("minutes_max_1d", "max", "minutes", "1d", DAY, HOUR),
    ("n_7d", "count", "fare", "7d", 7 * DAY, HOUR),
    ("fare_sum_7d", "sum", "fare", "7d", 7 * DAY, HOUR),
    ("fare_std_7d", "stddev", "fare", "7d", 7 * DAY, HOUR),
    ("minutes_min_7d", "min", "minutes", "7d", 7 * DAY, HOUR),
    ("minutes_sum_7d", "sum", "minutes", "7d", 7 * DAY, HOUR),
    ("last_cities_7d", "last_k", "city", "7d", 7 * DAY, HOUR),
]
T0 = 1_767_225_600 * US  # 2026-01-01T00:00:00Z


def generate(work, n_events, n_spine, n_entities, seed=7):
    rng = np.random.default_rng(seed)
    span = 30 * DAY
    rider = rng.integers(0, n_entities, n_events, dtype=np.int64)
    ts = T0 + rng.integers(0, span, n_events, dtype=np.int64)
    fare = np.round(rng.uniform(3, 80, n_events), 2)
    fare_mask = rng.random(n_events) < 0.05
    minutes = rng.integers(2, 120, n_events, dtype=np.int64)
    cities = np.array([f"city_{i}" for i in range(20)])
    city = cities[rng.integers(0, 20, n_events)]
    events = pa.table({
        "rider_id": rider,
        "event_timestamp": pa.array(ts, pa.timestamp("us", tz="UTC")),
        "fare": pa.array(fare, mask=fare_mask),
        "minutes": minutes,
        "city": pa.array(city),
        # The ingestion order, for DuckDB's and Polars' last_k tie-break (quiver keeps its own).
        "seq": np.arange(n_events, dtype=np.int64),
    })
    spine = pa.table({
        "rider_id": rng.integers(0, n_entities, n_spine, dtype=np.int64),
        "event_timestamp": pa.array(T0 + 7 * DAY + rng.integers(0, span - 7 * DAY, n_spine, dtype=np.int64), pa.timestamp("us", tz="UTC")),
        "row_id": np.arange(n_spine, dtype=np.int64),
    })
    pq.write_table(events, os.path.join(work, "events.parquet"))
    pq.write_table(events.drop_columns(["seq"]), os.path.join(work, "events_q.parquet"))
    pq.write_table(spine, os.path.join(work, "spine.parquet"))


FEATURES_YAML = """entities:
  - {name: rider, join_keys: [{name: rider_id, dtype: int64}]}
feature_views:
  - name: rides
    entities: [rider]
    online: false
    features: [{name: fare, dtype: float64}, {name: minutes, dtype: int64}, {name: city, dtype: string}]
    aggregations:
""" + "".join(
    f"      - {{name: {n}, function: {f}, column: {c}, window: {w}{', k: 3' if f == 'last_k' else ''}}}\n" for n, f, c, w, _, _ in AGGS
)

DUCKDB = r"""
import sys, duckdb
work, out = sys.argv[1], sys.argv[2]
con = duckdb.connect()
con.execute("SET threads TO %d" % __import__('os').cpu_count())
tails = {tails}
aggs = {aggs}
cols = []
for name, f, c, w in aggs:
    cond = f"epoch_us(e.event_timestamp) >= s.tail_{{w}}"
    expr = {{"count": f"count(e.{{c}}) FILTER (WHERE {{cond}})", "sum": f"CAST(sum(e.{{c}}) FILTER (WHERE {{cond}}) AS {{'BIGINT' if c == 'minutes' else 'DOUBLE'}})",
            "avg": f"avg(e.{{c}}) FILTER (WHERE {{cond}})", "stddev": f"stddev_samp(e.{{c}}) FILTER (WHERE {{cond}})",
            "min": f"min(e.{{c}}) FILTER (WHERE {{cond}})", "max": f"max(e.{{c}}) FILTER (WHERE {{cond}})",
            "last_k": f"list(e.{{c}} ORDER BY e.event_timestamp DESC, e.seq DESC) FILTER (WHERE {{cond}} AND e.{{c}} IS NOT NULL)[1:3]"}}[f]
    cols.append(f"{{expr}} AS rides__{{name}}")
tail_cols = ", ".join(f"CAST(floor((epoch_us(event_timestamp) - {{w}}) / {{h}}) AS BIGINT) * {{h}} AS tail_{{k}}" for k, (w, h) in tails.items())
widest = "tail_" + min(tails, key=lambda k: -tails[k][0])
con.execute(f"CREATE TEMP TABLE s AS SELECT *, {{tail_cols}} FROM read_parquet('{{work}}/spine.parquet')")
con.execute(f'''COPY (
  SELECT s.row_id, {{", ".join(cols)}}
  FROM s LEFT JOIN read_parquet('{{work}}/events.parquet') e
    ON e.rider_id = s.rider_id AND e.event_timestamp <= s.event_timestamp AND epoch_us(e.event_timestamp) >= s.{{widest}}
  GROUP BY s.row_id ORDER BY s.row_id) TO '{{out}}' (FORMAT parquet)''')
"""

POLARS = r"""
import sys, polars as pl
work, out = sys.argv[1], sys.argv[2]
tails = {tails}
aggs = {aggs}
s = pl.scan_parquet(f"{{work}}/spine.parquet")
us = pl.col("event_timestamp").dt.epoch("us")
for k, (w, h) in tails.items():
    s = s.with_columns((((us - w) // h) * h).alias(f"tail_{{k}}"))
e = pl.scan_parquet(f"{{work}}/events.parquet").select(
    "rider_id", pl.col("event_timestamp").dt.epoch("us").alias("ets"), "fare", "minutes", "city", "seq")
widest = "tail_" + min(tails, key=lambda k: -tails[k][0])
j = s.join(e, on="rider_id", how="left").filter(
    pl.col("ets").is_null() | ((pl.col("ets") <= us) & (pl.col("ets") >= pl.col(widest))))
exprs = []
for name, f, c, w in aggs:
    inside = pl.col("ets") >= pl.col(f"tail_{{w}}")
    v = pl.col(c).filter(inside)
    some = v.count() > 0
    expr = {{"count": v.count(), "sum": pl.when(some).then(v.sum()), "avg": v.mean(), "stddev": v.std(), "min": v.min(), "max": v.max()}}.get(f)
    if f == "last_k":
        keep = inside & pl.col(c).is_not_null()
        expr = pl.col(c).filter(keep).sort_by([pl.col("ets").filter(keep), pl.col("seq").filter(keep)], descending=True).head(3)
    exprs.append(expr.alias(f"rides__{{name}}"))
# A rider with events but none inside the widest window loses all its joined rows to
# the filter: join the groups back onto the spine so its row stays (with empty values).
res = s.select("row_id").join(j.group_by("row_id").agg(exprs), on="row_id", how="left").sort("row_id").collect()
res.write_parquet(out)
"""


def check(a, b, what):
    """Equal column by column: ints, strings and lists exactly, floats 1e-9 relative
    (a null equals a null; a sum over no values is null in all three)."""
    if a.num_rows != b.num_rows:
        sys.exit(f"{what}: {a.num_rows} vs {b.num_rows} rows")
    for name in [c for c in a.column_names if c.startswith("rides__")]:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        for i, (p, q) in enumerate(zip(x, y)):
            if isinstance(p, float) and isinstance(q, float):
                ok = abs(p - q) <= 1e-9 * max(abs(p), abs(q), 1e-300)
            elif name.split("__")[1].startswith("n_"):
                ok = (p or 0) == (q or 0)  # count: 0 vs null for an empty window in the peers
            elif isinstance(p, list) or isinstance(q, list):
                ok = (p or []) == (q or [])
            else:
                ok = p == q
            if not ok:
                sys.exit(f"{what}: {name} differs at row {i}: {p!r} vs {q!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--spine-rows", type=int, default=1_000_000)
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--entities", type=int, default=100_000)
    ap.add_argument("--python", default=sys.executable, help="a Python with duckdb, polars and pyarrow for the peers")
    ap.add_argument("--no-polars", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="quiver-agg-bench.")
    try:
        generate(work, args.events, args.spine_rows, args.entities)
        repo = os.path.join(work, "repo")
        os.makedirs(repo)
        with open(os.path.join(repo, "quiver.yaml"), "w") as f:
            f.write("project: aggbench\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n  type: embedded\n  path: online.db\n")
        with open(os.path.join(repo, "features.yaml"), "w") as f:
            f.write(FEATURES_YAML)
        q = os.path.abspath(args.quiver)
        subprocess.run([q, "apply"], cwd=repo, check=True, capture_output=True)
        subprocess.run([q, "ingest", "rides", os.path.join(work, "events_q.parquet")], cwd=repo, check=True, capture_output=True)
        refs = ",".join(f"rides:{n}" for n, *_ in AGGS)
        out_q = os.path.join(work, "quiver.parquet")
        tails = {w: (wu, h) for _, _, _, w, wu, h in AGGS}
        aggs = [(n, f, c, w) for n, f, c, w, _, _ in AGGS]
        peers = [("duckdb range join + GROUP BY", DUCKDB)] + ([] if args.no_polars else [("polars join + filter + group_by", POLARS)])
        engines = [("quiver historical", [q, "historical", "--spine", os.path.join(work, "spine.parquet"), "--features", refs,
                                          "--out", out_q, "--engine", "cpu"], repo, out_q)]
        for name, code in peers:
            script = os.path.join(work, "peer_" + name.split()[0] + ".py")
            with open(script, "w") as f:
                f.write(code.format(tails=repr(tails), aggs=repr(aggs)))
            out = os.path.join(work, name.split()[0] + ".parquet")
            engines.append((name, [args.python, script, work, out], None, out))
        # Round robin, so that a slow moment of the machine does not fall on one engine.
        runs = {name: [] for name, *_ in engines}
        for rep in range(args.reps):
            for name, cmd, cwd, out in engines:
                wall, cpu, rss, _, _ = time_v(cmd, cwd=cwd)
                runs[name].append((wall, cpu, rss))
                print(f"rep {rep + 1} {name:<34} wall {wall:6.2f} s  cpu {cpu:6.2f} s  peak {rss / 2**20:6.0f} MiB", flush=True)
                if rep == 0 and name != engines[0][0]:
                    check(pq.read_table(out_q).sort_by("row_id"), pq.read_table(out).sort_by("row_id"), f"quiver vs {name}")
        med = {name: (statistics.median(w for w, _, _ in r), statistics.median(c for _, c, _ in r), max(m for _, _, m in r),
                      min(w for w, _, _ in r), max(w for w, _, _ in r)) for name, r in runs.items()}
        duck = med[peers[0][0]][0]
        print(f"windowed aggregations: {args.spine_rows:,} spine rows x {args.events:,} events ({args.entities:,} riders) x {len(AGGS)} "
              f"aggregations, {os.cpu_count()} cores, {args.reps} reps round robin (median wall); results checked equal")
        print(f"{'engine':<34} {'wall s':>8} {'(min-max)':>13} {'cpu s':>8} {'peak RSS':>10} {'vs duckdb':>10}")
        for name, (wall, cpu, rss, lo, hi) in med.items():
            print(f"{name:<34} {wall:>8.2f} {f'({lo:.2f}-{hi:.2f})':>13} {cpu:>8.2f} {rss / 2**20:>6.0f} MiB {wall / duck:>9.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
