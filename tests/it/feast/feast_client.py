#!/usr/bin/env python3
"""Feast's own Python SDK reading from `quiver serve` (docs/online.md, issue #4).

    <feast-venv>/bin/python feast_client.py QUIVER_BIN WORK_DIR [REDIS_URL]

Builds a Quiver repository and the same definitions as a Feast repository whose online
store is `{type: remote, path: <quiver serve URL>}`; ingests generated rows with
`quiver ingest`, materializes them (into Redis when REDIS_URL is given, else the
embedded store), starts `quiver serve`, and reads through `FeatureStore.get_online_features`
(feature lists, a feature service, full feature names, several and composite keys).

Every value and status is checked against an oracle computed here with pandas from the
generated rows (latest by event time then created time, ttl against the request time),
so neither side's code is trusted. Exits non-zero with the first mismatches printed.
"""
import json
import os
import random
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import requests

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        if len(FAILURES) <= 20:
            print(f"MISMATCH: {what}", file=sys.stderr)


def run(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        sys.exit(f"command failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout}\n{res.stderr}")
    return res.stdout


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


FEATURES_YAML = """
entities:
  - name: driver
    join_keys: [{name: driver_id, dtype: int64}]
  - name: rider
    join_keys: [{name: rider_id, dtype: string}]
feature_views:
  - name: driver_stats
    entities: [driver]
    ttl: 1h
    online: true
    source: {timestamp_field: event_timestamp, created_timestamp_field: created_timestamp}
    features:
      - {name: conv_rate, dtype: float64}
      - {name: trips, dtype: int64}
      - {name: tier, dtype: string}
      - {name: active, dtype: bool}
      - {name: rating, dtype: float32}
  - name: pair_stats
    entities: [driver, rider]
    ttl: 0
    online: true
    source: {timestamp_field: event_timestamp, created_timestamp_field: created_timestamp}
    features:
      - {name: rides, dtype: int64}
      - {name: embedding, dtype: list<float64>}
feature_services:
  - name: ranker
    features: [driver_stats:conv_rate, driver_stats:trips, pair_stats:rides, pair_stats:embedding]
"""

DRIVER_FEATURES = ["conv_rate", "trips", "tier", "active", "rating"]
PAIR_FEATURES = ["rides", "embedding"]


def generate(now, rng):
    """Rows for 40 drivers and 40 (driver, rider) pairs with every edge case of docs/online.md."""
    drows = []
    for d in range(1, 41):
        if d % 10 == 0:
            continue  # never seen: NOT_FOUND
        n = rng.randint(1, 5)
        for _ in range(n):
            # Drivers 1..5 only have rows older than the 1h ttl: OUTSIDE_MAX_AGE.
            age_min = rng.randint(70, 300) if d <= 5 else rng.randint(1, 50)
            ts = now - timedelta(minutes=age_min, seconds=rng.randint(0, 59))
            drows.append({
                "driver_id": d,
                "event_timestamp": ts,
                "created_timestamp": ts + timedelta(seconds=rng.randint(0, 30)),
                # Whole numbers in a float column must come back as floats.
                "conv_rate": None if (d % 7 == 0) else float(rng.randint(0, 3)) if d % 3 == 0 else rng.random(),
                "trips": rng.randint(0, 10_000),
                "tier": rng.choice(["gold", "silver", "bronze"]),
                "active": rng.random() < 0.5,
                "rating": rng.choice([4.0, 4.5, 3.7, 0.1]),
            })
        if d in (11, 12):
            # Two rows with the same event time: the later created time wins.
            ts = now - timedelta(seconds=30)
            for created, trips in ((ts + timedelta(seconds=5), 111), (ts + timedelta(seconds=9), 222)):
                drows.append({"driver_id": d, "event_timestamp": ts, "created_timestamp": created,
                              "conv_rate": 0.5, "trips": trips, "tier": "gold", "active": True, "rating": 5.0})
    prows = []
    for d in range(1, 21):
        for r in ("R1", "R2"):
            if (d + len(r)) % 6 == 0:
                continue
            for _ in range(rng.randint(1, 3)):
                ts = now - timedelta(days=rng.randint(0, 90), minutes=rng.randint(1, 600))
                prows.append({
                    "driver_id": d, "rider_id": r,
                    "event_timestamp": ts, "created_timestamp": ts,
                    "rides": rng.randint(1, 50),
                    "embedding": [float(rng.randint(0, 4)), rng.random(), -1.0],
                })
    return drows, prows


def write_parquet(rows, path, schema):
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def oracle(rows, keys, features, ttl, now):
    """{key tuple: (status per feature, value per feature)} at `now`."""
    df = pd.DataFrame(rows)
    df = df[df["event_timestamp"] <= now]
    df = df.sort_values(["event_timestamp", "created_timestamp"], kind="stable")
    out = {}
    for key, group in df.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        last = group.iloc[-1]
        if ttl is not None and now - last["event_timestamp"] > ttl:
            out[key] = {f: ("OUTSIDE_MAX_AGE", None) for f in features}
            continue
        cells = {}
        for f in features:
            v = last[f]
            null = v is None or (isinstance(v, float) and np.isnan(v))
            cells[f] = ("NULL_VALUE", None) if null else ("PRESENT", v)
        out[key] = cells
    return out


def same(expected, got, dtype):
    if dtype == "float32":
        return isinstance(got, float) and np.float32(got) == np.float32(expected)
    if dtype == "float64":
        return isinstance(got, float) and got == expected
    if dtype == "int64":
        return isinstance(got, int) and not isinstance(got, bool) and got == expected
    if dtype == "bool":
        return isinstance(got, bool) and got == expected
    if dtype == "list<float64>":
        return isinstance(got, list) and all(isinstance(x, float) for x in got) and got == list(expected)
    return got == expected


DTYPES = {"conv_rate": "float64", "trips": "int64", "tier": "string", "active": "bool",
          "rating": "float32", "rides": "int64", "embedding": "list<float64>"}


def main():
    quiver, work = sys.argv[1], os.path.abspath(sys.argv[2])
    redis_url = sys.argv[3] if len(sys.argv) > 3 else None
    rng = random.Random(7)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    qrepo = os.path.join(work, "quiver_repo")
    frepo = os.path.join(work, "feast_repo")
    os.makedirs(qrepo)
    os.makedirs(frepo)

    # --- the Quiver side -------------------------------------------------------------
    project = f"feastcompat{os.getpid()}"
    online = (f"  type: redis\n  url: {redis_url}\n" if redis_url else "  type: embedded\n  path: online.db\n")
    with open(os.path.join(qrepo, "quiver.yaml"), "w") as fh:
        fh.write(f"project: {project}\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n{online}")
    with open(os.path.join(qrepo, "features.yaml"), "w") as fh:
        fh.write(FEATURES_YAML)
    drows, prows = generate(now, rng)
    ts = pa.timestamp("us", tz="UTC")
    dschema = pa.schema([("driver_id", pa.int64()), ("event_timestamp", ts), ("created_timestamp", ts),
                         ("conv_rate", pa.float64()), ("trips", pa.int64()), ("tier", pa.string()),
                         ("active", pa.bool_()), ("rating", pa.float32())])
    pschema = pa.schema([("driver_id", pa.int64()), ("rider_id", pa.string()), ("event_timestamp", ts),
                         ("created_timestamp", ts), ("rides", pa.int64()), ("embedding", pa.list_(pa.float64()))])
    dfile, pfile = os.path.join(work, "driver_stats.parquet"), os.path.join(work, "pair_stats.parquet")
    write_parquet(drows, dfile, dschema)
    write_parquet(prows, pfile, pschema)
    q = [quiver, "--repo", qrepo]
    run(q + ["apply"])
    run(q + ["ingest", "driver_stats", dfile])
    run(q + ["ingest", "pair_stats", pfile])
    run(q + ["materialize-incremental", now.isoformat()])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(q + ["serve", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            try:
                if requests.get(f"{url}/health", timeout=0.5).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)
        else:
            sys.exit("quiver serve did not come up")
        feast_checks(frepo, url, dfile, pfile, drows, prows, now)
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=10)
        if FAILURES:
            print(out.decode(errors="replace")[-2000:], file=sys.stderr)

    if FAILURES:
        sys.exit(f"{len(FAILURES)} mismatches between Feast's client and the oracle")
    print("feast client: all checks passed")


def feast_checks(frepo, url, dfile, pfile, drows, prows, now):
    import feast
    from feast import Entity, FeatureService, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Array, Bool, Float32, Float64, Int64, String

    print(f"feast {feast.__version__} against {url}")
    with open(os.path.join(frepo, "feature_store.yaml"), "w") as fh:
        fh.write(f"""project: feastcompat
registry: {frepo}/registry.db
provider: local
online_store:
  type: remote
  path: {url}
entity_key_serialization_version: 3
""")
    driver = Entity(name="driver", join_keys=["driver_id"], value_type=ValueType.INT64)
    rider = Entity(name="rider", join_keys=["rider_id"], value_type=ValueType.STRING)
    dsrc = FileSource(name="driver_src", path=dfile, timestamp_field="event_timestamp",
                      created_timestamp_column="created_timestamp")
    psrc = FileSource(name="pair_src", path=pfile, timestamp_field="event_timestamp",
                      created_timestamp_column="created_timestamp")
    driver_stats = FeatureView(name="driver_stats", entities=[driver], ttl=timedelta(hours=1), source=dsrc,
                               schema=[Field(name="conv_rate", dtype=Float64), Field(name="trips", dtype=Int64),
                                       Field(name="tier", dtype=String), Field(name="active", dtype=Bool),
                                       Field(name="rating", dtype=Float32)])
    pair_stats = FeatureView(name="pair_stats", entities=[driver, rider], ttl=timedelta(0), source=psrc,
                             schema=[Field(name="rides", dtype=Int64), Field(name="embedding", dtype=Array(Float64))])
    ranker = FeatureService(name="ranker", features=[driver_stats[["conv_rate", "trips"]],
                                                     pair_stats[["rides", "embedding"]]])
    store = FeatureStore(repo_path=frepo)
    store.apply([driver, rider, driver_stats, pair_stats, ranker])

    d_oracle = oracle(drows, ["driver_id"], DRIVER_FEATURES, timedelta(hours=1), now)
    p_oracle = oracle(prows, ["driver_id", "rider_id"], PAIR_FEATURES, None, now)
    missing = lambda feats: {f: ("NOT_FOUND", None) for f in feats}  # noqa: E731

    def compare(resp, keys, expect, full):
        """`expect`: per entity row, {(view, feature): (status, value)}."""
        names = list(resp.proto.metadata.feature_names.val)
        as_dict = resp.to_dict()
        key_names = [k for k in keys[0]]
        check(names[:len(key_names)] == key_names, f"join keys first: {names}")
        for k in key_names:
            check(as_dict[k] == [row[k] for row in keys], f"echoed {k}: {as_dict[k]}")
        want_names = key_names + [f"{v}__{f}" if full else f for (v, f) in expect[0]]
        check(names == want_names, f"feature names {names} != {want_names}")
        for i, (name, result) in enumerate(zip(names, resp.proto.results)):
            if i < len(key_names):
                check(all(s == feast.protos.feast.serving.ServingService_pb2.FieldStatus.PRESENT
                          for s in result.statuses), f"join key {name} statuses")
                continue
            view, feature = list(expect[0])[i - len(key_names)]
            for row, (want, status) in enumerate(zip(expect, result.statuses)):
                want_status, want_value = want[(view, feature)]
                got_status = feast.protos.feast.serving.ServingService_pb2.FieldStatus.Name(status)
                got = as_dict[name][row]
                where = f"{view}:{feature} for {keys[row]}"
                check(got_status == want_status, f"{where}: status {got_status}, want {want_status}")
                if want_status == "PRESENT":
                    check(same(want_value, got, DTYPES[feature]),
                          f"{where}: value {got!r} ({type(got).__name__}), want {want_value!r}")
                else:
                    check(got is None, f"{where}: value {got!r} with status {got_status}")

    # 1. A feature list over one view, every driver (incl. unknown ones), both name styles.
    drivers = [{"driver_id": d} for d in range(1, 43)]
    expect = [{("driver_stats", f): c for f, c in d_oracle.get((r["driver_id"],), missing(DRIVER_FEATURES)).items()}
              for r in drivers]
    for full in (False, True):
        resp = store.get_online_features(features=[f"driver_stats:{f}" for f in DRIVER_FEATURES],
                                         entity_rows=drivers, full_feature_names=full)
        compare(resp, drivers, expect, full)
    statuses = {s for e in expect for s, _ in e.values()}
    check(statuses == {"PRESENT", "NULL_VALUE", "NOT_FOUND", "OUTSIDE_MAX_AGE"}, f"the data covers every status: {statuses}")

    # 2. The feature service over two views with a composite key.
    pairs = [{"driver_id": d, "rider_id": r} for d in range(1, 23) for r in ("R1", "R2", "R9")]
    service = store.get_feature_service("ranker")
    expect = []
    for row in pairs:
        d = d_oracle.get((row["driver_id"],), missing(DRIVER_FEATURES))
        p = p_oracle.get((row["driver_id"], row["rider_id"]), missing(PAIR_FEATURES))
        expect.append({("driver_stats", "conv_rate"): d["conv_rate"], ("driver_stats", "trips"): d["trips"],
                       ("pair_stats", "rides"): p["rides"], ("pair_stats", "embedding"): p["embedding"]})
    for full in (False, True):
        resp = store.get_online_features(features=service, entity_rows=pairs, full_feature_names=full)
        compare(resp, pairs, expect, full)

    # 3. What Feast's client sends beyond the API of docs/online.md is ignored, as are fields it may add later.
    body = {"entities": {"driver_id": [11, 12]}, "features": ["driver_stats:trips"],
            "full_feature_names": False, "include_feature_view_version_metadata": False,
            "some_future_field": {"x": [1, 2]}}
    r = requests.post(f"{url}/get-online-features", data=json.dumps(body), timeout=5)
    check(r.status_code == 200, f"unknown request fields: status {r.status_code} {r.text}")
    if r.status_code == 200:
        # Driver 11 and 12: equal event times, the later created time (trips 222) wins.
        check(r.json()["results"][1]["values"] == [222, 222], f"created-time tie-break: {r.text}")
    print(f"compared {len(drivers) * len(DRIVER_FEATURES) * 2 + len(pairs) * 4 * 2} feature values")


if __name__ == "__main__":
    main()
