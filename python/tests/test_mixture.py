"""Mixing training sets (docs/mixing.md): exact counts per global batch against an
independent largest-remainder oracle, schedules, coverage, resume (0 and 2 workers,
elastic across world sizes), DDP under torchrun, describe(), and bad input."""
import hashlib
import json
import math
import os
import random
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import quiver as qv
from test_training import _free_port, _torch


def make_set(path, n, offset, shards=3, group=64, cities=("a", "b")):
    """A training set folder as `quiver export` writes one: Parquet shards of row groups
    and manifest.json; row `i` has id `offset + i` (ids identify rows across sets)."""
    os.makedirs(path, exist_ok=True)
    per = -(-n // shards)
    entries = []
    for s in range(shards):
        lo, hi = s * per, min(n, (s + 1) * per)
        ids = np.arange(offset + lo, offset + hi, dtype=np.int64)
        table = pa.table({"id": ids, "x": ids * 0.5, "city": pa.array([cities[i % len(cities)] for i in range(lo, hi)])})
        name = f"part-{s:05d}.parquet"
        pq.write_table(table, os.path.join(path, name), row_group_size=group)
        digest = hashlib.sha256(open(os.path.join(path, name), "rb").read()).hexdigest()
        entries.append({"file": name, "rows": hi - lo, "sha256": digest})
    manifest = {
        "format_version": 1, "training_set_id": hashlib.sha256(str(path).encode()).hexdigest()[:32], "project": "p",
        "registry_version": 3, "options": {"service": "svc", "format": "parquet", "shard_rows": per, "created_cutoff": False},
        "delta_versions": {"v": 5}, "spine": {"path": "spine.parquet", "sha256": "0" * 64, "rows": n},
        "features": [{"reference": "v:x", "column": "x", "dtype": "float64"}],
        "schema": [["id", "Int64"], ["x", "Float64"], ["city", "Utf8"]], "rows": n, "shards": entries,
        "vocabularies": {"city": sorted(set(cities))}}
    with open(os.path.join(path, "manifest.json"), "w") as fh:
        json.dump(manifest, fh)
    return qv.TrainingSet(str(path))


@pytest.fixture()
def abc(tmp_path):
    return {"a": make_set(tmp_path / "a", 700, 0), "b": make_set(tmp_path / "b", 200, 10_000, cities=("c", "b")),
            "c": make_set(tmp_path / "c", 100, 20_000)}


def oracle(total, weights, carry):
    """The global batch's counts, written here independently of the library: each share
    floor or ceil of total * w, the extras to the largest (carry + fraction), first wins
    ties; the carry is the exact running total less the rows given."""
    s = sum(weights)
    exact = [Fraction(total) * w / s for w in weights]
    out = [math.floor(e) for e in exact]
    need = total - sum(out)
    score = [(carry[k] + exact[k] - out[k], -k) for k in range(len(weights)) if exact[k] != out[k]]
    for _, negk in sorted(score, reverse=True)[:need]:
        out[-negk] += 1
    for k in range(len(weights)):
        carry[k] += exact[k] - out[k]
    return out


def global_counts(mixture, batch_size, world, n_sources, **kw):
    """Per step, the rows of each source over all ranks, and each rank's batch count."""
    per_rank = []
    for rank in range(world):
        ds = mixture.to_torch(batch_size=batch_size, rank=rank, world_size=world, **kw)
        per_rank.append([np.bincount(b["source"].numpy(), minlength=n_sources) for b in ds])
    lengths = {len(p) for p in per_rank}
    assert len(lengths) == 1, f"ranks yield different batch counts: {[len(p) for p in per_rank]}"
    return [sum(p[s] for p in per_rank).tolist() for s in range(len(per_rank[0]))]


@pytest.mark.parametrize("batch_size, world", [(1, 2), (7, 3), (64, 4), (1000, 2)])
def test_every_global_batch_holds_the_largest_remainder_counts(tmp_path, batch_size, world):
    _torch()
    sets = {"a": make_set(tmp_path / "a", 7000, 0, group=500), "b": make_set(tmp_path / "b", 2000, 10 ** 6, group=500),
            "c": make_set(tmp_path / "c", 1000, 2 * 10 ** 6, group=500)}
    weights = {"a": 0.7, "b": 0.2, "c": 0.1}
    mixture = qv.Mixture(sets, weights=weights, on_exhausted="repeat", steps=min(400, 24_000 // (batch_size * world)))
    got = global_counts(mixture, batch_size, world, 3, shuffle=True, seed=5)
    total, carry = batch_size * world, [Fraction(0)] * 3
    w = [Fraction(7, 10), Fraction(2, 10), Fraction(1, 10)]
    cumulative = [0, 0, 0]
    for step, counts in enumerate(got):
        assert counts == oracle(total, w, carry), f"step {step}"
        for k in range(3):
            assert math.floor(total * w[k]) <= counts[k] <= math.ceil(total * w[k]), (step, k, counts)
            cumulative[k] += counts[k]
            assert abs(cumulative[k] - (step + 1) * total * w[k]) < 1, (step, k)
    assert len(got) == mixture.steps


def source_order(first, n, group, shards, seed, k, p, window, epoch=0):
    """Pass ``p`` of source ``k`` (ids ``first ..``, as `make_set` writes them), shuffled."""
    per = -(-n // shards)
    blocks = [list(range(first + g, first + min(g + group, (s + 1) * per, n)))
              for s in range(shards) for g in range(s * per, min(n, (s + 1) * per), group)]
    read = [i for b in np.random.default_rng([seed, epoch, k, p]).permutation(len(blocks)) for i in blocks[b]]
    out = []
    for j in range(0, n, window):
        rows = read[j:j + window]
        out += [rows[i] for i in np.random.default_rng([seed, epoch, k, p, j // window]).permutation(len(rows))]
    return out


@pytest.mark.parametrize("ahead", [None, 0])
def test_each_batch_is_the_sources_next_rows_spread_evenly_and_cut_by_rank(tmp_path, monkeypatch, ahead):
    """Row for row against an oracle written here: a source's order is its row groups
    permuted by ``default_rng([seed, epoch, k, pass])``, then its windows' rows by
    ``default_rng([seed, epoch, k, pass, window])`` (docs/mixing.md); a step takes each source's next rows (the oracle's counts), lays them out by
    ``(i + 0.5) / c_k`` (ties to the first source) and cuts them into ``world_size``
    parts. Small windows and repeated passes, so a source's rows of a step cross both.
    With the plan run ahead as shipped, windows are written in one go; with it not run
    ahead (``AHEAD = 0``), they are kept and written a chunk at a time."""
    _torch()
    import quiver.mixture_batches as batches
    kept = []
    in_order = batches.in_order
    monkeypatch.setattr(batches, "in_order", lambda *a: kept.append(1) or in_order(*a))
    if ahead is not None:
        monkeypatch.setattr(batches, "AHEAD", ahead)
    sets = {"a": make_set(tmp_path / "a", 3000, 0, group=100), "b": make_set(tmp_path / "b", 1100, 10 ** 6, group=100),
            "c": make_set(tmp_path / "c", 700, 2 * 10 ** 6, group=100)}
    names, batch, world, steps = ["a", "b", "c"], 37, 3, 60
    first = {"a": 0, "b": 10 ** 6, "c": 2 * 10 ** 6}
    rows = {"a": 3000, "b": 1100, "c": 700}
    w = [Fraction(5, 10), Fraction(3, 10), Fraction(2, 10)]
    read = dict(shuffle=True, seed=4, window_rows=256)
    order = {name: [i for p in range(3) for i in source_order(first[name], rows[name], 100, 3, 4, k, p, 256)]
             for k, name in enumerate(names)}
    for name in names:
        n = rows[name]
        assert sorted(order[name][:n]) == sorted(order[name][n:2 * n]) == list(range(first[name], first[name] + n))
    mixture = qv.Mixture(sets, weights=dict(zip(names, w)), on_exhausted="repeat", steps=steps)
    got = [[(b["id"].tolist(), b["source"].tolist()) for b in mixture.to_torch(batch_size=batch, rank=r, world_size=world, **read)]
           for r in range(world)]
    carry, at = [Fraction(0)] * 3, [0, 0, 0]
    for s in range(steps):
        counts = oracle(batch * world, w, carry)
        laid = sorted((Fraction(2 * i + 1, 2 * counts[k]), k, order[names[k]][at[k] + i])
                      for k in range(3) for i in range(counts[k]))
        for k in range(3):
            at[k] += counts[k]
        g = len(laid)
        for r in range(world):
            part = laid[r * g // world:(r + 1) * g // world]
            assert got[r][s] == ([i for _, _, i in part], [k for _, k, _ in part]), f"step {s}, rank {r}"
    assert at[0] > 3000 and at[2] > 700, "sources a and c went into further passes"
    assert bool(kept) == (ahead == 0), f"{len(kept)} windows kept"


def test_the_quick_plan_of_a_steady_phase_is_the_step_by_step_plan():
    """`Planner.advance` (remembered counts inside a phase no source finishes) against
    `Planner.next` (every step worked out), over random mixtures, schedules, ramps and
    policies: the same counts, starts (also of the sources a step takes nothing from) and
    states."""
    from quiver.mixture_plan import Planner, Schedule
    rng = random.Random(5)
    for trial in range(150):
        n = rng.randint(1, 4)
        names = [f"s{i}" for i in range(n)]
        rows = [rng.randint(1, 3000) for _ in range(n)]
        points, step = [], 0
        for i in range(rng.randint(1, 3)):
            ws = {nm: rng.choice([0, 1, 2, 0.3, 0.7, 5]) for nm in names}
            ws[names[0]] = ws[names[0]] or (1 if not any(ws.values()) else 0)
            points.append((step, ws) if i == 0 or rng.random() < 0.5 else (step, ws, "linear"))
            step += rng.randint(1, 30)
        policies = [rng.choice(["repeat", "stop", "drop"]) for _ in range(n)]
        limit, total = rng.choice([50, 200, 3000]), rng.choice([1, 7, 64, 100])
        slow, quick = (Planner(rows, Schedule(names, None, points), policies, limit) for _ in range(2))
        while True:
            takes, got = slow.next(total), quick.advance(total)
            if takes is None:
                assert got is None, trial
                break
            counts, starts = [0] * n, [0] * n
            for k, p, a, b in takes:
                starts[k] = starts[k] if counts[k] else p * rows[k] + a
                counts[k] += b - a
            # A source the step takes nothing from: where it stands in its passes.
            starts = [starts[k] if counts[k] else slow.passes[k] * rows[k] + slow.position[k] for k in range(n)]
            assert got == (tuple(counts), starts), (trial, slow.step)
            if rng.random() < 0.05:  # a state taken mid-epoch, and planning on after it
                assert quick.state() == slow.state(), (trial, slow.step)
        assert quick.state() == slow.state(), trial


def test_a_schedule_changes_the_mix_at_the_step_it_names_and_ramps_linearly(tmp_path):
    _torch()
    sets = {"a": make_set(tmp_path / "a", 5000, 0), "b": make_set(tmp_path / "b", 5000, 10 ** 6)}
    schedule = [(0, {"a": 1}), (10, {"b": 1}), (20, {"a": 1, "b": 1}), (30, {"a": 1}, "linear")]
    mixture = qv.Mixture(sets, schedule=schedule, on_exhausted="repeat", steps=40)
    got = global_counts(mixture, 10, 2, 2)
    assert all(c == [20, 0] for c in got[:10]) and all(c == [0, 20] for c in got[10:20]), got[:21]
    # The ramp from 20 (1:1) to 30 (1:0): the weights at step s, the oracle's counts.
    carry = [Fraction(0)] * 2
    for s in range(40):
        if s < 10:
            w = [Fraction(1), Fraction(0)]
        elif s < 20:
            w = [Fraction(0), Fraction(1)]
        elif s < 30:
            t = Fraction(s - 20, 10)
            w = [1 + (1 - 1) * t, 1 + (0 - 1) * t]
        else:
            w = [Fraction(1), Fraction(0)]
        assert got[s] == oracle(20, w, carry), s
    assert got[25] == [13, 7] and got[30:] == [[20, 0]] * 10  # weights 1 : 0.5 at the ramp's middle
    ds = mixture.to_torch(batch_size=10, rank=0, world_size=2)
    list(ds)
    read = ds.rows_read()
    assert read["by_phase"]["0"] == {"a": 200, "b": 0} and read["by_phase"]["1"] == {"a": 0, "b": 200}
    assert read["total"]["a"] + read["total"]["b"] == 800


def test_stop_reads_the_limiting_set_once_and_repeat_passes_are_permutations(tmp_path):
    _torch()
    sets = {"small": make_set(tmp_path / "s", 130, 0), "big": make_set(tmp_path / "g", 1000, 10 ** 6)}
    mixture = qv.Mixture(sets, weights={"small": 1, "big": 1}, on_exhausted={"small": "repeat", "big": "stop"})
    ids = {"small": [], "big": []}
    # One row a step: the rows come in each source's order (a step's rows are shuffled
    # together, which would blur where a pass ends).
    for b in mixture.to_torch(batch_size=1, shuffle=True, seed=9):
        for i, s in zip(b["id"].tolist(), b["source"].tolist()):
            ids[mixture.names[s]].append(i)
    assert sorted(ids["big"]) == list(range(10 ** 6, 10 ** 6 + 1000)), "the stopping set once, every row"
    small = ids["small"]
    assert len(small) >= 3 * 130
    passes = [small[i:i + 130] for i in range(0, len(small), 130)]
    for p in passes[:-1]:
        assert sorted(p) == list(range(130)), "each pass of a repeated set is a permutation"
    assert passes[0] != passes[1], "each pass is shuffled anew"
    # drop: when `b` runs out, `a` fills the steps, and the epoch ends when both have.
    sets2 = {"a": make_set(tmp_path / "a2", 300, 0), "b": make_set(tmp_path / "b2", 50, 10 ** 6)}
    dropped = qv.Mixture(sets2, weights={"a": 1, "b": 1}, on_exhausted="drop")
    seen = [i for b in dropped.to_torch(batch_size=20, shuffle=True, seed=1) for i in b["id"].tolist()]
    assert sorted(seen) == list(range(300)) + list(range(10 ** 6, 10 ** 6 + 50))


def _ids(batches):
    return [b["id"].tolist() for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_at_random_steps_gives_the_uninterrupted_batches(abc, workers):
    _torch()
    mixture = qv.Mixture(abc, weights={"a": 0.7, "b": 0.2, "c": 0.1}, on_exhausted={"a": "repeat", "b": "repeat", "c": "stop"})
    make = lambda: mixture.to_torch(batch_size=9, shuffle=True, seed=4, window_rows=128)  # noqa: E731
    full = _ids(make().loader(num_workers=workers))
    assert len(full) == len(make())
    rng = random.Random(11)
    for at in sorted(rng.sample(range(1, len(full) - 1), 3)):
        ds = make()
        it = iter(ds.loader(num_workers=workers))
        head = [next(it)["id"].tolist() for _ in range(at)]
        state = json.loads(json.dumps(ds.state_dict()))  # as a checkpoint holds it
        del it
        resumed = make()
        resumed.load_state_dict(state)
        tail = _ids(resumed.loader(num_workers=workers))
        assert head + tail == full, at


def test_every_way_of_reading_gives_the_same_batches(abc):
    """In the training process, through `loader(num_workers=2)`
    (workers reading each window once, batches cut here) and through a plain DataLoader
    with 2 workers (each worker its steps): the same batches, row for row, in step
    order."""
    _torch()
    from torch.utils.data import DataLoader
    mixture = qv.Mixture(abc, weights={"a": 0.6, "b": 0.3, "c": 0.1}, on_exhausted={"a": "stop", "b": "repeat", "c": "repeat"})
    make = lambda: mixture.to_torch(batch_size=7, shuffle=True, seed=2, window_rows=96)  # noqa: E731
    here = [(b["id"].tolist(), b["source"].tolist()) for b in make()]
    fed = [(b["id"].tolist(), b["source"].tolist()) for b in make().loader(num_workers=2)]
    plain = [(b["id"].tolist(), b["source"].tolist()) for b in DataLoader(make(), batch_size=None, num_workers=2)]
    assert len(here) == len(make()) > 20
    assert here == fed == plain
    # Batches held while iterating on (a chunk's arrays are reused once no batch of them
    # is alive): still the same rows.
    held = list(make())
    assert [(b["id"].tolist(), b["source"].tolist()) for b in held] == here
    # Every id of the stopping set once, the others' ids from their own ranges.
    ids = [i for batch, _ in here for i in batch]
    assert sorted(i for i in ids if i < 10_000) == list(range(700))


@pytest.mark.parametrize("before, after", [(2, 1), (1, 4)])
def test_elastic_resume_reads_exactly_the_rows_not_yet_read(abc, before, after):
    _torch()
    mixture = qv.Mixture(abc, weights={"a": 0.7, "b": 0.2, "c": 0.1})
    at = 12
    read, state = [], None
    for rank in range(before):
        ds = mixture.to_torch(batch_size=5, shuffle=True, seed=2, rank=rank, world_size=before)
        it = iter(ds)
        read += [i for _ in range(at) for i in next(it)["id"].tolist()]
        state = state or ds.state_dict()
    assert len(set(read)) == len(read)
    lengths = set()
    for rank in range(after):
        ds = mixture.to_torch(batch_size=5, shuffle=True, seed=2, rank=rank, world_size=after)
        ds.load_state_dict(state)
        batches = _ids(ds)
        lengths.add(len(batches))
        read += [i for b in batches for i in b]
    assert len(lengths) == 1
    assert len(set(read)) == len(read), "a row read twice across the resume"
    planned = ds.rows_read()["total"]
    assert len(read) == sum(planned.values())
    assert {i for i in read if i >= 20_000} == set(range(20_000, 20_100)), "the stopping set, every row once"
    per = {"a": sum(i < 10_000 for i in read), "b": sum(10_000 <= i < 20_000 for i in read)}
    assert per == {"a": planned["a"], "b": planned["b"]}


def test_describe_names_the_sets_their_versions_and_the_rows_read(abc, tmp_path):
    _torch()
    mixture = qv.Mixture(abc, schedule=[(0, {"a": 0.7, "b": 0.3}), (5, {"c": 1})], on_exhausted="stop")
    ds = mixture.to_torch(batch_size=10, shuffle=True, seed=1)
    it = iter(ds)
    for _ in range(7):
        next(it)
    ds.write_description(str(tmp_path / "mix.json"))
    d = json.loads((tmp_path / "mix.json").read_text())
    assert d["sets"]["a"]["training_set_id"] == abc["a"].id and d["sets"]["b"]["delta_versions"] == {"v": 5}
    assert d["sets"]["c"]["registry_version"] == 3 and d["sets"]["a"]["features"] == ["v:x"]
    assert d["schedule"] == [{"step": 0, "weights": {"a": 0.7, "b": 0.3, "c": 0.0}}, {"step": 5, "weights": {"a": 0.0, "b": 0.0, "c": 1.0}}]
    assert d["seed"] == 1 and d["batch_size"] == 10 and d["sources"] == ["a", "b", "c"]
    assert d["rows_read"]["by_phase"] == {"0": {"a": 35, "b": 15, "c": 0}, "1": {"a": 0, "b": 0, "c": 20}}
    # Strings: one vocabulary across the sets (a: a/b, b: c/b), in the state.
    assert ds.state_dict()["vocabularies"] == {"city": ["a", "b", "c"]}
    # Rows per earlier epoch are kept, and travel with the state.
    ds.set_epoch(1)
    assert ds.rows_read()["by_epoch"] == {"0": {"a": 35, "b": 15, "c": 20}}
    again = mixture.to_torch(batch_size=10, shuffle=True, seed=1)
    again.load_state_dict(ds.state_dict())
    assert again.rows_read()["by_epoch"] == {"0": {"a": 35, "b": 15, "c": 20}} and again.rows_read()["total"]["a"] == 0


def test_bad_mixtures_are_refused_naming_what_is_wrong(abc, tmp_path):
    _torch()
    cases = [
        (dict(weights={"a": -1, "b": 1}), "weight of `a` is negative"),
        (dict(weights={"a": 0, "b": 0}), "every weight is zero"),
        (dict(weights={"a": 1, "web": 1}), "`web`, which is not a source"),
        (dict(schedule=[(0, {"a": 1}), (10, {"b": 1}), (5, {"c": 1})]), "steps go forward"),
        (dict(schedule=[(3, {"a": 1})]), "starts at step 0"),
        (dict(weights={"a": 1}, on_exhausted="loop"), "`loop` is not a policy"),
        (dict(weights={"a": 1}, on_exhausted="repeat"), "give steps="),
        (dict(weights={"a": 1}, schedule=[(0, {"a": 1})]), "weights= or schedule="),
    ]
    for kwargs, message in cases:
        with pytest.raises(qv.ValidationError, match=message.replace("(", r"\(").replace("=", "=")):
            qv.Mixture(abc, **kwargs)
    with pytest.raises(qv.NotFoundError, match="manifest.json"):
        qv.Mixture({"a": abc["a"], "gone": str(tmp_path / "nowhere")}, weights={"a": 1})
    # A shard rewritten since the export.
    changed = make_set(tmp_path / "changed", 100, 0)
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "x": [0.5], "city": ["a"]}), changed.files[0])
    with pytest.raises(qv.ValidationError, match="source `changed`.*part-00000.parquet holds 1 rows"):
        qv.Mixture({"a": abc["a"], "changed": changed}, weights={"a": 1})
    # Different columns: refused unless columns= names shared ones of one type.
    other = tmp_path / "other"
    os.makedirs(other)
    pq.write_table(pa.table({"id": pa.array([7], pa.int64()), "y": [1.0]}), other / "part-00000.parquet")
    m = json.load(open(os.path.join(abc["a"].path, "manifest.json")))
    m.update(rows=1, shards=[{"file": "part-00000.parquet", "rows": 1, "sha256": "0"}], vocabularies={})
    json.dump(m, open(other / "manifest.json", "w"))
    mixed = qv.Mixture({"a": abc["a"], "o": qv.TrainingSet(str(other))}, weights={"a": 1, "o": 1}, on_exhausted="drop")
    with pytest.raises(qv.ValidationError, match="different columns"):
        mixed.to_torch(batch_size=4)
    assert [b["id"].tolist() for b in mixed.to_torch(batch_size=4, columns=["id"])][-1] != []
    # A state from another mixture: what differs is named.
    one = qv.Mixture(abc, weights={"a": 0.7, "b": 0.2, "c": 0.1}).to_torch(batch_size=10, seed=1)
    two = qv.Mixture(abc, weights={"a": 0.6, "b": 0.3, "c": 0.1}).to_torch(batch_size=10, seed=1)
    with pytest.raises(qv.ValidationError, match="its schedule is"):
        two.load_state_dict(one.state_dict())
    three = qv.Mixture(abc, weights={"a": 0.7, "b": 0.2, "c": 0.1}).to_torch(batch_size=10, seed=2)
    with pytest.raises(qv.ValidationError, match="its seed is 1, this one's 2"):
        three.load_state_dict(one.state_dict())


def test_torchrun_ranks_read_disjoint_rows_in_equal_batch_counts(abc, tmp_path):
    """docs/mixing.md's DDP example under torchrun, 2 processes (gloo)."""
    _torch()
    guide = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "mixing.md")).read()
    script = guide.split("```python ddp\n", 1)[1].split("```", 1)[0]
    (tmp_path / "mix_ddp.py").write_text(script)
    env = dict(os.environ, SETS=json.dumps({k: v.path for k, v in abc.items()}), OUT=str(tmp_path))
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(_free_port()), str(tmp_path / "mix_ddp.py")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert seen[0]["batches"] == seen[1]["batches"] > 0
    assert not set(seen[0]["ids"]) & set(seen[1]["ids"])
    union = set(seen[0]["ids"]) | set(seen[1]["ids"])
    assert len(union) == seen[0]["planned"] and set(range(20_000, 20_100)) <= union


def test_placing_rows_checks_every_run_before_writing():
    """`place_rows` against the rows worked out here: a window of two parts read through
    its order into two chunks, each run's rows to the places a layout gives them."""
    from quiver._quiver import place_rows
    parts = [[np.arange(3, dtype=np.float64).view(np.uint8)], [np.arange(3, 5, dtype=np.float64).view(np.uint8)]]
    perm = np.array([4, 0, 3, 1, 2], dtype=np.int64)  # in order: 4, 0, 3, 1, 2
    one, two = np.zeros(3), np.zeros(4)
    outs = [[one.view(np.uint8)], [two.view(np.uint8)]]
    places = np.array([1, 0, 2, 0, 1], dtype=np.int64)
    # Rows 0-1 (4, 0) to chunk one's rows 1, 0; rows 2-4 (3, 1, 2) to chunk two's rows 1 + 2, 1 + 0, 1 + 1.
    runs = np.array([[0, 0, 2, 0, 0], [1, 2, 3, 1, 2]], dtype=np.int64)
    place_rows(outs, [3, 4], parts, perm, runs, places, [8])
    assert one.tolist() == [0.0, 4.0, 0.0] and two.tolist() == [0.0, 1.0, 2.0, 3.0]
    place_rows(outs, [3, 4], parts, None, np.array([[0, 3, 2, 0, 0]], dtype=np.int64), places, [8])
    assert one.tolist() == [4.0, 3.0, 0.0], "without an order, the rows as read"
    one[:], two[:] = -1, -1
    bad = [
        (perm, [[0, 0, 2, 0, 0], [1, 2, 4, 0, 0]], r"run 1 reads rows 2..6 of the window's 5"),
        (perm, [[2, 0, 1, 0, 0]], "run 0 writes chunk 2 of 2"),
        (perm, [[0, 0, 2, 0, 4]], r"run 0 takes places 4..6 of 5"),
        (perm, [[0, 0, 2, 2, 0]], r"run 0 puts a row at 2 \+ 1, outside chunk 0's 3 rows"),
        (perm, [[0, -1, 2, 0, 0]], "run 0 has a negative field"),
        (np.array([0, 1, 2, 3, 5], dtype=np.int64), [[0, 0, 1, 0, 0]], r"`perm\[4\]` is 5, not a row of the window's 5"),
        (np.array([0, 1], dtype=np.int64), [[0, 0, 1, 0, 0]], "`perm` orders 2 rows; the window has 5"),
    ]
    for order, table, message in bad:
        with pytest.raises(ValueError, match=message):
            place_rows(outs, [3, 4], parts, order, np.array(table, dtype=np.int64), places, [8])
    # A chunk that is also what is read (`places`, a part): refused, not written through.
    shared = np.array([1, 0], dtype=np.int64)
    with pytest.raises(ValueError, match="chunk 0's column 0 shares memory with `places`"):
        place_rows([[shared.view(np.uint8)]], [2], [[np.array([2.0 ** 40, 7.0]).view(np.uint8)]], None,
                   np.array([[0, 0, 2, 0, 0]], dtype=np.int64), shared, [8])
    with pytest.raises(ValueError, match="chunk 1's column 0 shares memory with part 0's column 0"):
        place_rows([outs[0], [parts[0][0][8:]]], [3, 2], parts, None, np.zeros((0, 5), dtype=np.int64), places, [8])
    with pytest.raises(ValueError, match="part 1's column 0 is not whole rows of 8 bytes"):
        place_rows(outs, [3, 4], [parts[0], [np.zeros(12, dtype=np.uint8)]], None, np.zeros((0, 5), dtype=np.int64), places, [8])
    with pytest.raises(ValueError, match="chunk 1's column 0 is not a writable C-contiguous buffer of 5 rows"):
        place_rows(outs, [3, 5], parts, None, np.zeros((0, 5), dtype=np.int64), places, [8])
    assert one.tolist() == [-1.0] * 3 and two.tolist() == [-1.0] * 4, "nothing written before the runs are checked"
