"""Reading `quiver export` output from Python: TrainingSet and its shard plan."""
import itertools
import os
import subprocess
import sys

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


def _sets(exported, tmp_path_factory):
    """The demo's training set exported in 1, 4 and 100 shards."""
    out = {}
    for shards in (1, 4, 100):
        path = tmp_path_factory.mktemp(f"shards{shards}") / "ts"
        cli(exported, "export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", str(path),
            "--shard-rows", str(-(-500 // shards)))
        out[shards] = qv.TrainingSet(str(path))
        assert len(out[shards].files) == shards
    return out


@pytest.fixture(scope="module")
def sets(exported, tmp_path_factory):
    return _sets(exported, tmp_path_factory)


def _loaded(batches, names):
    """The rows of a sequence of batches, as tuples (see `_rows`)."""
    rows = []
    for b in batches:
        n = len(next(iter(b.values()))) if b else 0
        rows += _rows({c: b[c].tolist() for c in names}, n)
    return rows


def _loaded_table(ts, names, lo, hi):
    """Rows lo..hi of the set's files, in order, as the loader gives them."""
    table = ts.to_arrow().slice(lo, hi - lo)
    return _convert(ts, table, names)


def _convert(ts, table, names):
    cols = {}
    for c in names:
        col = table.column(c)
        if pa.types.is_string(col.type):
            vocab = {v: i for i, v in enumerate(ts.manifest["vocabularies"][c])}
            cols[c] = [vocab[v] for v in col.to_pylist()]
        elif pa.types.is_timestamp(col.type):
            cols[c] = col.cast(pa.int64()).to_pylist()
        else:
            cols[c] = col.to_pylist()
    return _rows(cols, table.num_rows)


def _expected(ts, names):
    """Every row of the set, from its files (the oracle), with strings as the manifest's
    codes and times as microseconds, as the loader gives them."""
    return sorted(_convert(ts, ts.to_arrow(), names))


def test_loader_parts_are_disjoint_complete_equal_and_shuffled(sets):
    """3 ranks x 0, 2, 3 workers over sets of 1, 4 and 100 shards: every row once, the
    same number of batches on every rank, rows shuffled, (seed, epoch) reproducible."""
    torch = _torch()
    for shards, ts in sets.items():
        names = list(next(iter(ts.to_torch(batch_size=7))))
        assert "customer_id" in names and "event_timestamp" in names, names
        want = _expected(ts, names)
        for workers in (0, 2, 3):
            seen, counts, orders = [], [], []
            for rank in range(3):
                data = ts.to_torch(batch_size=16, shuffle=True, seed=5, rank=rank, world_size=3, window_rows=64)
                batches = list(data.loader(num_workers=workers))
                counts.append(len(batches))
                assert len(batches) == len(data) == 11  # ceil(ceil(500 / 3) / 16)
                assert all(len(b["driver_id"]) <= 16 for b in batches)
                assert all(b["event_timestamp"].dtype == torch.int64 and b["customer_id"].dtype == torch.int64 for b in batches)
                rows = _loaded(batches, names)
                orders.append(rows)
                seen += rows
            assert sorted(seen) == want, (shards, workers)
            assert len(set(counts)) == 1, counts
        # Shuffled rows: rank 0 does not read its rows in the file order, nor in whole
        # shards; the same seed and epoch give the same order, another epoch another.
        plain = _loaded(ts.to_torch(batch_size=16, rank=0, world_size=3), names)
        first = _loaded(ts.to_torch(batch_size=16, shuffle=True, seed=5, rank=0, world_size=3), names)
        again = _loaded(ts.to_torch(batch_size=16, shuffle=True, seed=5, rank=0, world_size=3), names)
        other = _loaded(ts.to_torch(batch_size=16, shuffle=True, seed=5, rank=0, world_size=3, epoch=1), names)
        assert first == again and first != plain and first != other
        # Unshuffled, rank 0 reads the set's first third in file order.
        assert plain == _loaded_table(ts, names, 0, 500 // 3)


def test_loader_resumes_mid_epoch_exactly(sets):
    """A state taken after some batches (under 2 workers) resumes under 0 and 3 workers:
    the rest of the epoch, nothing repeated or skipped."""
    _torch()
    ts = sets[4]
    names = list(next(iter(ts.to_torch(batch_size=7))))
    for workers_after in (0, 3):
        data = ts.to_torch(batch_size=8, shuffle=True, seed=3, rank=1, world_size=3, epoch=2, window_rows=24)
        full = _loaded(list(ts.to_torch(batch_size=8, shuffle=True, seed=3, rank=1, world_size=3, epoch=2,
                                        window_rows=24)), names)
        head = []
        for k, batch in enumerate(data.loader(num_workers=2)):
            head.append(batch)
            if k == 6:
                break
        state = data.state_dict()
        resumed = ts.to_torch(batch_size=8, shuffle=True, seed=3, rank=1, world_size=3, window_rows=24)
        resumed.load_state_dict(state)
        assert resumed.epoch == 2
        tail = list(resumed.loader(num_workers=workers_after))
        assert len(head) + len(tail) == len(data)
        assert sorted(_loaded(head, names) + _loaded(tail, names)) == sorted(full), workers_after
        # A second state taken mid-way of the resumed run resumes too.
        again = ts.to_torch(batch_size=8, shuffle=True, seed=3, rank=1, world_size=3, window_rows=24)
        again.load_state_dict(state)
        part = []
        for k, batch in enumerate(again):
            part.append(batch)
            if k == 2:
                break
        last = ts.to_torch(batch_size=8, shuffle=True, seed=3, rank=1, world_size=3, window_rows=24)
        last.load_state_dict(again.state_dict())
        rest = list(last)
        assert sorted(_loaded(head + part + rest, names)) == sorted(full)
    with pytest.raises(qv.ValidationError, match="seed=3"):
        ts.to_torch(batch_size=8, shuffle=True, seed=4, rank=1, world_size=3).load_state_dict(state)


def test_loader_plan_for_any_blocks_and_sizes():
    """The plan alone (no files), over many shapes: every row once across ranks, equal
    batch counts, batches of the size asked for but each rank's last."""
    from quiver.loader import Plan
    import random
    rng = random.Random(1)
    for _ in range(300):
        blocks = [rng.choice([0, 1, 5, 64, 100]) for _ in range(rng.choice([1, 4, 100]))]
        n = sum(blocks)
        world, size = rng.randint(1, 5), rng.choice([1, 3, 16, 1000])
        shuffle = rng.random() < 0.5
        covered, counts = [], []
        for rank in range(world):
            plan = Plan(blocks, size, rank, world, shuffle, 9, 1, window_rows=rng.choice([1, 50, 262_144]))
            for block, lo, hi in plan.segments:
                covered += [(block, r) for r in range(lo, hi)]
            assert sum(plan.batch_sizes) == plan.rows
            assert all(s == size for s in plan.batch_sizes[:-2])
            counts.append(len(plan.batch_sizes))
            # An empty batch only where a batch of one row cannot be split.
            assert all(s > 0 for s in plan.batch_sizes) or size == 1 or n < world
        assert sorted(covered) == [(b, r) for b, k in enumerate(blocks) for r in range(k)], (blocks, world, size)
        assert len(set(counts)) == 1


def test_loader_columns_are_returned_or_refused(sets, tmp_path):
    torch = _torch()
    ts = sets[4]
    whole = ts.to_arrow()
    first = next(iter(ts.to_torch(batch_size=500)))
    assert first["driver_id"].dtype == torch.int64 and first["accepted"].dtype == torch.bool
    assert first["driver_hourly__conv_rate"].dtype == torch.float64
    assert tuple(first["customer_profile__embedding"].shape) == (500, 4)
    vocab = ts.manifest["vocabularies"]["customer_id"]
    assert vocab == sorted(set(whole.column("customer_id").to_pylist()))
    assert [vocab[c] for c in first["customer_id"].tolist()] == whole.column("customer_id").to_pylist()
    assert first["event_timestamp"].tolist() == whole.column("event_timestamp").cast(pa.int64()).to_pylist()
    only = next(iter(ts.to_torch(batch_size=8, columns=["customer_id", "event_timestamp"])))
    assert list(only) == ["customer_id", "event_timestamp"]
    with pytest.raises(qv.ValidationError, match="unknown column `nope` \\(the training set has: driver_id"):
        ts.to_torch(columns=["nope"])
    with pytest.raises(qv.ValidationError, match="batch_size"):
        ts.to_torch(batch_size=0)
    with pytest.raises(qv.ValidationError, match="rank 3"):
        ts.to_torch(rank=3, world_size=3)
    # A ragged list column, asked for, is refused naming it.
    from quiver.loader import Columns
    table = pa.table({"r": pa.array([[1.0], [2.0, 3.0]], pa.list_(pa.float64())), "b": pa.array([b"x", b"y"])})
    with pytest.raises(qv.ValidationError, match="column `r`: ragged lists"):
        Columns(table.schema, {}, {}, ["r"]).arrays(table)
    with pytest.raises(qv.ValidationError, match="column `b` of type binary has no tensor form"):
        Columns(table.schema, {}, {}, ["b"])


def test_torchrun_trains_two_processes_over_a_training_set(sets, tmp_path):
    """docs/export.md's DDP example under torchrun, 2 processes on CPU (gloo), two
    epochs: no hang, each process its share, together every row each epoch."""
    _torch()
    guide = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "export.md")).read()
    script = guide.split("```python ddp\n", 1)[1].split("```", 1)[0]
    (tmp_path / "train_ddp.py").write_text(script)
    ts = sets[4]
    env = dict(os.environ, TRAINING_SET=ts.path, OUT=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(_free_port()), str(tmp_path / "train_ddp.py")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    import json
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in ("0", "1"):
        assert seen[0][epoch]["batches"] == seen[1][epoch]["batches"]
        assert seen[0][epoch]["rows"] + seen[1][epoch]["rows"] == ts.num_rows
        assert not set(seen[0][epoch]["ids"]) & set(seen[1][epoch]["ids"])


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def test_job_to_torch_streams_batches_of_the_join(exported):
    """`get_historical_features(...).to_torch(batch_size=...)`: the join's rows in order,
    in batches, converted as the loader converts them, no files."""
    torch = _torch()
    store = qv.FeatureStore(str(exported))
    spine = pq.read_table(exported / "sample_data" / "spine.parquet")
    job = store.get_historical_features(entity_df=spine, feature_service="ranker_v1")
    table = job.to_arrow()
    batches = list(job.to_torch(batch_size=64))
    assert [len(b["driver_id"]) for b in batches] == [64] * 7 + [500 - 7 * 64]
    names = list(batches[0])
    assert "customer_id" in names and batches[0]["event_timestamp"].dtype == torch.int64
    vocab = sorted(set(table.column("customer_id").to_pylist()))
    got = [vocab[c] for b in batches for c in b["customer_id"].tolist()]
    assert got == table.column("customer_id").to_pylist()
    conv = [x for b in batches for x in b["driver_hourly__conv_rate"].tolist()]
    assert _rows({"x": conv}, 500) == _rows({"x": table.column("driver_hourly__conv_rate").to_pylist()}, 500)
    only = next(iter(job.to_torch(batch_size=8, columns=["accepted"])))
    assert list(only) == ["accepted"]
    with pytest.raises(qv.ValidationError, match="unknown column `nope`"):
        job.to_torch(batch_size=8, columns=["nope"])
    with pytest.raises(qv.ValidationError, match="batch_size"):
        job.to_torch(batch_size=0)


def test_loader_workers_start_by_spawn(sets):
    """Workers started by spawn (macOS, forkserver on newer Pythons) unpickle the dataset
    by importing quiver afresh: the same batches as in-process."""
    _torch()
    ts = sets[4]
    names = list(next(iter(ts.to_torch(batch_size=7))))
    data = ts.to_torch(batch_size=16, shuffle=True, seed=2, window_rows=64)
    here = _loaded(list(data), names)
    spawned = _loaded(list(data.loader(num_workers=2, multiprocessing_context="spawn")), names)
    assert sorted(spawned) == sorted(here) and len(spawned) == 500


def test_loader_state_is_checked_and_survives_set_epoch(sets):
    _torch()
    ts = sets[4]
    names = list(next(iter(ts.to_torch(batch_size=7))))
    make = lambda **kw: ts.to_torch(batch_size=8, shuffle=True, seed=3, **kw)  # noqa: E731
    data = make(epoch=1, window_rows=24)
    head = []
    for k, batch in enumerate(data):
        head.append(batch)
        if k == 4:
            break
    state = data.state_dict()
    full = _loaded(list(make(epoch=1, window_rows=24)), names)
    # The guide's loop calls set_epoch at the top of each epoch: right after a load of
    # that epoch it keeps the state; the next epoch starts from its first batch.
    resumed = make(window_rows=24)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    tail = list(resumed)
    assert sorted(_loaded(head, names) + _loaded(tail, names)) == sorted(full)
    resumed.set_epoch(2)
    assert len(list(resumed)) == len(resumed)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    list(resumed)
    resumed.set_epoch(1)  # after iterating, set_epoch starts the epoch again
    assert len(list(resumed)) == len(resumed)
    # A state of another shuffle window or another set is refused, naming what differs.
    with pytest.raises(qv.ValidationError, match="window_rows=24"):
        make(window_rows=64).load_state_dict(state)
    with pytest.raises(qv.ValidationError, match="blocks=4"):
        sets[1].to_torch(batch_size=8, shuffle=True, seed=3, window_rows=24).load_state_dict(state)
    with pytest.raises(qv.ValidationError, match="persistent_workers=True"):
        data.loader(num_workers=2, persistent_workers=True)
    with pytest.raises(qv.ValidationError, match="in_order=False"):
        data.loader(num_workers=2, in_order=False)


def test_loader_times_text_lists_and_files(tmp_path, exported):
    """Timestamps of any unit as microseconds; large and view strings coded from the
    manifest; a list of another length in a later block refused by name; a column name
    with a dot read for nulls; at most MAX_OPEN shard files open."""
    _torch()
    from quiver import loader
    from quiver.loader import Columns, Reader, layout
    t = pa.table({"ns": pa.array([1_500_000_123_456_789, None], pa.timestamp("ns", "UTC")),
                  "s": pa.array([2, 3], pa.timestamp("s"))})
    cols = Columns(t.schema, {}, {"ns": True}, None)
    got = cols.arrays(t)
    assert got["ns"][0] == 1_500_000_123_456 and got["ns"][1] != got["ns"][1]
    assert got["s"].tolist() == [2_000_000, 3_000_000]
    # Lists: the first block fixes the length.
    one = pa.table({"e": pa.array([[1.0, 2.0]], pa.list_(pa.float64()))})
    other = pa.table({"e": pa.array([[1.0, 2.0, 3.0]], pa.list_(pa.float64()))})
    cols = Columns(one.schema, {}, {}, ["e"])
    cols.fix_widths(one)
    assert cols.arrays(one)["e"].shape == (1, 2)
    with pytest.raises(qv.ValidationError, match="column `e`: ragged lists \\(length 3 here, 2 in the first block\\)"):
        cols.arrays(other)
    # A column named with a dot: its nulls are seen (so its integers come as floats).
    path = tmp_path / "dots.parquet"
    pq.write_table(pa.table({"label.v2": pa.array([1, None], pa.int64()), "x": pa.array([1, 2], pa.int64())}), path)
    _, _, nulls, _ = layout([str(path)], "parquet")
    assert nulls == {"label.v2": True, "x": False}
    # Large strings on the spine get a vocabulary and come as codes.
    spine = pq.read_table(exported / "sample_data/spine.parquet")
    tags = pa.array([f"t{i % 3}" for i in range(spine.num_rows)], pa.large_string())
    pq.write_table(spine.append_column("tag", tags), tmp_path / "spine.parquet")
    cli(exported, "export", "--service", "ranker_v1", "--spine", str(tmp_path / "spine.parquet"), "--out",
        str(tmp_path / "ts"), "--shard-rows", "100")
    ts = qv.TrainingSet(str(tmp_path / "ts"))
    assert pq.read_schema(ts.files[0]).field("tag").type == pa.large_string()
    assert ts.manifest["vocabularies"]["tag"] == ["t0", "t1", "t2"]
    coded = next(iter(ts.to_torch(batch_size=1000, columns=["tag"])))["tag"].tolist()
    assert coded == [i % 3 for i in range(spine.num_rows)]
    # Open files: the least recently used closes past MAX_OPEN, values unchanged.
    old, loader.MAX_OPEN = loader.MAX_OPEN, 2
    try:
        blocks, _, _, _ = ts._layout()
        reader = Reader(ts.files, ts.format, blocks, ["tag"])
        read = [reader._read(b).column("tag").to_pylist() for b in range(len(blocks))]
        assert len(reader.open) == 2
        assert sum(read, []) == [f"t{i % 3}" for i in range(spine.num_rows)]
    finally:
        loader.MAX_OPEN = old
