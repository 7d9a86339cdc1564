"""OpenLineage events of the jobs (docs/lineage.md), from the `quiver` binary: every event
validates against the published 2-0-2 schemas and standard facets (../shared/openlineage,
no network), runs pair START with COMPLETE or FAIL, the column lineage of a write-time
expression names the raw column it reads, and the dataset version is the Delta
version written.

    QUIVER_BIN=<quiver binary> pytest python/tests/test_lineage.py
"""

import glob
import json
import os
import subprocess

import pytest

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = os.path.join(HERE, "..", "..", "..", "shared", "openlineage")
QUIVER = os.environ.get("QUIVER_BIN", os.path.expanduser("~/.cache/quiver/target/debug/quiver"))


def registry():
    """Every schema of the spec folder under its `$id`."""
    resources = []
    for path in [os.path.join(SPEC, "OpenLineage.json"), *glob.glob(os.path.join(SPEC, "facets", "*.json"))]:
        schema = json.load(open(path))
        resources.append((schema["$id"], referencing.Resource.from_contents(schema)))
    return referencing.Registry().with_resources(resources)


def validate(event, reg):
    """The event against RunEvent, and each standard facet against its own schema."""
    run_event = {"$ref": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"}
    jsonschema.Draft202012Validator(run_event, registry=reg).validate(event)
    facets = [*event["run"].get("facets", {}).values(), *event["job"].get("facets", {}).values()]
    for d in event.get("inputs", []) + event.get("outputs", []):
        facets += d.get("facets", {}).values()
    checked = 0
    for facet in facets:
        url = facet["_schemaURL"]
        if url.startswith("https://openlineage.io/"):
            jsonschema.Draft202012Validator({"$ref": url}, registry=reg).validate(facet)
            checked += 1
    return checked


def quiver(cwd, *args, ok=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    run = subprocess.run([QUIVER, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if ok:
        assert run.returncode == 0, run.stdout + run.stderr
    return run


def events(repo, job=None):
    """The events in the repository's lineage file, of `job` when named."""
    with open(os.path.join(repo, "lineage.jsonl")) as fh:
        every = [json.loads(line) for line in fh]
    return [e for e in every if job is None or e["job"]["name"] == job]


@pytest.fixture()
def repo(tmp_path):
    quiver(tmp_path, "init", "demo", "--demo")
    repo = tmp_path / "demo"
    with open(repo / "quiver.yaml", "a") as fh:
        fh.write("lineage:\n  transport: file\n")
    yaml = (repo / "features.yaml").read_text()
    computed = yaml.replace(
        "      created_timestamp_field: created_timestamp\n    features:\n      - {name: conv_rate, dtype: float64}\n",
        "      created_timestamp_field: created_timestamp\n      raw: [{name: conv_rate, dtype: float64}]\n"
        "    features:\n      - {name: conv_pct, dtype: float64, expr: \"conv_rate * 100\"}\n", 1)
    assert computed != yaml
    (repo / "features.yaml").write_text(computed.replace("driver_hourly:conv_rate", "driver_hourly:conv_pct"))
    quiver(repo, "apply")
    return repo


def test_ingest_events_validate_pair_and_name_their_lineage(repo):
    reg = registry()
    quiver(repo, "ingest", "driver_hourly", "sample_data/driver_hourly.parquet")
    got = events(repo, "ingest.driver_hourly")
    assert [e["eventType"] for e in got] == ["START", "COMPLETE"]
    assert sum(validate(e, reg) for e in got) > 0
    assert got[0]["run"]["runId"] == got[1]["run"]["runId"]
    assert got[1]["job"] == got[0]["job"] or got[1]["job"]["name"] == "ingest.driver_hourly"
    assert got[1]["job"]["namespace"] == "demo"
    [source] = got[1]["inputs"]
    assert (source["namespace"], source["name"]) == ("file", str(repo / "sample_data" / "driver_hourly.parquet"))
    [table] = got[1]["outputs"]
    assert (table["namespace"], table["name"]) == ("file", str(repo / "data" / "driver_hourly"))
    # The version written is the table's latest Delta version.
    commits = sorted(glob.glob(str(repo / "data" / "driver_hourly" / "_delta_log" / "*.json")))
    assert table["facets"]["version"]["datasetVersion"] == str(int(os.path.basename(commits[-1])[:-5]))
    lineage = table["facets"]["columnLineage"]["fields"]
    assert [(f["field"], f["transformations"][0]["subtype"]) for f in lineage["conv_pct"]["inputFields"]] == [("conv_rate", "TRANSFORMATION")]
    assert lineage["conv_pct"]["inputFields"][0]["transformations"][0]["description"] == "conv_rate * 100"
    assert [(f["field"], f["transformations"][0]["subtype"]) for f in lineage["acc_rate"]["inputFields"]] == [("acc_rate", "IDENTITY")]
    names = [f["name"] for f in table["facets"]["schema"]["fields"]]
    assert names == ["driver_id", "event_timestamp", "created_timestamp", "conv_pct", "acc_rate", "avg_daily_trips"]
    assert got[1]["job"]["facets"]["quiver"]["registryVersion"] == 1


def test_a_failed_ingest_is_a_failed_run_with_its_message(repo, tmp_path):
    reg = registry()
    bad = tmp_path / "bad.csv"
    bad.write_text("driver_id,event_timestamp\n1,2024-01-01T00:00:00Z\n")
    run = quiver(repo, "ingest", "driver_hourly", str(bad), ok=False)
    assert run.returncode != 0
    got = events(repo, "ingest.driver_hourly")
    assert [e["eventType"] for e in got] == ["START", "FAIL"]
    for e in got:
        validate(e, reg)
    message = got[1]["run"]["facets"]["errorMessage"]["message"]
    assert str(bad) in message and "missing column" in message, message


def test_apply_and_export_runs_name_what_they_read_and_wrote(repo):
    reg = registry()
    applied = events(repo, "apply")
    assert [e["eventType"] for e in applied] == ["START", "COMPLETE"]
    for e in applied:
        validate(e, reg)
    [source] = applied[1]["inputs"]
    [written] = applied[1]["outputs"]
    assert source["name"] == str(repo / "features.yaml")
    assert (written["name"], written["facets"]["version"]["datasetVersion"]) == (str(repo / "registry.json"), "1")
    for view in ("driver_hourly", "customer_profile", "driver_customer", "customer_rides"):
        quiver(repo, "ingest", view, f"sample_data/{view}.parquet")
    quiver(repo, "export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "train")
    got = events(repo, "export")
    assert [e["eventType"] for e in got] == ["START", "COMPLETE"]
    for e in got:
        validate(e, reg)
    manifest = json.load(open(repo / "train" / "manifest.json"))
    [folder] = got[1]["outputs"]
    assert (folder["name"], folder["facets"]["version"]["datasetVersion"]) == (str(repo / "train"), manifest["training_set_id"])
    assert [f["name"] for f in folder["facets"]["schema"]["fields"]] == [c for c, _ in manifest["schema"]]
    read = {d["name"]: d["facets"].get("version", {}).get("datasetVersion") for d in got[1]["inputs"]}
    for view, version in manifest["delta_versions"].items():
        assert read[str(repo / "data" / view)] == str(version), (view, read)
    fields = folder["facets"]["columnLineage"]["fields"]
    assert [(f["name"], f["field"]) for f in fields["driver_hourly__conv_pct"]["inputFields"]] == [(str(repo / "data" / "driver_hourly"), "conv_pct")]
    assert [(f["name"], f["field"]) for f in fields["customer_rides__rides_7d"]["inputFields"]] == [(str(repo / "data" / "customer_rides"), "fare")]
    assert set(fields) == {c for c, _ in manifest["schema"]}


def test_materialize_and_backfill_runs_name_tables_versions_and_keys(repo):
    reg = registry()
    quiver(repo, "ingest", "driver_hourly", "sample_data/driver_hourly.parquet")
    quiver(repo, "materialize", "2000-01-01T00:00:00Z", "now")
    got = events(repo, "materialize")
    assert [e["eventType"] for e in got] == ["START", "COMPLETE"]
    for e in got:
        validate(e, reg)
    read = {d["name"]: d["facets"].get("version", {}).get("datasetVersion") for d in got[1]["inputs"]}
    assert read[str(repo / "data" / "driver_hourly")] == "1"
    keys = {d["name"] for d in got[1]["outputs"]}
    assert "quiver:demo:driver_hourly:" in keys and "quiver:demo:customer_rides:" in keys, keys
    # A backfill of version 2 from version 1 (a type widened): the one table into the other.
    quiver(repo, "ingest", "driver_customer", "sample_data/driver_customer.parquet")
    yaml = (repo / "features.yaml").read_text()
    (repo / "features.yaml").write_text(yaml.replace("{name: avg_rating, dtype: float32}", "{name: avg_rating, dtype: float64}", 1))
    quiver(repo, "apply")
    quiver(repo, "backfill", "driver_customer@2")
    got = events(repo, "backfill.driver_customer@2")
    assert [e["eventType"] for e in got] == ["START", "COMPLETE"]
    for e in got:
        validate(e, reg)
    [source] = got[1]["inputs"]
    [target] = got[1]["outputs"]
    assert (source["name"], source["facets"]["version"]["datasetVersion"]) == (str(repo / "data" / "driver_customer"), "1")
    assert (target["name"], target["facets"]["version"]["datasetVersion"]) == (str(repo / "data" / "driver_customer.v2"), "1")
    lineage = target["facets"]["columnLineage"]["fields"]
    assert [(f["name"], f["field"]) for f in lineage["avg_rating"]["inputFields"]] == [(source["name"], "avg_rating")]


def test_a_historical_join_names_its_spine_tables_and_output(repo):
    reg = registry()
    quiver(repo, "ingest", "driver_hourly", "sample_data/driver_hourly.parquet")
    quiver(repo, "historical", "--features", "driver_hourly:conv_pct", "--spine", "sample_data/spine.parquet", "--out", "joined.parquet")
    got = events(repo, "historical")
    assert [e["eventType"] for e in got] == ["START", "COMPLETE"]
    for e in got:
        validate(e, reg)
    read = {d["name"]: d["facets"].get("version", {}).get("datasetVersion") for d in got[1]["inputs"]}
    assert read == {str(repo / "sample_data" / "spine.parquet"): None, str(repo / "data" / "driver_hourly"): "1"}, read
    assert [d["name"] for d in got[1]["outputs"]] == [str(repo / "joined.parquet")]


def test_a_push_names_its_file_table_version_and_keys(repo):
    import datetime
    reg = registry()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    (repo / "row.jsonl").write_text(json.dumps({"driver_id": 1001, "event_timestamp": now, "created_timestamp": now,
                                                "conv_rate": 0.5, "acc_rate": 0.5, "avg_daily_trips": 3}) + "\n")
    quiver(repo, "push", "driver_hourly", "row.jsonl")
    got = events(repo, "push.driver_hourly")
    assert [e["eventType"] for e in got] == ["START", "COMPLETE"]
    for e in got:
        validate(e, reg)
    assert [d["name"] for d in got[1]["inputs"]] == [str(repo / "row.jsonl")]
    table, keys = got[1]["outputs"]
    commits = sorted(glob.glob(str(repo / "data" / "driver_hourly" / "_delta_log" / "*.json")))
    assert (table["name"], table["facets"]["version"]["datasetVersion"]) == (str(repo / "data" / "driver_hourly"), str(int(os.path.basename(commits[-1])[:-5])))
    assert keys["name"] == "quiver:demo:driver_hourly:" and keys["namespace"].startswith("file://"), keys


@pytest.mark.parametrize("section, key", [
    ("lineage:\n  transport: kafka\n", "lineage.transport `kafka`"),
    ("lineage:\n  transport: http\n  url: not a url\n", "lineage.url `not a url`"),
    ("lineage:\n  transport: http\n", "lineage.url: missing"),
])
def test_a_bad_lineage_setting_is_refused_at_load_naming_the_key(tmp_path, section, key):
    quiver(tmp_path, "init", "demo", "--demo")
    repo = tmp_path / "demo"
    with open(repo / "quiver.yaml", "a") as fh:
        fh.write(section)
    run = quiver(repo, "apply", ok=False)
    assert run.returncode != 0 and key in run.stderr, run.stderr


# ---- the http transport, and the server's pushes as one long-running run ----------------

import socket
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A Marquez-like endpoint on loopback: `record` keeps each event (and the request's
    Authorization), `stall` never answers until the mode changes, `fail` answers 500,
    `refuse` 400."""

    def __init__(self):
        self.mode, self.events, self.auth, self.attempts = "record", [], set(), 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.attempts += 1
                while outer.mode == "stall":
                    time.sleep(0.02)
                if outer.mode in ("fail", "refuse"):
                    self.send_response(500 if outer.mode == "fail" else 400)
                    self.end_headers()
                    return
                outer.events.append(json.loads(body))
                outer.auth.add(self.headers.get("Authorization"))
                try:
                    self.send_response(201)
                    self.end_headers()
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/lineage"

    def close(self):
        self.mode = "record"
        self.server.shutdown()


def with_http(repo, url, **extra):
    text = (repo / "quiver.yaml").read_text()
    text = text[:text.index("lineage:\n")]  # the section is the file's last
    settings = "".join(f"  {k}: {v}\n" for k, v in {"transport": "http", "url": url, **extra}.items())
    (repo / "quiver.yaml").write_text(text + "lineage:\n" + settings)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_transport_posts_each_event_with_the_token(repo):
    reg = registry()
    receiver = Receiver()
    try:
        with_http(repo, receiver.url, token="s3cret")
        quiver(repo, "ingest", "driver_hourly", "sample_data/driver_hourly.parquet")
        got = [e for e in receiver.events if e["job"]["name"] == "ingest.driver_hourly"]
        assert [e["eventType"] for e in got] == ["START", "COMPLETE"]
        for e in got:
            validate(e, reg)
        assert receiver.auth == {"Bearer s3cret"}
    finally:
        receiver.close()


def test_a_dead_or_stalled_endpoint_never_fails_or_holds_a_job(repo):
    # Nothing listens on the port: the ingest completes at once and says so on stderr.
    with_http(repo, f"http://127.0.0.1:{free_port()}/api/v1/lineage", timeout="1s", retries=1)
    started = time.monotonic()
    run = quiver(repo, "ingest", "driver_hourly", "sample_data/driver_hourly.parquet")
    assert time.monotonic() - started < 10
    assert "lineage endpoint failing" in run.stderr, run.stderr
    assert (repo / "data" / "driver_hourly" / "_delta_log").exists()
    # An endpoint that takes the connection and never answers: the job ends within its timeout.
    receiver = Receiver()
    receiver.mode = "stall"
    try:
        with_http(repo, receiver.url, timeout="5s", retries=0)
        started = time.monotonic()
        run = quiver(repo, "ingest", "driver_hourly", "sample_data/driver_hourly.parquet")
        # The exit waits on an unanswered attempt half a second at most, not its 5s timeout.
        assert time.monotonic() - started < 3, "a stalled endpoint held the job"
        assert "dropped" in run.stderr or "failing" in run.stderr, run.stderr
        assert receiver.events == []
    finally:
        receiver.close()


def metric(port, outcome):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f'quiver_lineage_events_total{{outcome="{outcome}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no lineage counter {outcome} in /metrics:\n{text}")


def push(port, n):
    import datetime
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {"feature_view": "driver_hourly", "to": "online_and_offline",
            "df": {"driver_id": [1001 + n], "event_timestamp": [now], "created_timestamp": [now],
                   "conv_rate": [0.5], "acc_rate": [0.25], "avg_daily_trips": [n]}}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/push", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    started = time.monotonic()
    answer = json.loads(urllib.request.urlopen(request, timeout=10).read())
    return answer, time.monotonic() - started


def serve(repo, port):
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    proc = subprocess.Popen([QUIVER, "serve", "--port", str(port)], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("quiver serve did not start: " + proc.communicate()[1])


def stop(proc):
    import signal
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def wait(what, done, limit=20):
    deadline = time.monotonic() + limit
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_server_pushes_are_one_run_batched_per_interval(repo):
    reg = registry()
    quiver(repo, "ingest", "driver_hourly", "sample_data/driver_hourly.parquet")
    with open(repo / "quiver.yaml", "a") as fh:
        fh.write("  interval: 1s\n")
    port = free_port()
    proc = serve(repo, port)
    try:
        answers = [push(port, n)[0] for n in range(20)]
    finally:
        stop(proc)
    got = events(repo, "serve.push")
    kinds = [e["eventType"] for e in got]
    # One run: START, RUNNING per interval with pushes (never one per request), COMPLETE.
    assert kinds[0] == "START" and kinds[-1] == "COMPLETE" and set(kinds[1:-1]) <= {"RUNNING"}, kinds
    assert len(got) < 20, f"{len(got)} events for 20 pushes"
    assert len({e["run"]["runId"] for e in got}) == 1
    for e in got:
        validate(e, reg)
    written = [d for e in got[1:] for d in e["outputs"] if d["name"] == str(repo / "data" / "driver_hourly")]
    last = max(int(d["facets"]["version"]["datasetVersion"]) for d in written)
    assert last == max(a["offline_version"] for a in answers), (last, answers[-1])
    keys = {d["name"] for e in got[1:] for d in e["outputs"]}
    assert "quiver:demo:driver_hourly:" in keys
    [source] = got[0]["inputs"]
    assert (source["namespace"], source["name"]) == (f"http://127.0.0.1:{port}", "/push")


def test_http_events_wait_out_a_stall_and_failures_are_counted_on_metrics(repo):
    reg = registry()
    receiver = Receiver()
    try:
        with_http(repo, receiver.url, timeout="1s", retries=4, interval="1s")
        port = free_port()
        proc = serve(repo, port)
        try:
            wait("the run's START", lambda: len(receiver.events) >= 1)
            # Stalled: pushes are answered as fast as ever; the event waits and is retried.
            receiver.mode = "stall"
            slowest = max(push(port, n)[1] for n in range(5))
            assert slowest < 1.0, f"a push took {slowest:.2f}s behind a stalled lineage endpoint"
            wait("an attempt on the stalled endpoint", lambda: receiver.attempts >= 2)
            receiver.mode = "record"
            wait("the RUNNING event after the stall", lambda: any(e["eventType"] == "RUNNING" for e in receiver.events))
            # Failing (500): retried, then dropped and counted.
            receiver.mode = "fail"
            before = metric(port, "failed")
            for n in range(3):
                push(port, n)
            wait("a failed event on /metrics", lambda: metric(port, "failed") > before, limit=30)
            assert metric(port, "sent") >= 2
            receiver.mode = "record"
        finally:
            stop(proc)
        for e in receiver.events:
            validate(e, reg)
        assert receiver.events[-1]["eventType"] == "COMPLETE"
    finally:
        receiver.close()


def test_the_rust_end_to_end_streams_events_validate():
    """The stream's run (tests/it/stream/lineage.rs, over real Kafka) left its events in
    QUIVER_TEST_LINEAGE_DIR: each validates, and they pair as one run."""
    folder = os.environ.get("QUIVER_TEST_LINEAGE_DIR")
    if not folder:
        assert not os.environ.get("QUIVER_REQUIRE_KAFKA"), "QUIVER_REQUIRE_KAFKA is set but QUIVER_TEST_LINEAGE_DIR is not"
        pytest.skip("no QUIVER_TEST_LINEAGE_DIR (./run test sets it, after the Rust stream tests ran)")
    reg = registry()
    files = glob.glob(os.path.join(folder, "*.jsonl"))
    assert files, f"no lineage events in {folder}: did the Rust stream test run?"
    for path in files:
        got = [json.loads(line) for line in open(path)]
        stream = [e for e in got if e["job"]["name"] == "stream"]
        assert stream[0]["eventType"] == "START" and stream[-1]["eventType"] == "COMPLETE", path
        assert any(e["eventType"] == "RUNNING" for e in stream), path
        assert sum(validate(e, reg) for e in got) > 0


def test_column_lineage_of_on_demand_and_aggregated_features_names_their_inputs(repo):
    """A historical join's output: an on-demand feature from exactly the stored column and
    the spine column its expression reads, an aggregation from its event column."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    reg = registry()
    with open(repo / "features.yaml", "a") as fh:
        fh.write("\non_demand_views:\n  - name: scoring\n    inputs: [driver_hourly]\n"
                 "    request: [{name: amount, dtype: float64}]\n"
                 "    features: [{name: tip, dtype: float64, expr: \"driver_hourly.conv_pct * amount\"}]\n")
    quiver(repo, "apply")
    for view in ("driver_hourly", "customer_rides"):
        quiver(repo, "ingest", view, f"sample_data/{view}.parquet")
    spine = pq.read_table(repo / "sample_data" / "spine.parquet")
    spine = spine.append_column("amount", pa.array([10.0] * spine.num_rows))
    pq.write_table(spine, repo / "spine_amount.parquet")
    quiver(repo, "historical", "--features", "scoring:tip,customer_rides:fare_sum_1h,driver_hourly:acc_rate",
           "--spine", "spine_amount.parquet", "--out", "joined.parquet")
    [done] = [e for e in events(repo, "historical") if e["eventType"] == "COMPLETE"]
    validate(done, reg)
    [out] = done["outputs"]
    fields = out["facets"]["columnLineage"]["fields"]
    table = lambda view: str(repo / "data" / view)
    spine_file = str(repo / "spine_amount.parquet")
    inputs = lambda column: sorted((f["name"], f["field"], f["transformations"][0]["subtype"]) for f in fields[column]["inputFields"])
    assert inputs("scoring__tip") == sorted([(table("driver_hourly"), "conv_pct", "TRANSFORMATION"),
                                             (spine_file, "amount", "TRANSFORMATION")])
    assert fields["scoring__tip"]["inputFields"][0]["transformations"][0]["description"] == "driver_hourly.conv_pct * amount"
    assert inputs("customer_rides__fare_sum_1h") == [(table("customer_rides"), "fare", "TRANSFORMATION")]
    assert inputs("driver_hourly__acc_rate") == [(table("driver_hourly"), "acc_rate", "IDENTITY")]
    assert inputs("driver_id") == [(spine_file, "driver_id", "IDENTITY")]
    written = set(pq.read_schema(repo / "joined.parquet").names)
    assert set(fields) <= written and "scoring__tip" in written


def test_a_training_set_logged_to_mlflow_is_the_runs_input_with_its_id_as_digest(repo, tmp_path, monkeypatch):
    """Against a real local MLflow tracking store (a file store in a temp folder)."""
    mlflow = pytest.importorskip("mlflow")
    import quiver as qv
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for view in ("driver_hourly", "customer_profile", "driver_customer", "customer_rides"):
        quiver(repo, "ingest", view, f"sample_data/{view}.parquet")
    quiver(repo, "export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "train")
    manifest = json.load(open(repo / "train" / "manifest.json"))
    ts = qv.TrainingSet(str(repo / "train"))
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    with mlflow.start_run() as run:
        ts.log_to_mlflow()
    # Read back through a new client, as MLflow's UI would.
    got = mlflow.MlflowClient().get_run(run.info.run_id).inputs.dataset_inputs
    assert len(got) == 1
    dataset, tags = got[0].dataset, {t.key: t.value for t in got[0].tags}
    assert dataset.digest == manifest["training_set_id"]
    assert dataset.name == "train"
    assert json.loads(dataset.source)["uri"] == str(repo / "train" / "manifest.json")
    specs = {c["name"]: c for c in json.loads(dataset.schema)["mlflow_colspec"]}
    columns = {n: c["type"] for n, c in specs.items()}
    assert columns["driver_hourly__conv_pct"] == "double" and columns["driver_id"] == "long", columns
    assert specs["customer_profile__embedding"]["items"] == {"type": "float"}, specs
    assert set(columns) == {c for c, _ in manifest["schema"]}
    assert tags["mlflow.data.context"] == "training"
    assert tags["quiver.registry_version"] == str(manifest["registry_version"])
    assert json.loads(tags["quiver.delta_versions"]) == manifest["delta_versions"]
    assert tags["quiver.service"] == "ranker_v1"
    assert tags["quiver.code_version"] == "unknown"  # the fixture's repository is not in git
    # By run id, to a run that is not active.
    other = mlflow.MlflowClient().create_run(run.info.experiment_id)
    ts.log_to_mlflow(run_id=other.info.run_id, context="eval")
    [again] = mlflow.MlflowClient().get_run(other.info.run_id).inputs.dataset_inputs
    assert again.dataset.digest == manifest["training_set_id"]
    assert {t.key: t.value for t in again.tags}["mlflow.data.context"] == "eval"


def test_a_full_disk_for_the_file_transport_is_logged_and_the_job_completes(repo):
    """The events' file on a full device (/dev/full: every write fails with ENOSPC)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    os.remove(repo / "lineage.jsonl")
    os.symlink("/dev/full", repo / "lineage.jsonl")
    run = quiver(repo, "ingest", "driver_hourly", "sample_data/driver_hourly.parquet")
    assert "lineage event not written" in run.stderr and "No space left on device" in run.stderr, run.stderr
    assert "736 rows" in run.stdout or "ingested" in run.stdout, run.stdout
    commits = glob.glob(str(repo / "data" / "driver_hourly" / "_delta_log" / "*.json"))
    assert len(commits) == 2, commits


def test_a_full_http_queue_drops_events_and_counts_them(repo):
    """lineage.queue bounds what waits in memory: behind a stalled endpoint, events past it
    are dropped (counted on /metrics) and pushes go on."""
    receiver = Receiver()
    receiver.mode = "stall"
    try:
        with_http(repo, receiver.url, timeout="5s", retries=0, queue=1, interval="1s")
        port = free_port()
        proc = serve(repo, port)
        try:
            # START is in flight, one RUNNING waits in the queue, the next ones have no room.
            deadline = time.monotonic() + 20
            while metric(port, "dropped") == 0:
                assert time.monotonic() < deadline, "no event was dropped behind a full queue"
                push(port, 1)
                time.sleep(0.3)
            assert push(port, 2)[1] < 1.0
        finally:
            receiver.mode = "record"
            stop(proc)
    finally:
        receiver.close()


def test_an_endpoint_refusing_an_event_is_not_retried(repo):
    """A 4xx other than 408/429 is the endpoint refusing the event: one attempt each, no
    retries (a 500 would be retried), and the job completes."""
    receiver = Receiver()
    receiver.mode = "refuse"
    try:
        with_http(repo, receiver.url, retries=3)
        run = quiver(repo, "ingest", "driver_hourly", "sample_data/driver_hourly.parquet")
        assert "answered 400" in run.stderr, run.stderr
        time.sleep(0.5)
        assert receiver.attempts in (1, 2), f"{receiver.attempts} attempts for the START and COMPLETE events"
    finally:
        receiver.close()
