"""Reading `quiver export` output from Python: TrainingSet and its shard plan."""
import itertools
import os
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import quiver as qv

QUIVER = os.environ.get("QUIVER_BIN", os.path.expanduser("~/.cache/quiver/target/debug/quiver"))


def cli(cwd, *args):
    res = subprocess.run([QUIVER, *args], cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    cli(tmp, "init", "demo", "--demo")
    repo = tmp / "demo"
    cli(repo, "apply")
    for v in ("driver_hourly", "customer_profile", "driver_customer", "customer_rides"):
        cli(repo, "ingest", v, f"sample_data/{v}.parquet")
    cli(repo, "export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "ts", "--shard-rows", "37")
    cli(repo, "historical", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "whole.parquet")
    return repo


def test_training_set_reads_what_historical_gives(exported):
    ts = qv.TrainingSet(str(exported / "ts"))
    ts.verify()
    whole = pq.read_table(exported / "whole.parquet")
    assert ts.num_rows == whole.num_rows
    assert ts.to_arrow().equals(whole)
    assert ts.to_pandas().shape == (whole.num_rows, whole.num_columns)
    assert ts.to_polars().height == whole.num_rows
    assert len(ts.id) == 32


def test_every_row_once_across_ranks_and_workers(exported):
    ts = qv.TrainingSet(str(exported / "ts"))
    whole = pq.read_table(exported / "whole.parquet")
    # The spine's (driver, customer, time) identifies a row.
    key = lambda t: list(zip(t.column("driver_id").to_pylist(), t.column("customer_id").to_pylist(),  # noqa: E731
                             t.column("event_timestamp").to_pylist()))
    want = sorted(key(whole))
    for world, workers in ((1, 1), (2, 1), (3, 2), (4, 3)):
        for seed in (0, 7):
            seen = []
            orders = []
            for rank, worker in itertools.product(range(world), range(workers)):
                batches = list(ts.iter_batches(10, None, True, seed, rank, world, worker, workers))
                seen += key(pa.Table.from_batches(batches)) if batches else []
                orders.append(qv.shard_plan(len(ts.files), seed, True, rank, world, worker, workers))
            assert sorted(seen) == want, (world, workers, seed)
            # Disjoint shard sets; the same seed gives the same plan again.
            flat = [s for o in orders for s in o]
            assert sorted(flat) == list(range(len(ts.files)))
            assert qv.shard_plan(len(ts.files), seed, True, 0, world, 0, workers) == orders[0]
    assert qv.shard_plan(20, 1, True, 0, 1) != qv.shard_plan(20, 2, True, 0, 1), "the seed changes the order"
    assert qv.shard_plan(5, 1, False, 0, 1) == [0, 1, 2, 3, 4]


def test_training_set_errors(exported, tmp_path):
    with pytest.raises(qv.NotFoundError, match="manifest.json"):
        qv.TrainingSet(str(tmp_path))
    with pytest.raises(qv.ValidationError, match="rank 2"):
        qv.shard_plan(4, 0, False, 2, 2)
    # A damaged shard fails verification.
    copy = tmp_path / "ts"
    cli(exported, "export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", str(copy), "--shard-rows", "37")
    with open(copy / "part-00001.parquet", "r+b") as fh:
        fh.seek(10)
        fh.write(b"\0\0\0")
    with pytest.raises(qv.ValidationError, match="SHA-256"):
        qv.TrainingSet(str(copy)).verify()


def _torch():
    """PyTorch, which `./run test` installs (QUIVER_REQUIRE_TORCH=1 there); elsewhere the
    torch tests skip with a message."""
    try:
        import torch
    except ImportError:
        if os.environ.get("QUIVER_REQUIRE_TORCH"):
            raise
        pytest.skip("PyTorch is not installed (./run test installs it)")
    return torch


def _rows(columns, n):
    """Rows as sortable tuples: a null and a NaN are the same missing value (a float
    tensor holds NaN where Arrow has null), embeddings are tuples."""
    def cell(v):
        if isinstance(v, list):
            return ("list", tuple(cell(x) for x in v))
        if v is None or (isinstance(v, float) and v != v):
            return ("missing", 0)
        return ("value", v)
    return [tuple(cell(columns[c][i]) for c in sorted(columns)) for i in range(n)]


def test_torch_loader_yields_every_row_once_across_ranks_and_workers(exported):
    torch = _torch()
    from torch.utils.data import DataLoader
    ts = qv.TrainingSet(str(exported / "ts"))
    whole = pq.read_table(exported / "whole.parquet")
    numeric = [n for n in whole.column_names if n not in ("customer_id", "event_timestamp")]
    want = sorted(_rows({c: whole.column(c).to_pylist() for c in numeric}, whole.num_rows))
    for world, workers in ((1, 0), (2, 2), (3, 1)):
        seen = []
        for rank in range(world):
            ds = ts.to_torch(batch_size=16, shuffle_shards=True, seed=5, rank=rank, world_size=world)
            for batch in DataLoader(ds, batch_size=None, num_workers=workers):
                assert list(batch) == numeric, list(batch)
                assert all(len(t) <= 16 for t in batch.values())
                seen += _rows({c: batch[c].tolist() for c in numeric}, len(batch["driver_id"]))
        assert sorted(seen) == want, (world, workers)


def test_torch_tensors_hold_the_tables_values_and_types(exported):
    torch = _torch()
    ts = qv.TrainingSet(str(exported / "ts"))
    whole = pq.read_table(exported / "whole.parquet")
    first = next(iter(ts.to_torch(batch_size=37)))  # the first shard, whole
    table = whole.slice(0, 37)
    assert first["driver_id"].dtype == torch.int64 and first["accepted"].dtype == torch.bool
    assert first["driver_hourly__conv_rate"].dtype == torch.float64
    assert first["customer_profile__embedding"].dtype == torch.float32
    assert tuple(first["customer_profile__embedding"].shape) == (37, 4)
    for name, tensor in first.items():
        want = table.column(name).to_pylist()
        got = tensor.tolist()
        assert _rows({"x": got}, len(got)) == _rows({"x": want}, len(want)), name
    # Strings and timestamps are left out; `columns` chooses.
    assert "customer_id" not in first and "event_timestamp" not in first
    only = next(iter(ts.to_torch(batch_size=8, columns=["accepted", "driver_id"])))
    assert sorted(only) == ["accepted", "driver_id"] and len(only["accepted"]) == 8


def test_job_to_torch_on_cpu_matches_the_table(exported):
    torch = _torch()
    store = qv.FeatureStore(str(exported))
    spine = pq.read_table(exported / "sample_data" / "spine.parquet")
    job = store.get_historical_features(entity_df=spine, feature_service="ranker_v1")
    table = job.to_arrow()
    tensors = job.to_torch(device="cpu")
    assert sorted(tensors) == sorted(n for n in table.column_names if n not in ("customer_id", "event_timestamp"))
    for name, tensor in tensors.items():
        got, want = tensor.tolist(), table.column(name).to_pylist()
        # An int64 feature with nulls arrives as float64 with NaN (`_rows` equates them).
        assert _rows({"x": got}, len(got)) == _rows({"x": want}, len(want)), name
    if not torch.cuda.is_available():
        with pytest.raises(qv.ValidationError, match="no CUDA device"):
            job.to_torch(device="cuda")


def test_the_guides_torch_loop_runs(exported, tmp_path, monkeypatch, capsys):
    _torch()
    guide = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "export.md")).read()
    block = guide.split("```py\n", 1)[1].split("```", 1)[0]
    cli(exported, "export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet",
        "--out", str(tmp_path / "train_v1"), "--shard-rows", "100")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/export.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "epoch 0: 500 rows" in out and "epoch 1: 500 rows" in out, out


def test_to_tensors_types_nulls_and_packing():
    torch = _torch()
    table = pa.table({
        "id": pa.array([1, 2, 3], pa.int64()),
        "maybe": pa.array([1, None, 3], pa.int64()),
        "flag": pa.array([True, False, True]),
        "flag_or_null": pa.array([True, None, False]),
        "x": pa.array([0.5, None, 2.0], pa.float32()),
        "emb": pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32())),
        "ragged": pa.array([[1.0], [], [2.0, 3.0]], pa.list_(pa.float64())),
        "empty": pa.array([[], [], []], pa.list_(pa.float64())),
        "name": pa.array(["a", "b", "c"]),
    })
    for pack in (False, True):
        t = qv.to_tensors(table, torch, pack=pack)
        assert list(t) == ["id", "maybe", "flag", "flag_or_null", "x", "emb"], (pack, list(t))
        assert t["id"].dtype == torch.int64 and t["id"].tolist() == [1, 2, 3]
        assert t["maybe"].dtype == torch.float64 and _rows({"m": t["maybe"].tolist()}, 3) == _rows({"m": [1, None, 3]}, 3)
        assert t["flag"].dtype == torch.bool and t["flag"].tolist() == [True, False, True]
        assert t["flag_or_null"].dtype == torch.float32 and _rows({"f": t["flag_or_null"].tolist()}, 3) == _rows({"f": [1.0, None, 0.0]}, 3)
        assert t["x"].dtype == torch.float32 and t["emb"].tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
        assert all(v.is_contiguous() for v in t.values())
    # Packed, the two float32 columns share one buffer; unpacked they do not.
    packed, loose = qv.to_tensors(table, torch, pack=True), qv.to_tensors(table, torch)
    same = lambda t: t["x"].untyped_storage().data_ptr() == t["flag_or_null"].untyped_storage().data_ptr()  # noqa: E731
    assert same(packed) and not same(loose)
