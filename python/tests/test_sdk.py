"""The Python SDK over the Rust core: definitions, historical, online, push, errors.

Run by `./run test` (which builds the extension with maturin into its own venv):
    QUIVER_BIN=<quiver binary> pytest python/tests
The oracle for historical features is the `quiver historical` CLI on the same data and
spine, and a pandas computation for online values, so the SDK is never its own judge.
"""
import json
import os
import signal
import socket
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import quiver as qv

QUIVER = os.environ.get("QUIVER_BIN", os.path.expanduser("~/.cache/quiver/target/debug/quiver"))
NOW = datetime.now(timezone.utc).replace(microsecond=0)

YAML = """entities:
  - name: rider
    join_keys: [{name: rider_id, dtype: int64}]
feature_views:
  - name: trips
    entities: [rider]
    ttl: 90m
    online: true
    source:
      timestamp_field: event_timestamp
      created_timestamp_field: created_timestamp
    features:
      - {name: fare, dtype: float64}
      - {name: city, dtype: string}
      - {name: embedding, dtype: list<float32>}
feature_services:
  - name: ranker
    features: [trips:fare, trips:city]
"""


def cli(repo, *args):
    res = subprocess.run([QUIVER, "--repo", str(repo), *args], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


def new_repo(path):
    res = subprocess.run([QUIVER, "init", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return path


def definitions():
    rider = qv.Entity(name="rider", join_keys=[qv.Field("rider_id", qv.Int64)])
    trips = qv.FeatureView(
        name="trips", entities=[rider], ttl=timedelta(minutes=90), online=True,
        source=qv.DeltaSource(timestamp_field="event_timestamp", created_timestamp_field="created_timestamp"),
        schema=[qv.Field("fare", qv.Float64), qv.Field("city", qv.String),
                qv.Field("embedding", qv.Array(qv.Float32))])
    svc = qv.FeatureService(name="ranker", features=["trips:fare", "trips:city"])
    return rider, trips, svc


def rows():
    """Trips of 5 riders over the last 3 hours, with a tie on event time."""
    out = []
    for r in range(1, 6):
        for k in range(4):
            t = NOW - timedelta(minutes=170 - 40 * k + r)
            out.append({"rider_id": r, "event_timestamp": t, "created_timestamp": t + timedelta(seconds=k),
                        "fare": 10.0 * r + k + 0.25, "city": f"c{(r + k) % 3}", "embedding": [float(r), float(k)]})
    t = NOW - timedelta(minutes=30)
    out.append({"rider_id": 1, "event_timestamp": t, "created_timestamp": t + timedelta(seconds=50),
                "fare": 99.5, "city": "late", "embedding": [9.0, 9.0]})
    out.append({"rider_id": 1, "event_timestamp": t, "created_timestamp": t + timedelta(seconds=5),
                "fare": 11.0, "city": "early", "embedding": [1.0, 1.0]})
    return out


def table():
    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema([("rider_id", pa.int64()), ("event_timestamp", ts), ("created_timestamp", ts),
                        ("fare", pa.float64()), ("city", pa.string()), ("embedding", pa.list_(pa.float32()))])
    return pa.Table.from_pylist(rows(), schema=schema)


def spine():
    ts = [NOW - timedelta(minutes=m) for m in (0, 25, 60, 100, 200)]
    ids, times = [], []
    for r in (1, 2, 3, 7):
        for t in ts:
            ids.append(r)
            times.append(t)
    return pa.table({"rider_id": pa.array(ids, pa.int64()), "event_timestamp": pa.array(times, pa.timestamp("us", tz="UTC")),
                     "label": pa.array([i % 2 for i in range(len(ids))], pa.int64())})


@pytest.fixture()
def store(tmp_path):
    repo = new_repo(tmp_path / "repo")
    s = qv.FeatureStore(str(repo))
    s.apply(list(definitions()))
    s.ingest("trips", table())
    return s


def test_python_and_yaml_definitions_give_the_same_registry(tmp_path):
    a = new_repo(tmp_path / "a" / "repo")
    (a / "features.yaml").write_text(YAML)
    cli(a, "apply")
    b = new_repo(tmp_path / "b" / "repo")
    version = qv.FeatureStore(str(b)).apply(list(definitions()))
    assert version == 1
    reg = lambda p: json.loads((p / "registry.json").read_text())  # noqa: E731
    assert reg(a)["definitions"] == reg(b)["definitions"]
    # Applying the same again changes nothing; Feast's entity style is accepted too.
    feast_style = qv.Entity(name="rider", join_keys=["rider_id"], value_type=qv.Int64)
    assert qv.FeatureStore(str(b)).apply([feast_style]) == 1
    assert [v.name for v in qv.FeatureStore(str(b)).list_feature_views()] == ["trips"]


def test_the_spec_snippet_runs_as_written(tmp_path):
    repo = new_repo(tmp_path / "repo")
    table_, spine_, start, end = table(), spine(), NOW - timedelta(days=1), NOW
    # --- docs/python.md, as written ---
    store = qv.FeatureStore(str(repo))                      # an initialised repo folder
    rider = qv.Entity(name="rider", join_keys=[qv.Field("rider_id", qv.Int64)])
    trips = qv.FeatureView(
        name="trips", entities=[rider], ttl=timedelta(minutes=90), online=True,
        source=qv.DeltaSource(timestamp_field="event_timestamp",
                              created_timestamp_field="created_timestamp"),
        schema=[qv.Field("fare", qv.Float64), qv.Field("city", qv.String),
                qv.Field("embedding", qv.Array(qv.Float32))])
    svc = qv.FeatureService(name="ranker", features=["trips:fare", "trips:city"])
    store.apply([rider, trips, svc])
    store.ingest("trips", table_)                          # pyarrow Table / pandas / polars
    job = store.get_historical_features(entity_df=spine_, features=["trips:fare"])  # or feature_service="ranker"
    job.to_arrow(); job.to_pandas(); job.to_polars()
    store.materialize(start, end); store.materialize_incremental(end)
    store.get_online_features(features=["trips:fare"], entity_rows=[{"rider_id": 1}]).to_dict()
    store.push("trips", table_, to="online_and_offline")
    # --- end ---
    assert job.to_arrow().num_rows == spine_.num_rows


def test_historical_equals_the_cli(store, tmp_path):
    sp = spine()
    pq.write_table(sp, tmp_path / "spine.parquet")
    cli(store.repo_path, "historical", "--spine", str(tmp_path / "spine.parquet"), "--service", "ranker",
        "--out", str(tmp_path / "cli.parquet"), "--engine", "cpu")
    expected = pq.read_table(tmp_path / "cli.parquet")
    got = store.get_historical_features(entity_df=sp, feature_service="ranker").to_arrow()
    assert got.equals(expected), (got.to_pandas(), expected.to_pandas())
    # The tie at rider 1's last event goes to the later created time; rider 7 is unknown.
    df = got.to_pandas()
    assert df.loc[(df.rider_id == 1)].iloc[0]["trips__fare"] == 99.5
    assert df.loc[df.rider_id == 7, "trips__fare"].isna().all()


def test_pandas_polars_and_pyarrow_inputs_agree(store):
    sp = spine()
    outs = [store.get_historical_features(entity_df=x, features=["trips:fare", "trips:embedding"]).to_arrow()
            for x in (sp, sp.to_pandas(), pl.from_arrow(sp))]
    assert outs[0].equals(outs[1]) and outs[0].equals(outs[2])
    assert outs[0].column_names[-2:] == ["trips__fare", "trips__embedding"]
    # And ingest takes pandas/polars too: the same rows again give the same answers.
    for frame in (table().to_pandas(), pl.from_arrow(table())):
        store.ingest("trips", frame)
    again = store.get_historical_features(entity_df=sp, features=["trips:fare", "trips:embedding"]).to_arrow()
    assert again.equals(outs[0])


def test_online_after_materialize(store):
    store.materialize(NOW - timedelta(days=1), NOW)
    resp = store.get_online_features(features=["trips:fare", "trips:city"],
                                     entity_rows=[{"rider_id": r} for r in (1, 2, 7)])
    got = resp.to_dict()
    # Oracle: the latest row per rider by (event, created) time, ttl 90 min.
    df = table().to_pandas().sort_values(["event_timestamp", "created_timestamp"])
    latest = df.groupby("rider_id").tail(1).set_index("rider_id")
    assert got["rider_id"] == [1, 2, 7]
    assert got["fare"][:2] == [latest.loc[1, "fare"], latest.loc[2, "fare"]]
    assert got["city"][:2] == [latest.loc[1, "city"], latest.loc[2, "city"]]
    assert got["fare"][2] is None and resp.statuses["fare"] == ["PRESENT", "PRESENT", "NOT_FOUND"]
    assert resp.to_arrow().column_names == ["rider_id", "fare", "city"]
    full = store.get_online_features(store.get_feature_service("ranker"), [{"rider_id": 2}], full_feature_names=True)
    assert list(full.to_dict()) == ["rider_id", "trips__fare", "trips__city"]
    # A FeatureService object is used as given, not looked up by its name.
    one = store.get_online_features(qv.FeatureService(name="ranker", features=["trips:city"]), [{"rider_id": 2}])
    assert list(one.to_dict()) == ["rider_id", "city"]
    # numpy scalars are keys as Python ints are.
    np_keys = store.get_online_features(["trips:fare"], [{"rider_id": np.int64(1)}, {"rider_id": np.int32(2)}])
    assert np_keys.to_dict()["fare"] == got["fare"][:2]


def test_a_breaking_change_from_python_is_a_version_served_beside_the_first(store):
    """A breaking change applied from Python to a view with data makes its version 2
    (docs/versions.md): the registered service stays on version 1 and answers what it
    answered, `view@1:feature` reads version 1 online and offline, the latest reads
    version 2 (empty yet), the columns keep their names, and a version that does not
    exist or one view at two versions is refused."""
    store.materialize(NOW - timedelta(days=1), NOW)
    before = store.get_online_features(store.get_feature_service("ranker"), [{"rider_id": 2}], full_feature_names=True).to_dict()
    rider, trips, svc = definitions()
    trips2 = qv.FeatureView(
        name="trips", entities=[rider], ttl=timedelta(minutes=90), online=True,
        source=qv.DeltaSource(timestamp_field="event_timestamp", created_timestamp_field="created_timestamp"),
        schema=[qv.Field("fare", qv.String), qv.Field("city", qv.String), qv.Field("embedding", qv.Array(qv.Float32))])
    assert store.apply([rider, trips2, svc]) == 2
    assert list(store.get_feature_service("ranker").features) == ["trips@1:fare", "trips@1:city"]
    after = store.get_online_features(store.get_feature_service("ranker"), [{"rider_id": 2}], full_feature_names=True).to_dict()
    assert after == before and list(after) == ["rider_id", "trips__fare", "trips__city"]
    assert store.get_online_features(["trips@1:fare"], [{"rider_id": 2}]).to_dict()["fare"] == before["trips__fare"]
    assert store.get_online_features(["trips:fare"], [{"rider_id": 2}]).statuses["fare"] == ["NOT_FOUND"]
    job = store.get_historical_features(entity_df=spine(), features=["trips@1:fare"]).to_arrow()
    old = store.get_historical_features(entity_df=spine(), feature_service="ranker").to_arrow()
    assert job.column("trips__fare").to_pylist() == old.column("trips__fare").to_pylist()
    assert any(v is not None for v in job.column("trips__fare").to_pylist())
    with pytest.raises(qv.NotFoundError, match=r"view `trips` has no version 3 \(it never had one, or it was retired; live: 1, 2\)"):
        store.get_online_features(["trips@3:fare"], [{"rider_id": 2}])
    with pytest.raises(qv.ValidationError, match=r"view `trips` is asked at version .*`trips@1:fare`.*`trips:city`|`trips:city`.*`trips@1:fare`"):
        store.get_online_features(["trips@1:fare", "trips:city"], [{"rider_id": 2}])
    with pytest.raises(qv.ValidationError, match="bad feature reference `trips@0:fare`"):
        store.get_online_features(["trips@0:fare"], [{"rider_id": 2}])
    versions = store.list_versions("trips")
    assert [(v["version"], v["latest"], v["read_by"]) for v in versions] == [(1, False, ["feature_service ranker"]), (2, True, [])]
    assert versions[0]["rows_offline"] == table().num_rows and versions[1]["rows_offline"] == 0
    assert versions[1]["changes"] == ['features[fare].dtype: "float64" -> "string"']
    with pytest.raises(qv.NotFoundError, match="unknown feature view `nope`"):
        store.list_versions("nope")
    # Moving the service is one change: its versions.
    moved = qv.FeatureService(name="ranker", features=["trips:fare", "trips:city"], versions={"trips": 2})
    assert moved.features == ["trips@2:fare", "trips@2:city"]
    assert store.apply([rider, trips2, moved]) == 3
    assert list(store.get_feature_service("ranker").features) == ["trips@2:fare", "trips@2:city"]
    assert store.get_online_features(store.get_feature_service("ranker"), [{"rider_id": 2}]).statuses["fare"] == ["NOT_FOUND"]
    with pytest.raises(ValueError, match=r"`trips@1:fare` names version 1 of `trips`, and versions pins it to 2"):
        qv.FeatureService(name="ranker", features=["trips@1:fare"], versions={"trips": 2})
    with pytest.raises(ValueError, match="version of `trips` must be a whole number from 1, got 0"):
        qv.FeatureService(name="ranker", features=["trips:fare"], versions={"trips": 0})


def test_push_reaches_both_stores(store):
    t = NOW - timedelta(minutes=1)
    fresh = pd.DataFrame({"rider_id": [4], "event_timestamp": [pd.Timestamp(t)], "created_timestamp": [pd.Timestamp(t)],
                          "fare": [123.0], "city": ["pushed"],
                          # float32 arrays: float64 lists are refused for a list<float32> feature (lossy)
                          "embedding": [np.array([0.5, 0.5], dtype=np.float32)]})
    out = store.push("trips", fresh)
    assert out["rows"] == 1 and out["online_written"] == 1 and out["offline_version"] >= 2
    assert store.get_online_features(["trips:city"], [{"rider_id": 4}]).to_dict()["city"] == ["pushed"]
    job = store.get_historical_features(entity_df=pa.table({"rider_id": pa.array([4], pa.int64()),
                                                            "event_timestamp": pa.array([NOW], pa.timestamp("us", tz="UTC"))}),
                                        features=["trips:city"])
    assert job.to_pandas()["trips__city"].tolist() == ["pushed"]


def test_errors_map_to_the_exception_hierarchy(store, tmp_path):
    assert issubclass(qv.ValidationError, qv.QuiverError) and issubclass(qv.NotFoundError, qv.QuiverError)
    assert issubclass(qv.StoreUnavailableError, qv.QuiverError)
    with pytest.raises(qv.NotFoundError, match="quiver.yaml"):
        qv.FeatureStore(str(tmp_path / "nowhere"))
    with pytest.raises(qv.NotFoundError, match="unknown feature view `nope`"):
        store.ingest("nope", table())
    with pytest.raises(qv.NotFoundError, match="unknown feature service `nope`"):
        store.get_historical_features(entity_df=spine(), feature_service="nope")
    with pytest.raises(qv.NotFoundError, match="unknown feature"):
        store.get_online_features(["trips:nope"], [{"rider_id": 1}])
    naive = table().set_column(1, "event_timestamp", table().column(1).cast(pa.timestamp("us")))
    with pytest.raises(qv.ValidationError, match="without a time zone"):
        store.ingest("trips", naive)
    bad = table().set_column(3, "fare", pa.array(["x"] * table().num_rows))
    with pytest.raises(qv.ValidationError, match="column `fare`"):
        store.ingest("trips", bad)
    lossy = table().to_pandas().assign(embedding=lambda d: d.embedding.map(lambda v: [float(x) for x in v]))
    with pytest.raises(qv.ValidationError, match="column `embedding`.*without loss"):
        store.push("trips", lossy)
    with pytest.raises(qv.ValidationError, match="ttl"):
        qv.FeatureStore(store.repo_path).apply([qv.FeatureView(name="v", entities=["rider"], schema=[qv.Field("x", qv.Int64)],
                                                               ttl=timedelta(seconds=1.5))])
    with pytest.raises(qv.ValidationError, match="unknown entity"):
        qv.FeatureStore(store.repo_path).apply([qv.FeatureView(name="v", entities=["ghost"], schema=[qv.Field("x", qv.Int64)])])
    # An online store nobody listens on.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cfg = os.path.join(store.repo_path, "quiver.yaml")
    text = open(cfg).read()
    start = text.index("online_store:")
    end = text.index("kafka:")
    with open(cfg, "w") as fh:
        fh.write(text[:start] + f"online_store:\n  type: redis\n  url: redis://127.0.0.1:{port}/0\n" + text[end:])
    with pytest.raises(qv.StoreUnavailableError, match=f"127.0.0.1:{port}"):
        store.get_online_features(["trips:fare"], [{"rider_id": 1}])


def test_long_calls_release_the_gil_and_ctrl_c_cancels():
    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.01)

    t = threading.Thread(target=count)
    t.start()
    qv._quiver._sleep(0.5)
    stop.set()
    t.join()
    assert len(ticks) > 10, "the GIL was held during the Rust call"
    # Python's own handler, even when started with SIGINT ignored (a background job).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            qv._quiver._sleep(30)
        assert time.monotonic() - began < 5
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_stub_matches_the_extension():
    config = os.path.join(os.path.dirname(__file__), "..", "mypy.ini")
    res = subprocess.run(["python", "-m", "mypy.stubtest", "quiver._quiver", "--mypy-config-file", config],
                         capture_output=True, text=True, env={**os.environ, "PATH": os.path.dirname(os.sys.executable) + ":" + os.environ["PATH"]})
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_guides_python_quick_start_prints_what_it_says(tmp_path, monkeypatch, capsys):
    guide = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")).read()
    section = guide[guide.index("## Quick start"):]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    new_repo(tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/python.md", "exec"), {})
    out = capsys.readouterr().out
    assert "trips__fare" in out and "12.5" in out, out
    assert "{'rider_id': [1], 'fare': [12.5]}" in out, out


def test_to_torch_on_cuda_without_a_gpu_is_a_clear_error(store):
    job = store.get_historical_features(entity_df=spine(), features=["trips:fare"])
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        pytest.skip("a CUDA device is present")
    with pytest.raises(qv.ValidationError, match=r"to_torch\(device='cuda'\)"):
        job.to_torch(device="cuda")


def test_the_join_engine_can_be_chosen(store):
    """Python goes through the same operations layer as the CLI: the engine is a choice."""
    auto = store.get_historical_features(entity_df=spine(), features=["trips:fare"]).to_arrow()
    cpu = store.get_historical_features(entity_df=spine(), features=["trips:fare"], engine="cpu").to_arrow()
    assert cpu.equals(auto)
    with pytest.raises(qv.ValidationError, match="engine `bogus`"):
        store.get_historical_features(entity_df=spine(), features=["trips:fare"], engine="bogus")
    if not os.path.exists("/dev/nvidia0"):
        with pytest.raises(qv.QuiverError, match="--engine gpu"):
            store.get_historical_features(entity_df=spine(), features=["trips:fare"], engine="gpu")


def test_tables_cross_through_the_arrow_pycapsule_interface(store):
    """Tables go into Rust and come back through `__arrow_c_stream__`: any object that
    offers a stream is taken (here a polars frame, unconverted), a result stream reads
    once, and what is not a table is refused by name."""
    from quiver import _quiver
    pl = pytest.importorskip("polars")
    rows, _, _ = _quiver.ingest(store.repo_path, "trips", pl.from_arrow(table()))
    assert rows == table().num_rows
    stream = _quiver.get_historical_features(store.repo_path, spine(), ["trips:fare"])
    joined = pa.table(stream)
    assert joined.num_rows == spine().num_rows and "trips__fare" in joined.column_names
    with pytest.raises(qv.QuiverError, match="already read"):
        pa.table(stream)
    with pytest.raises(qv.ValidationError, match="entity_df: not an Arrow table"):
        _quiver.get_historical_features(store.repo_path, {"rider_id": [1]}, ["trips:fare"])


def test_aggregations_from_python_equal_yaml_and_serve_offline_and_online(tmp_path):
    yaml = """entities:
  - {name: rider, join_keys: [{name: rider_id, dtype: int64}]}
feature_views:
  - name: rides
    entities: [rider]
    features: [{name: fare, dtype: float64}, {name: city, dtype: string}]
    aggregations:
      - {name: fare_sum_1h, function: sum, column: fare, window: 1h}
      - {name: cities, function: last_k, k: 2, column: city, window: 1d, hop: 1h}
"""
    a = new_repo(tmp_path / "a" / "repo")
    (a / "features.yaml").write_text(yaml)
    cli(a, "apply")
    b = new_repo(tmp_path / "b" / "repo")
    rider = qv.Entity(name="rider", join_keys=[qv.Field(name="rider_id", dtype=qv.Int64)])
    rides = qv.FeatureView(
        name="rides", entities=[rider], schema=[qv.Field(name="fare", dtype=qv.Float64), qv.Field(name="city", dtype=qv.String)],
        aggregations=[qv.Aggregation(name="fare_sum_1h", function="sum", column="fare", time_window=timedelta(hours=1)),
                      qv.Aggregation(name="cities", function="last_k", k=2, column="city", window=timedelta(days=1),
                                     hop=timedelta(hours=1))])
    store = qv.FeatureStore(str(b))
    store.apply([rider, rides])
    reg = lambda p: json.loads((p / "registry.json").read_text())  # noqa: E731
    assert reg(a)["definitions"] == reg(b)["definitions"]
    now = datetime.now(timezone.utc).replace(microsecond=0)
    events = pa.table({"rider_id": pa.array([1, 1, 1, 2], pa.int64()),
                       "event_timestamp": pa.array([now - timedelta(minutes=m) for m in (5, 30, 90, 10)], pa.timestamp("us", tz="UTC")),
                       "fare": pa.array([1.5, 2.0, 4.0, None], pa.float64()), "city": ["a", "b", "c", "z"]})
    store.ingest("rides", events)
    spine = pa.table({"rider_id": pa.array([1, 2, 3], pa.int64()), "event_timestamp": pa.array([now] * 3, pa.timestamp("us", tz="UTC"))})
    got = store.get_historical_features(entity_df=spine, features=["rides:fare_sum_1h", "rides:cities"]).to_arrow()
    assert got.column("rides__fare_sum_1h").to_pylist() == [3.5, None, None]
    assert got.column("rides__cities").to_pylist() == [["a", "b"], ["z"], []]
    store.materialize(now - timedelta(days=2), now)
    online = store.get_online_features(["rides:fare_sum_1h", "rides:cities"], [{"rider_id": 1}, {"rider_id": 3}]).to_dict()
    assert online["fare_sum_1h"] == [3.5, None] and online["cities"] == [["a", "b"], []]
    with pytest.raises(qv.ValidationError, match="aggregation `bad`: window 1h is not a multiple of its hop 7m"):
        store.apply([rider, qv.FeatureView(name="rides", entities=[rider], schema=[qv.Field(name="fare", dtype=qv.Float64)],
                                           aggregations=[qv.Aggregation(name="bad", function="sum", column="fare",
                                                                        window=timedelta(hours=1), hop=timedelta(minutes=7))])])
    with pytest.raises(qv.ValidationError, match="give window or time_window"):
        qv.Aggregation(name="x", function="count", column="fare", window=timedelta(hours=1), time_window=timedelta(hours=1))


def test_get_historical_features_on_a_cluster_equals_the_local_join(store, tmp_path):
    """A `quiver cluster` scheduler and executor as processes; cluster= joins on them."""
    import socket
    import time

    # Three distinct ports: the sockets are all held until each is chosen.
    held = [socket.socket() for _ in range(3)]
    for s in held:
        s.bind(("127.0.0.1", 0))
    port, flight, grpc = [s.getsockname()[1] for s in held]
    for s in held:
        s.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    logs = open(tmp_path / "cluster.log", "w")
    procs = [subprocess.Popen([QUIVER, "cluster", "scheduler", "--port", str(port)], stdout=logs, stderr=logs, env=env)]
    try:
        began = time.time()
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.time() - began < 60, "the scheduler did not start"
            time.sleep(0.1)
        procs.append(subprocess.Popen([QUIVER, "cluster", "executor", "--scheduler", f"127.0.0.1:{port}",
                                       "--port", str(flight), "--grpc-port", str(grpc),
                                       "--work-dir", str(tmp_path)], stdout=logs, stderr=logs, env=env))
        features = ["trips:fare", "trips:city", "trips:embedding"]
        local = store.get_historical_features(entity_df=spine(), features=features).to_arrow()
        remote = None
        began = time.time()
        while remote is None:
            try:
                remote = store.get_historical_features(entity_df=spine(), features=features,
                                                       cluster=f"df://127.0.0.1:{port}").to_arrow()
            except qv.QuiverError as e:  # until the executor has registered
                assert time.time() - began < 60, f"{e}\n{open(tmp_path / 'cluster.log').read()}"
                time.sleep(0.5)
        assert remote.equals(local), (remote, local)
        assert local.column("trips__fare").null_count < local.num_rows  # something joined
        with pytest.raises(qv.ValidationError, match="not a df:// address"):
            store.get_historical_features(entity_df=spine(), features=features, cluster="http://127.0.0.1:1")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def test_ingesting_the_same_table_twice_appends_it_once(store):
    """Idempotent by content: the fixture's table again (a retried call) appends nothing,
    warns, and returns the version holding it; allow_duplicate=True appends it."""
    with pytest.warns(qv.DuplicateIngestWarning, match="table version 1 holds the same content"):
        assert store.ingest("trips", table()) == 1
    assert store.ingest("trips", table(), allow_duplicate=True) == 2
    with pytest.warns(qv.DuplicateIngestWarning, match="table version 2 holds the same content"):
        assert store.ingest("trips", table()) == 2


def _rides(*extra):
    rider = qv.Entity(name="rider", join_keys=[qv.Field(name="rider_id", dtype=qv.Int64)])
    aggregations = [qv.Aggregation(name="fare_sum_1h", function="sum", column="fare", window=timedelta(hours=1)), *extra]
    rides = qv.FeatureView(name="rides", entities=[rider], schema=[qv.Field(name="fare", dtype=qv.Float64)],
                           aggregations=aggregations)
    return rider, rides


def test_an_aggregation_added_from_python_keeps_the_served_ones_and_answers_typed(tmp_path):
    """Adding an aggregation to a served event log never blanks the ones served (the new
    one is NOT_FOUND until materialized), and to_arrow() types a column whose every
    value is missing by its definition, not as null."""
    store = qv.FeatureStore(str(new_repo(tmp_path / "repo")))
    store.apply(list(_rides()))
    now = datetime.now(timezone.utc).replace(microsecond=0)
    store.ingest("rides", pa.table({"rider_id": pa.array([1, 1], pa.int64()),
                                    "event_timestamp": pa.array([now - timedelta(minutes=m) for m in (5, 30)], pa.timestamp("us", tz="UTC")),
                                    "fare": pa.array([1.5, 2.0], pa.float64())}))
    store.materialize(now - timedelta(days=1), now)
    store.apply(list(_rides(qv.Aggregation(name="fare_max_1d", function="max", column="fare", window=timedelta(days=1)))))
    resp = store.get_online_features(["rides:fare_sum_1h", "rides:fare_max_1d"], [{"rider_id": 1}])
    assert resp.to_dict() == {"rider_id": [1], "fare_sum_1h": [3.5], "fare_max_1d": [None]}
    assert resp.statuses["fare_sum_1h"] == ["PRESENT"] and resp.statuses["fare_max_1d"] == ["NOT_FOUND"]
    assert resp.to_arrow().schema == pa.schema([("rider_id", pa.int64()), ("fare_sum_1h", pa.float64()), ("fare_max_1d", pa.float64())])
    store.materialize(now - timedelta(days=1), now)
    assert store.get_online_features(["rides:fare_max_1d"], [{"rider_id": 1}]).to_dict()["fare_max_1d"] == [2.0]


def test_a_python_definition_error_names_the_view_and_aggregation(tmp_path):
    store = qv.FeatureStore(str(new_repo(tmp_path / "repo")))
    with pytest.raises(qv.ValidationError) as err:
        store.apply(list(_rides(qv.Aggregation(name="fare_summ", function="summ", column="fare", window=timedelta(days=1)))))
    message = str(err.value)
    assert message.startswith("feature view `rides`, aggregation `fare_summ`: unknown function `summ`"), message
    assert " at line " not in message, message


def test_the_cli_keeps_what_python_defined(tmp_path):
    """A repository defined in Python, then `quiver plan` and `quiver apply` with the
    empty features.yaml: nothing is proposed for removal; `--remove` and Python's
    objects_to_delete remove on purpose."""
    repo = new_repo(tmp_path / "repo")
    store = qv.FeatureStore(str(repo))
    rider, rides = _rides()
    store.apply([rider, rides])
    plan = cli(repo, "plan")
    assert "0 to add, 0 to change, 0 to remove, 2 kept (defined elsewhere)" in plan, plan
    assert "= feature_view rides (kept: defined from python; `--remove feature_view/rides` removes it)" in plan, plan
    assert "no changes" in cli(repo, "apply")
    assert [v.name for v in store.list_feature_views()] == ["rides"]
    out = cli(repo, "apply", "--remove", "feature_view/rides")
    assert "- feature_view rides" in out and "0 to add, 0 to change, 1 to remove, 1 kept" in out, out
    assert store.list_feature_views() == []
    store.apply([rides])
    store.apply([], objects_to_delete=[rides])
    assert store.list_feature_views() == []


AUDIT_VIEW = ("  - name: audit\n    entities: [driver]\n    online: false\n    source: {timestamp_field: event_timestamp}\n"
              "    features: [{name: note, dtype: string}]\n\n")
SCORING_VIEW = ("on_demand_views:\n  - name: scoring\n    inputs: [driver_hourly]\n"
                "    request: [{name: amount, dtype: float64}, {name: city, dtype: string}]\n    features:\n"
                "      - {name: conv_x_acc, dtype: float64, expr: 'driver_hourly.conv_rate * driver_hourly.acc_rate'}\n"
                "      - {name: per_trip, dtype: int64, expr: 'CAST(amount AS BIGINT) / driver_hourly.avg_daily_trips'}\n"
                "      - {name: shout, dtype: string, expr: 'upper(city)'}\n")


def test_one_table_of_lookups_is_answered_as_the_cli_and_server_answer_it(tmp_path):
    """tests/it/lookup_cases.json, as tests/it/cli.rs drives it through the CLI and the server:
    the same requests answered, the others refused with the same message and the
    exception of the error's kind."""
    table = json.load(open(os.path.join(os.path.dirname(__file__), "..", "..", "tests", "it", "lookup_cases.json")))
    res = subprocess.run([QUIVER, "init", str(tmp_path / "demo"), "--demo"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    repo = tmp_path / "demo"
    yaml = (repo / "features.yaml").read_text()
    (repo / "features.yaml").write_text(yaml.replace("\nfeature_services:", "\n" + AUDIT_VIEW + "feature_services:", 1) + SCORING_VIEW)
    config = (repo / "quiver.yaml").read_text()
    (repo / "quiver.yaml").write_text(config.replace("# max_cells: 1000000", "max_cells: 8", 1))
    cli(repo, "apply")
    cli(repo, "ingest", "driver_hourly", str(repo / "sample_data" / "driver_hourly.parquet"))
    cli(repo, "materialize", "2000-01-01T00:00:00Z", "now")
    store = qv.FeatureStore(str(repo))
    exceptions = {"invalid": qv.ValidationError, "not_found": qv.NotFoundError}
    for case in table["cases"]:
        given = {**case["entities"], **case.get("request", {})}  # request fields beside the join keys
        rows = [dict(zip(given, values)) for values in zip(*given.values())]
        features = (lambda c=case: c["features"]) if "features" in case else (lambda c=case: store.get_feature_service(c["service"]))
        refused = case.get("refused")
        if refused is None:
            resp = store.get_online_features(features(), rows, full_feature_names=True)
            assert len(resp.statuses) == len(case["entities"]) + (len(case["features"]) if "features" in case else 8), case["name"]
            continue
        with pytest.raises(exceptions[refused["kind"]]) as err:
            store.get_online_features(features(), rows, full_feature_names=True)
        assert refused["message"] in str(err.value), (case["name"], str(err.value))


def test_on_demand_features_online_equal_historical(store):
    """On-demand features from Python: request fields in `entity_rows` online and as
    `entity_df` columns offline give the same values (the oracle is a plain-Python
    computation over the rows we wrote); a missing request field is a ValidationError."""
    rider, trips, svc = definitions()
    scoring = qv.OnDemandFeatureView(
        name="scoring", inputs=[trips], request=[qv.Field("amount", qv.Float64)],
        features=[qv.Field("fare_ratio", qv.Float64, expr="amount / NULLIF(trips.fare, 0)"),
                  qv.Field("shout", qv.String, expr="concat(upper(trips.city), '!')")])
    store.apply([rider, trips, svc, scoring])
    store.materialize(NOW - timedelta(days=1), NOW + timedelta(seconds=1))
    asked = [{"rider_id": r, "amount": a} for r, a in ((1, 10.0), (2, -3.5), (3, 0.0), (7, 1.0))]
    refs = ["scoring:fare_ratio", "scoring:shout"]
    online = store.get_online_features(refs, asked, full_feature_names=True).to_dict()
    spine = pa.table({"rider_id": pa.array([a["rider_id"] for a in asked], pa.int64()),
                      "event_timestamp": pa.array([datetime.now(timezone.utc)] * len(asked), pa.timestamp("us", tz="UTC")),
                      "amount": pa.array([a["amount"] for a in asked], pa.float64())})
    offline = store.get_historical_features(spine, refs).to_arrow().to_pydict()
    # The oracle: each rider's latest row (by event time, then created time) within the TTL.
    latest = {}
    for row in rows():
        key = (row["event_timestamp"], row["created_timestamp"])
        if row["rider_id"] not in latest or key > (latest[row["rider_id"]]["event_timestamp"], latest[row["rider_id"]]["created_timestamp"]):
            latest[row["rider_id"]] = row
    for i, a in enumerate(asked):
        row = latest.get(a["rider_id"])
        live = row is not None and datetime.now(timezone.utc) - row["event_timestamp"] <= timedelta(minutes=90)
        ratio = a["amount"] / row["fare"] if live else None
        shout = (row["city"].upper() if live else "") + "!"  # concat skips nulls (as in Postgres)
        assert online["scoring__fare_ratio"][i] == ratio == offline["scoring__fare_ratio"][i], (a, online, offline)
        assert online["scoring__shout"][i] == shout == offline["scoring__shout"][i], (a, online, offline)
    assert list(offline) == ["rider_id", "event_timestamp", "amount", "scoring__fare_ratio", "scoring__shout"]
    with pytest.raises(qv.ValidationError, match="missing request field `amount`"):
        store.get_online_features(refs, [{"rider_id": 1}])
    with pytest.raises(qv.ValidationError, match="missing column `amount`: a request field of on-demand view `scoring`"):
        store.get_historical_features(spine.drop(["amount"]), refs).to_arrow()


def test_python_reads_like_python(store, tmp_path):
    """Definitions compare and print by value, come back from the registry as objects,
    wrong types are TypeErrors, bad values ValidationErrors (also ValueErrors)."""
    rider, trips, ranker = definitions()
    again = list(definitions())
    assert again[1] == trips and again[2] == ranker and again[0] == rider
    assert "FeatureView(name='trips'" in repr(trips) and "ttl=datetime.timedelta" in repr(trips), repr(trips)
    assert repr(qv.Field("fare", qv.Float64)) == "Field(name='fare', dtype=qv.Float64)"
    assert store.get_feature_view("trips") == trips
    assert store.get_feature_service("ranker") == ranker
    assert store.list_entities() == [rider] and store.get_entity("rider") == rider
    assert store.list_feature_services() == [ranker]
    with pytest.raises(qv.NotFoundError, match=r"unknown feature view `nope` \(known: trips\)"):
        store.get_feature_view("nope")
    with pytest.raises(qv.NotFoundError, match=r"unknown feature service `nope` \(known: ranker\)"):
        store.get_feature_service("nope")
    assert issubclass(qv.ValidationError, ValueError)
    with pytest.raises(ValueError, match="unknown entity"):
        store.apply([qv.FeatureView(name="v", entities=["ghost"], schema=[qv.Field("x", qv.Int64)])])
    for bad in (lambda: qv.Field("x", "float64"),
                lambda: qv.FeatureView(name="v", entities=["rider"], schema=[qv.Field("x", qv.Int64)], ttl=3600),
                lambda: qv.FeatureService(name="s", features="trips:fare"),
                lambda: store.apply(["trips"]),
                lambda: store.ingest("trips", {"rider_id": [1]}),
                lambda: store.get_online_features("trips:fare", [{"rider_id": 1}]),
                lambda: store.get_online_features(["trips:fare"], {"rider_id": [1]}),
                lambda: store.get_online_features(["trips:fare"], [{"rider_id": object()}]),
                lambda: store.materialize("2024-01-01", NOW)):
        with pytest.raises(TypeError):
            bad()
    # A number of the wrong kind is checked against the definitions (a join key here; a
    # request field of an on-demand feature would take it).
    with pytest.raises(qv.ValidationError, match="entity `rider_id`: 1.5 is not an integer or a string"):
        store.get_online_features(["trips:fare"], [{"rider_id": 1.5}])
    # plan says what apply would do, and writes nothing.
    before = (tmp_path / "repo" / "registry.json").read_text()
    extra = qv.FeatureService(name="fares", features=["trips:fare"])
    plan = store.plan([extra])
    assert "+ feature_service fares" in plan and "1 to add" in plan, plan
    assert store.plan([ranker]) == ""
    assert (tmp_path / "repo" / "registry.json").read_text() == before
    # to_df is Feast's to_pandas.
    job = store.get_historical_features(spine(), ["trips:fare"])
    assert job.to_df().equals(job.to_pandas())


def test_materialize_views_export_and_verify_from_python(store, tmp_path):
    reports = store.materialize(NOW - timedelta(days=1), NOW, feature_views=["trips"])
    assert [r[0] for r in reports] == ["trips"] and reports[0][2] > 0, reports
    with pytest.raises(qv.NotFoundError, match="unknown feature view `nope`"):
        store.materialize(NOW - timedelta(days=1), NOW, feature_views=["nope"])
    spine_path = tmp_path / "spine.parquet"
    pq.write_table(spine(), spine_path)
    manifest = store.export("ranker", str(spine_path), str(tmp_path / "train"), shard_rows=10)
    assert manifest["rows"] == spine().num_rows and len(manifest["shards"]) == 2, manifest
    again = store.get_historical_features(spine(), feature_service="ranker").to_arrow()
    exported = qv.TrainingSet(str(tmp_path / "train")).to_arrow()
    assert exported.column("trips__fare").to_pylist() == again.column("trips__fare").to_pylist()
    reports = store.verify(sample=50)
    by_feature = {r["feature"]: r for r in reports}
    assert set(by_feature) == {"trips:fare", "trips:city", "trips:embedding"}, by_feature
    assert all(r["mismatches"] == 0 and r["compared"] > 0 for r in reports), reports


def test_on_demand_views_from_python_equal_yaml(tmp_path):
    """An on-demand view defined in Python gives YAML's registry, reads back equal, and
    a bad expression is refused naming the view, the feature and the expression."""
    on_demand = """on_demand_views:
  - name: scoring
    inputs: [trips]
    request: [{name: amount, dtype: float64}]
    features:
      - {name: fare_ratio, dtype: float64, expr: "amount / NULLIF(trips.fare, 0)"}
      - {name: home, dtype: bool, expr: "lower(trips.city) = 'c1'"}
"""
    a = new_repo(tmp_path / "a" / "repo")
    (a / "features.yaml").write_text(YAML + on_demand)
    cli(a, "apply")
    b = new_repo(tmp_path / "b" / "repo")
    rider, trips, svc = definitions()
    scoring = qv.OnDemandFeatureView(
        name="scoring", inputs=[trips], request=[qv.Field("amount", qv.Float64)],
        features=[qv.Field("fare_ratio", qv.Float64, expr="amount / NULLIF(trips.fare, 0)"),
                  qv.Field("home", qv.Bool, expr="lower(trips.city) = 'c1'")])
    s = qv.FeatureStore(str(b))
    assert "+ on_demand_view scoring" in s.plan([rider, trips, svc, scoring])
    s.apply([rider, trips, svc, scoring])
    reg = lambda p: json.loads((p / "registry.json").read_text())  # noqa: E731
    assert reg(a)["definitions"] == reg(b)["definitions"]
    assert s.get_on_demand_feature_view("scoring") == scoring
    assert [v.name for v in s.list_on_demand_feature_views()] == ["scoring"]
    with pytest.raises(qv.NotFoundError, match="unknown on-demand view `nope` \\(known: scoring\\)"):
        s.get_on_demand_feature_view("nope")

    bad = qv.OnDemandFeatureView(name="scoring", inputs=[trips],
                                 features=[qv.Field("fare_ratio", qv.Float64, expr="trips.fare * trips.cty")])
    with pytest.raises(qv.ValidationError, match="on-demand view `scoring`, feature `fare_ratio`: `trips.fare \\* trips.cty`: unknown name"):
        s.apply([bad])
    # A changed expression is a breaking change: the on-demand view's next version.
    changed = qv.OnDemandFeatureView(name="scoring", inputs=[trips], request=[qv.Field("amount", qv.Float64)],
                                     features=[qv.Field("fare_ratio", qv.Float64, expr="amount / NULLIF(trips.fare, 0.0)"),
                                               qv.Field("home", qv.Bool, expr="lower(trips.city) = 'c1'")])
    assert s.apply([changed]) == 2
    doc = reg(b)["definitions"]
    assert [(v["name"], v.get("version", 1)) for v in doc["on_demand_views"]] == [("scoring", 2)]
    assert [(v["name"], v.get("version", 1)) for v in doc["earlier_versions"]["on_demand_views"]] == [("scoring", 1)]
    with pytest.raises(qv.ValidationError, match="feature `x`: no expr"):
        qv.OnDemandFeatureView(name="o", inputs=["trips"], features=[qv.Field("x", qv.Float64)])
    with pytest.raises(TypeError, match="an input must be FeatureView or OnDemandFeatureView or str"):
        qv.OnDemandFeatureView(name="o", inputs=[3], features=[qv.Field("x", qv.Float64, expr="1")])


def test_write_time_expressions_from_python_push_what_they_compute(tmp_path):
    """A view with write-time expressions defined in Python gives YAML's registry; a
    push of raw rows stores what a plain-Python evaluation of the same rows gives — the
    rows failing the filter dropped and counted, a division by zero null — and the
    online answer and the historical join serve it."""
    shaped = """entities:
  - name: rider
    join_keys: [{name: rider_id, dtype: int64}]
feature_views:
  - name: payments
    entities: [rider]
    source:
      timestamp_field: event_timestamp
      filter: "status = 'ok'"
      raw: [{name: cents, dtype: int64}, {name: status, dtype: string}]
    features:
      - {name: amount, dtype: float64, expr: "CAST(cents AS DOUBLE) / 100"}
      - {name: items, dtype: int64}
      - {name: per_item, dtype: int64, expr: "cents / items"}
"""
    a = new_repo(tmp_path / "a" / "repo")
    (a / "features.yaml").write_text(shaped)
    cli(a, "apply")
    b = new_repo(tmp_path / "b" / "repo")
    rider = qv.Entity(name="rider", join_keys=[qv.Field("rider_id", qv.Int64)])
    payments = qv.FeatureView(
        name="payments", entities=[rider],
        source=qv.DeltaSource(filter="status = 'ok'", raw=[qv.Field("cents", qv.Int64), qv.Field("status", qv.String)]),
        schema=[qv.Field("amount", qv.Float64, expr="CAST(cents AS DOUBLE) / 100"), qv.Field("items", qv.Int64),
                qv.Field("per_item", qv.Int64, expr="cents / items")])
    s = qv.FeatureStore(str(b))
    s.apply([rider, payments])
    reg = lambda p: json.loads((p / "registry.json").read_text())  # noqa: E731
    assert reg(a)["definitions"] == reg(b)["definitions"]
    assert s.get_feature_view("payments") == payments

    raw = []
    for i in range(40):
        raw.append({"rider_id": i % 6, "event_timestamp": NOW - timedelta(minutes=200 - 3 * i),
                    "cents": None if i % 11 == 0 else (i * 37) - 300, "status": ["ok", "ok", "failed", None, "OK"][i % 5],
                    "items": [2, 0, -3, None][i % 4]})
    schema = pa.schema([("rider_id", pa.int64()), ("event_timestamp", pa.timestamp("us", tz="UTC")), ("cents", pa.int64()),
                        ("status", pa.string()), ("items", pa.int64())])

    def computed(r):
        """The plain-Python evaluation: SQL's integer division truncates toward zero."""
        if r["status"] != "ok":
            return None
        cents, items = r["cents"], r["items"]
        per = None if cents is None or items in (None, 0) else int(cents / items)
        return {"amount": None if cents is None else cents / 100, "items": items, "per_item": per}

    kept = [(r, computed(r)) for r in raw if computed(r) is not None]
    # Rows that all fail the filter are not an error: nothing written, the drop counted.
    failed = [r for r in raw if r["status"] != "ok"]
    assert s.ingest("payments", pa.Table.from_pylist(failed, schema=schema)) is None
    out = s.push("payments", pa.Table.from_pylist(failed, schema=schema))
    assert (out["rows"], out["dropped"], out["offline_version"]) == (0, len(failed), None), out
    out = s.push("payments", pa.Table.from_pylist(raw, schema=schema))
    assert out["rows"] == len(kept) and out["dropped"] == len(raw) - len(kept), out
    assert out["uncomputed"] == sum(1 for r, c in kept if r["cents"] is not None and r["items"] == 0), out
    latest = {}
    for r, c in kept:
        latest[r["rider_id"]] = c
    riders = sorted(latest)
    resp = s.get_online_features(features=["payments:amount", "payments:items", "payments:per_item"],
                                 entity_rows=[{"rider_id": r} for r in riders]).to_dict()
    assert resp["amount"] == [latest[r]["amount"] for r in riders]
    assert resp["items"] == [latest[r]["items"] for r in riders]
    assert resp["per_item"] == [latest[r]["per_item"] for r in riders]
    # Offline, the join reads the computed rows as of each spine time.
    times = [NOW - timedelta(minutes=m) for m in (0, 60, 150)]
    spine_rows = [(r, t) for r in range(6) for t in times]
    entity_df = pa.table({"rider_id": pa.array([r for r, _ in spine_rows], pa.int64()),
                          "event_timestamp": pa.array([t for _, t in spine_rows], pa.timestamp("us", tz="UTC"))})
    got = s.get_historical_features(entity_df=entity_df, features=["payments:amount", "payments:per_item"]).to_arrow()
    for k, (r, t) in enumerate(spine_rows):
        asof = [c for row, c in kept if row["rider_id"] == r and row["event_timestamp"] <= t]
        want = asof[-1] if asof else {"amount": None, "per_item": None}
        assert got.column("payments__amount")[k].as_py() == want["amount"], (r, t)
        assert got.column("payments__per_item")[k].as_py() == want["per_item"], (r, t)
    bad = qv.FeatureView(name="payments", entities=[rider],
                         source=qv.DeltaSource(filter="cents", raw=[qv.Field("cents", qv.Int64)]),
                         schema=[qv.Field("amount", qv.Float64, expr="CAST(cents AS DOUBLE) / 100")])
    with pytest.raises(qv.ValidationError, match="feature view `payments`, source filter: `cents`: computes int64, not a boolean"):
        s.apply([bad])


def test_made_spines_equal_the_cli_and_their_oracle(store, tmp_path):
    """entities_at= and rows_of= (docs/export.md#without-a-spine) give what the CLI gives,
    and the entities one is every rider with a row by then (the oracle: the rows here)."""
    at = NOW - timedelta(minutes=100)
    got = store.get_historical_features(entities_at=at, features=["trips:fare"]).to_arrow()
    riders = sorted({r["rider_id"] for r in rows() if r["event_timestamp"] <= at})
    assert got.column("rider_id").to_pylist() == riders
    assert set(got.column("event_timestamp").to_pylist()) == {at}
    cli(store.repo_path, "historical", "--entities-at", at.isoformat(), "--features", "trips:fare",
        "--out", str(tmp_path / "ea.parquet"))
    assert got.equals(pq.read_table(tmp_path / "ea.parquet"))
    # Every trip as a spine row, its own columns kept, a window and a sample.
    window = (NOW - timedelta(minutes=150), NOW - timedelta(minutes=40))
    got = store.get_historical_features(rows_of="trips", between=window, features=["trips:city"]).to_arrow()
    inside = [r for r in rows() if window[0] <= r["event_timestamp"] < window[1]]
    assert got.num_rows == len(inside)
    assert sorted(got.column("fare").to_pylist()) == sorted(r["fare"] for r in inside)
    assert got.column("event_timestamp").to_pylist() == sorted(got.column("event_timestamp").to_pylist())
    cli(store.repo_path, "historical", "--rows-of", "trips", "--between", window[0].isoformat(), window[1].isoformat(),
        "--features", "trips:city", "--out", str(tmp_path / "ro.parquet"))
    assert got.equals(pq.read_table(tmp_path / "ro.parquet"))
    a = store.get_historical_features(rows_of="trips", sample=0.5, seed=4, features=["trips:city"]).to_arrow()
    b = store.get_historical_features(rows_of="trips", sample=0.5, seed=4, features=["trips:city"]).to_arrow()
    assert a.equals(b) and 0 < a.num_rows < len(rows())
    # Times as the CLI takes them: a date, `now`, a duration before now.
    every = store.get_historical_features(rows_of="trips", features=["trips:city"]).to_arrow()
    texts = store.get_historical_features(rows_of="trips", between=("2000-01-01", "now"),
                                          features=["trips:city"]).to_arrow()
    assert texts.equals(every)
    recent = store.get_historical_features(rows_of="trips", between=("100m", "now"), features=["trips:city"]).to_arrow()
    assert recent.num_rows == sum(1 for r in rows() if r["event_timestamp"] >= NOW - timedelta(minutes=100))
    # An export of a made spine records it.
    manifest = store.export("ranker", out=str(tmp_path / "ts"), rows_of="trips", sample=0.5, seed=4)
    assert manifest["spine"]["made"] == {"kind": "rows_of", "view": "trips", "sample": 0.5, "seed": 4}
    assert manifest["rows"] == a.num_rows
    # Refusals, before anything runs.
    for kwargs, words in [
        (dict(entities_at=at, rows_of="trips"), "not both"),
        (dict(entities_at=at.replace(tzinfo=None)), "time zone"),
        (dict(sample=0.5), "go with rows_of"),
        (dict(rows_of="trips", sample=3), "--sample must be"),
        (dict(rows_of="trips", between=(NOW,)), "two times"),
        (dict(rows_of="nope"), "unknown feature view `nope`"),
        (dict(rows_of="trips", between=("30x", "now")), "between `30x`: expected an RFC 3339 time"),
        (dict(entities_at="yesterday-ish"), "entities_at `yesterday-ish`"),
        (dict(), "give exactly one of entity_df"),
    ]:
        with pytest.raises((qv.ValidationError, qv.NotFoundError), match=words):
            store.get_historical_features(features=["trips:fare"], **kwargs)
    with pytest.raises(qv.ValidationError, match="give exactly one of entity_df"):
        store.get_historical_features(spine(), features=["trips:fare"], entities_at=at)


def test_nan_and_infinities_are_served_as_the_floats_the_training_set_holds(store):
    """NaN and the infinities are values: pushed as floats, served PRESENT (the server
    answers them "NaN", "Infinity", "-Infinity") and read back as floats by the client,
    in scalars and list items, equal to what the offline join gives; a string feature's
    "NaN" stays a string."""
    import math
    t = NOW - timedelta(minutes=1)
    ts = pa.timestamp("us", tz="UTC")
    nan, inf = float("nan"), float("inf")
    fresh = pa.table({
        "rider_id": pa.array([11, 12, 13], pa.int64()),
        "event_timestamp": pa.array([t] * 3, ts), "created_timestamp": pa.array([t] * 3, ts),
        "fare": pa.array([nan, inf, -inf], pa.float64()),
        "city": pa.array(["NaN", "Infinity", "x"], pa.string()),
        "embedding": pa.array([[nan, 1.5], [-inf, inf], [0.25]], pa.list_(pa.float32())),
    })
    assert store.push("trips", fresh)["online_written"] == 3
    resp = store.get_online_features(["trips:fare", "trips:city", "trips:embedding"], [{"rider_id": r} for r in (11, 12, 13)])
    got = resp.to_dict()
    assert all(isinstance(v, float) for v in got["fare"]), got
    assert math.isnan(got["fare"][0]) and got["fare"][1:] == [inf, -inf], got
    assert resp.statuses["fare"] == ["PRESENT"] * 3 and resp.statuses["embedding"] == ["PRESENT"] * 3
    assert got["city"] == ["NaN", "Infinity", "x"]
    assert math.isnan(got["embedding"][0][0]) and got["embedding"][0][1] == 1.5, got
    assert got["embedding"][1:] == [[-inf, inf], [0.25]], got
    # The typed table holds the same floats, none of them null.
    fare = resp.to_arrow().column("fare")
    assert fare.null_count == 0 and math.isnan(fare[0].as_py()) and fare.to_pylist()[1:] == [inf, -inf]
    # What a training set holds for the same rows.
    spine_ = pa.table({"rider_id": pa.array([11, 12, 13], pa.int64()), "event_timestamp": pa.array([NOW] * 3, ts)})
    offline = store.get_historical_features(entity_df=spine_, features=["trips:fare"]).to_arrow().column("trips__fare").to_pylist()
    assert math.isnan(offline[0]) and offline[1:] == got["fare"][1:]


def test_entity_rows_take_the_join_keys_and_the_request_fields_read(store):
    """Issue 53, one rule with the server and the CLI (docs/online.md#request-fields):
    only the request fields the features asked for read are needed, any other name is
    a ValidationError naming the names allowed, and `None` is a null request value."""
    rider, trips, svc = definitions()
    scoring = qv.OnDemandFeatureView(
        name="scoring", inputs=[trips], request=[qv.Field("amount", qv.Float64), qv.Field("channel", qv.String)],
        features=[qv.Field("fare_ratio", qv.Float64, expr="amount / NULLIF(trips.fare, 0)"),
                  qv.Field("channel_norm", qv.String, expr="lower(channel)")])
    store.apply([rider, trips, svc, scoring])
    store.materialize(NOW - timedelta(days=1), NOW + timedelta(seconds=1))
    # Before: `channel_norm` demanded `amount` too.
    got = store.get_online_features(["scoring:channel_norm"], [{"rider_id": 1, "channel": "WEB"}]).to_dict()
    assert got == {"rider_id": [1], "channel_norm": ["web"]}, got
    # A null request value is read as NULL.
    resp = store.get_online_features(["scoring:fare_ratio"], [{"rider_id": 1, "amount": None}, {"rider_id": 1, "amount": 2.0}])
    assert resp.to_dict()["fare_ratio"][0] is None and resp.statuses["fare_ratio"] == ["NULL_VALUE", "PRESENT"], resp
    # Before: a declared field not read, or an unknown int, was taken without a word; an
    # unknown float was refused as an entity.
    for name, value in (("amount", 2.0), ("other", 5), ("other", 1.5)):
        with pytest.raises(qv.ValidationError) as err:
            store.get_online_features(["scoring:channel_norm"], [{"rider_id": 1, "channel": "x", name: value}])
        want = f"`{name}` is neither a join key nor a request field of the features asked for (allowed: `rider_id`, `channel`)"
        assert want in str(err.value), str(err.value)
