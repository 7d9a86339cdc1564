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
    for v in ("driver_hourly", "customer_profile", "driver_customer"):
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
