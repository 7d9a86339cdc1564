#!/usr/bin/env python3
"""Write-time expressions at ingest: raw rows with a filter and four expressions, beside
the ingest of the same rows already transformed (not a test).

    <venv>/bin/python bench/write_time_bench.py --quiver target/release/quiver [--rows 10000000] [--reps 3]

(`./run bench-write-time` installs everything and runs this, then the stream's
throughput with and without the same kind of expressions.) One Parquet file of --rows
raw payments (customer, time, amount in cents, status, country, items; 10% of the rows
`failed`, --zero-share of them with 0 items: `amount_cents / items` cannot be computed), and the same rows transformed by pyarrow (the failed ones dropped, the four
features computed) in a second file. Each rep ingests the raw file into a view with
`filter: "status = 'ok'"` and four expressions, and the transformed file into a view
storing the same four features as they come, each into a fresh repository, round robin;
medians of wall time. Both ingests must store the same number of rows.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ENTITIES = "entities:\n  - {name: customer, join_keys: [{name: customer_id, dtype: int64}]}\nfeature_views:\n"

SHAPED = ENTITIES + """  - name: payments
    entities: [customer]
    source:
      timestamp_field: event_timestamp
      filter: "status = 'ok'"
      raw: [{name: amount_cents, dtype: int64}, {name: status, dtype: string}, {name: country_raw, dtype: string}]
    features:
      - {name: amount, dtype: float64, expr: "CAST(amount_cents AS DOUBLE) / 100"}
      - {name: country, dtype: string, expr: "lower(country_raw)"}
      - {name: is_big, dtype: bool, expr: "amount_cents >= 100000"}
      - {name: items, dtype: int64}
      - {name: per_item, dtype: int64, expr: "amount_cents / items"}
"""

PLAIN = ENTITIES + """  - name: payments
    entities: [customer]
    source: {timestamp_field: event_timestamp}
    features:
      - {name: amount, dtype: float64}
      - {name: country, dtype: string}
      - {name: is_big, dtype: bool}
      - {name: items, dtype: int64}
      - {name: per_item, dtype: int64}
"""


def generate(rows, work, zero_share):
    rng = np.random.default_rng(7)
    base = np.datetime64("2025-01-01T00:00:00", "us").astype(np.int64)
    cents = rng.integers(-5_000, 500_000, rows)
    # Items 1..12, and 0 (a division by zero: not computed, null) in `zero_share` of the rows.
    items = np.where(rng.random(rows) < zero_share, 0, rng.integers(1, 13, rows))
    status = np.where(rng.random(rows) < 0.1, "failed", "ok")
    countries = np.array(["FR", "De", "us", "GB", "Es", "IT", "nl", "PT"])
    raw = pa.table({
        "customer_id": pa.array(rng.integers(0, 1_000_000, rows)),
        "event_timestamp": pa.array(base + rng.integers(0, 86_400_000_000 * 30, rows), pa.timestamp("us", tz="UTC")),
        "amount_cents": pa.array(cents),
        "status": pa.array(status),
        "country_raw": pa.array(countries[rng.integers(0, len(countries), rows)]),
        "items": pa.array(items),
    })
    pq.write_table(raw, os.path.join(work, "raw.parquet"))
    # The same rows transformed here: the failed ones dropped, the features computed.
    kept = raw.filter(pc.equal(raw["status"], "ok"))
    amount_cents, n = kept["amount_cents"], kept["items"]
    zero = pc.equal(n, 0)
    per_item = pc.if_else(zero, pa.scalar(None, pa.int64()), pc.divide(amount_cents, pc.if_else(zero, 1, n)))
    transformed = pa.table({
        "customer_id": kept["customer_id"],
        "event_timestamp": kept["event_timestamp"],
        "amount": pc.divide(pc.cast(amount_cents, pa.float64()), 100.0),
        "country": pc.utf8_lower(kept["country_raw"]),
        "is_big": pc.greater_equal(amount_cents, 100_000),
        "items": n,
        "per_item": per_item,
    })
    pq.write_table(transformed, os.path.join(work, "transformed.parquet"))
    return raw.num_rows, transformed.num_rows


def ingest(quiver, work, name, features, file):
    repo = os.path.join(work, name)
    shutil.rmtree(repo, ignore_errors=True)
    subprocess.run([quiver, "init", repo], check=True, capture_output=True)
    with open(os.path.join(repo, "features.yaml"), "w") as fh:
        fh.write(features)
    subprocess.run([quiver, "--repo", repo, "apply"], check=True, capture_output=True)
    began = time.perf_counter()
    out = subprocess.run([quiver, "--repo", repo, "ingest", "payments", os.path.join(work, file)],
                         check=True, capture_output=True, text=True).stdout
    took = time.perf_counter() - began
    shutil.rmtree(repo, ignore_errors=True)
    return took, int(re.search(r"ingested (\d+) rows", out).group(1)), out.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--zero-share", type=float, default=0.001,
                    help="share of the rows whose division is by zero (not computed: null, counted)")
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    work = tempfile.mkdtemp(prefix="quiver-write-time-bench.")
    try:
        raw_rows, kept_rows = generate(args.rows, work, args.zero_share)
        print(f"{raw_rows:,} raw rows, {kept_rows:,} after the filter", flush=True)
        times = {"raw rows, filter + 4 expressions": [], "the same rows transformed": []}
        for rep in range(args.reps):
            for label, features, file in (("raw rows, filter + 4 expressions", SHAPED, "raw.parquet"),
                                          ("the same rows transformed", PLAIN, "transformed.parquet")):
                took, stored, line = ingest(quiver, work, f"repo{rep}", features, file)
                assert stored == kept_rows, f"{label}: {stored} rows stored, expected {kept_rows}: {line}"
                times[label].append(took)
                print(f"rep {rep + 1} {label}: {took:.2f} s ({line})", flush=True)
        shaped, plain = (statistics.median(v) for v in times.values())
        print()
        print(f"| ingest of {raw_rows:,} rows | wall s median of {args.reps} | ratio |")
        print("|---|---|---|")
        print(f"| raw rows, filter + 4 expressions | {shaped:.2f} | {shaped / plain:.2f}x |")
        print(f"| the same rows transformed ({kept_rows:,}) | {plain:.2f} | |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
