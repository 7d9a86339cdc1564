"""Monitoring from Python (docs/monitoring.md): thresholds defined in Python equal YAML's,
and ``store.monitor``'s statistics against numpy over the same rows — PSI equal to the
direct computation over the same bins to 1e-9 and KS exact while the sketch holds every
value, bin shares and KS within the sketch's rank error beyond it — with the drift
injected found and nothing raised where nothing moved."""
import json
import os
import subprocess
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pytest

import quiver as qv

QUIVER = os.environ.get("QUIVER_BIN", os.path.expanduser("~/.cache/quiver/target/debug/quiver"))
JAN = datetime(2026, 1, 1, tzinfo=timezone.utc)
FEB = datetime(2026, 2, 1, tzinfo=timezone.utc)
WINDOWS = dict(reference="offline:2026-01-01..2026-02-01", current="offline:2026-02-01..2026-03-01")

YAML = """entities:
  - name: user
    join_keys: [{name: user_id, dtype: int64}]
feature_views:
  - name: big
    entities: [user]
    monitoring: {psi: 0.25}
    features:
      - {name: x, dtype: float64, monitoring: {ks: 0.05}}
      - {name: c, dtype: string}
  - name: small
    entities: [user]
    features:
      - {name: y, dtype: float64}
feature_services:
  - name: model
    features: [big:x, big:c, small:y]
    monitoring: {null_rate: 0.2}
"""


def new_repo(path):
    res = subprocess.run([QUIVER, "init", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return path


def definitions():
    user = qv.Entity(name="user", join_keys=[qv.Field("user_id", qv.Int64)])
    big = qv.FeatureView(name="big", entities=[user], monitoring={"psi": 0.25},
                         schema=[qv.Field("x", qv.Float64, monitoring={"ks": 0.05}), qv.Field("c", qv.String)])
    small = qv.FeatureView(name="small", entities=[user], schema=[qv.Field("y", qv.Float64)])
    model = qv.FeatureService(name="model", features=["big:x", "big:c", "small:y"], monitoring={"null_rate": 0.2})
    return [user, big, small, model]


def table(start, n, rng, **columns):
    times = [start + timedelta(seconds=int(s)) for s in rng.integers(0, 27 * 86400, n)]
    return pa.table({"user_id": np.arange(n) % 500, "event_timestamp": pa.array(times, pa.timestamp("us", "UTC")), **columns})


def shares(values, edges):
    """Each bin's share: bin k holds values above edge k-1 up to edge k."""
    return np.bincount(np.searchsorted(edges, values, side="left"), minlength=len(edges) + 1) / len(values)


def psi(r, c):
    r, c = np.maximum(r, 1e-4), np.maximum(c, 1e-4)
    return float(np.sum((c - r) * np.log(c / r)))


def exact_ks(a, b):
    a, b = np.sort(a), np.sort(b)
    points = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, points, side="right") / len(a) - np.searchsorted(b, points, side="right") / len(b))))


def test_monitoring_thresholds_from_python_equal_yaml(tmp_path):
    a = new_repo(tmp_path / "a" / "repo")
    (a / "features.yaml").write_text(YAML)
    res = subprocess.run([QUIVER, "--repo", str(a), "apply"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    store = qv.FeatureStore(str(new_repo(tmp_path / "b" / "repo")))
    store.apply(definitions())
    reg = lambda p: json.loads((p / "registry.json").read_text())["definitions"]  # noqa: E731
    assert reg(a) == reg(tmp_path / "b" / "repo")
    assert store.get_feature_view("big") == definitions()[1]
    assert store.get_feature_service("model") == definitions()[3]
    with pytest.raises(qv.ValidationError, match="unknown threshold `psl`"):
        qv.FeatureView(name="v", entities=["user"], schema=[], monitoring={"psl": 1})
    with pytest.raises(TypeError, match="ks must be a number"):
        qv.Field("x", qv.Float64, monitoring={"ks": "high"})
    with pytest.raises(qv.ValidationError, match="join key `id`: has monitoring"):
        qv.Entity(name="e", join_keys=[qv.Field("id", qv.Int64, monitoring={"psi": 1})])
    # No thresholds is none: it reads back from the registry as it was given.
    assert qv.FeatureService(name="s", features=["big:x"], monitoring={}) == qv.FeatureService(name="s", features=["big:x"])
    bad = definitions()
    bad[3] = qv.FeatureService(name="model", features=["big:x"], monitoring={"ks": 2})
    with pytest.raises(qv.ValidationError, match="feature service `model`: monitoring.ks must be between 0 and 1, got 2"):
        store.apply(bad)


def test_monitor_statistics_equal_numpy_over_the_same_rows(tmp_path):
    store = qv.FeatureStore(str(new_repo(tmp_path / "repo")))
    store.apply(definitions())
    rng = np.random.default_rng(5)
    n = 8000
    x_jan, x_feb = rng.normal(0, 1, n), rng.normal(0.35, 1.3, n)
    c_jan = rng.choice(["a", "b", "c", "d"], n, p=[0.4, 0.3, 0.2, 0.1])
    c_feb = rng.choice(["a", "b", "c", "d", "e"], n, p=[0.2, 0.3, 0.2, 0.2, 0.1])
    store.ingest("big", table(JAN, n, rng, x=x_jan, c=c_jan))
    store.ingest("big", table(FEB, n, rng, x=x_feb, c=c_feb))
    # Fewer values than the sketch holds: every statistic is exact.
    y_jan, y_feb = rng.exponential(1.0, 150), rng.exponential(1.0, 150) * 1.1
    y_feb_nulls = pa.array([None if i % 10 == 0 else v for i, v in enumerate(y_feb)], pa.float64())
    store.ingest("small", table(JAN, 150, rng, y=y_jan))
    store.ingest("small", table(FEB, 150, rng, y=y_feb_nulls))

    report = store.monitor(**WINDOWS, feature_service="model")
    assert report["reference"].startswith("offline:2026-01-01T00:00:00Z..") and report["service"] == "model"
    by = {f["feature"]: f for f in report["features"]}

    # Exact while the sketch holds every value: PSI to 1e-9 over the same bins, KS exact.
    y = by["small:y"]
    edges = np.array(y["bins"]["edges"])
    present = y_feb[np.arange(150) % 10 != 0]
    assert np.allclose(y["bins"]["reference"], shares(y_jan, edges), atol=1e-12, rtol=0)
    assert np.allclose(y["bins"]["current"], shares(present, edges), atol=1e-12, rtol=0)
    assert abs(y["psi"] - psi(shares(y_jan, edges), shares(present, edges))) <= 1e-9
    assert abs(y["ks"] - exact_ks(y_jan, present)) <= 1e-12
    assert y["null_rate"] == {"reference": 0.0, "current": 15 / 150}
    # The reference's deciles: values of its own at 10%, ..., 90%.
    assert all(e in set(y_jan) for e in edges) and len(edges) == 9
    assert y["limits"] == {"psi": 0.2, "ks": 0.1, "null_rate": 0.2}
    assert y["breaches"] == []  # a 10-point null-rate rise is within the service's 0.2

    # Beyond it: within the sketch's rank error; PSI still exactly the formula over the
    # shares it reports.
    x = by["big:x"]
    edges = np.array(x["bins"]["edges"])
    assert np.max(np.abs(np.array(x["bins"]["reference"]) - shares(x_jan, edges))) <= 0.01
    assert np.max(np.abs(np.array(x["bins"]["current"]) - shares(x_feb, edges))) <= 0.01
    assert abs(x["psi"] - psi(np.array(x["bins"]["reference"]), np.array(x["bins"]["current"]))) <= 1e-9
    assert abs(x["psi"] - psi(shares(x_jan, edges), shares(x_feb, edges))) <= 0.02
    assert abs(x["ks"] - exact_ks(x_jan, x_feb)) <= 0.02
    assert x["limits"]["psi"] == 0.25 and x["limits"]["ks"] == 0.05
    assert "ks" in x["breaches"]

    # Categories counted exactly: PSI over the reference's categories and "other" ("e").
    c = by["big:c"]
    assert c["categories"]["values"] == ["a", "b", "c", "d", "(other)"]
    r = [np.mean(c_jan == v) for v in "abcd"] + [0.0]
    k = [np.mean(c_feb == v) for v in "abcd"] + [np.mean(c_feb == "e")]
    assert abs(c["psi"] - psi(np.array(r), np.array(k))) <= 1e-9
    assert c["ks"] is None and c["breaches"] == ["psi"]

    # The stored report is the one returned.
    stored = list((tmp_path / "repo" / ".quiver" / "monitor").glob("*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text()) == report

    with pytest.raises(qv.ValidationError, match="give exactly one of"):
        store.monitor(**WINDOWS)
    with pytest.raises(qv.ValidationError, match="nothing logged for view `big`"):
        store.monitor(reference=WINDOWS["reference"], current="serving:1h..now", features=["big:x"])
    with pytest.raises(qv.NotFoundError, match="big:nope"):
        store.monitor(**WINDOWS, features=["big:nope"])


def test_current_values_are_counted_exactly_and_nan_and_infinities_are_values(tmp_path):
    """Past the sketch's capacity the current window's bin shares are still exact (its
    values counted into the reference's bins), so PSI equals numpy's over the report's
    bins to 1e-9; NaN and the infinities are values (not nulls), in no bin, counted
    apart in ``non_finite_rate``."""
    store = qv.FeatureStore(str(new_repo(tmp_path / "repo")))
    store.apply(definitions())
    rng = np.random.default_rng(9)
    n = 6000
    x_jan, x_feb = rng.normal(0, 1, n), rng.normal(0.2, 1.1, n)
    x_feb[:30], x_feb[30:40], x_feb[40:45] = np.nan, np.inf, -np.inf
    feb = pa.array([None if i == 45 else float(v) for i, v in enumerate(x_feb)], pa.float64())
    c = rng.choice(["a", "b"], n)
    store.ingest("big", table(JAN, n, rng, x=x_jan, c=c))
    store.ingest("big", table(FEB, n, rng, x=feb, c=c))

    x = store.monitor(**WINDOWS, features=["big:x"])["features"][0]
    present = x_feb[np.isfinite(x_feb) & (np.arange(n) != 45)]
    edges = np.array(x["bins"]["edges"])
    assert "current_error" not in x["bins"], x["bins"]
    assert np.allclose(x["bins"]["current"], shares(present, edges), atol=1e-12, rtol=0)
    assert abs(x["psi"] - psi(np.array(x["bins"]["reference"]), shares(present, edges))) <= 1e-9
    assert x["null_rate"] == {"reference": 0.0, "current": 1 / n}
    assert x["non_finite_rate"] == {"reference": 0.0, "current": 45 / n}
    assert x["count"] == {"reference": n, "current": n}
