"""The soak's checks and report (bench/soak.py; docs/soak.md): what the data says after
the run — each view's Delta table, the dead letters, `verify`, the serving log against an
arrival oracle, the reproduced export — and the per-phase figures.
"""
import hashlib
import json
import os
import time

TIMEOUT = 5.0
GRACE = 10.0
ARRIVAL_LAG = 2.0
DRIVERS = 500
# Answers that are not failures: 202 is a push committed offline whose online write the
# server keeps until Redis takes it (docs/online.md#push-when-the-online-store-fails).
OK = (200, 202)


def wait_until(what, done, limit=60.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if done():
            return time.monotonic()
        time.sleep(0.1)
    raise SystemExit(f"soak: {what} did not happen within {limit:.0f} s")



def pending_rows(port):
    """`quiver_push_online_pending_rows` of the server on `port` (None: no answer)."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("quiver_push_online_pending_rows "):
            return int(float(line.split()[1]))
    return None


class Checks:
    """The checks of a `Soak` (its processes, repository, requests and faults)."""

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
        # A push answered 202 (its online write pending) is written by its server once
        # Redis takes it: the servers finish those before they stop.
        for port in self.server_ports:
            try:
                wait_until(f"the pushes pending on {port} written online", lambda p=port: pending_rows(p) == 0, limit=60)
            except SystemExit as e:
                checks[f"pending pushes on {port}"] = str(e)
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
        # A live stream is judged by arrival: an answer is right when it is what the
        # offline store held within ARRIVAL_LAG of its request (docs/consistency.md). Every
        # answer outside the fault windows must replay equal; inside them online may trail
        # (a batch committed offline whose online write died with its consumer, until the
        # group gives its partitions to a live one), counted per fault.
        checks["verify --since --as-arrived, outside fault windows"] = self.replay_outside()
        checks[f"served trips as they had arrived (within {ARRIVAL_LAG} s)"] = self.arrival_check("trips")
        checks["export reproduces byte for byte"] = self.reproduce()
        failed_actions = [f"{what}: {out}" for _, what, rc, _, out in self.actions if rc and what != "materialize-incremental"]
        checks["applies and export"] = "ok" if not failed_actions else "; ".join(failed_actions)
        slow = [r for r in self.requests if r[1] >= TIMEOUT]
        checks["no request hung"] = "ok" if not slow else f"{len(slow)} requests took {TIMEOUT} s or more"
        windows = [(f["start"] - 0.5, f.get("recovered", f["start"]) + GRACE) for f in self.faults]
        pending = sum(r[2] == 202 for r in self.requests)
        self.pushes_pending = pending
        outside = [r for r in self.requests if r[2] not in OK and not any(lo <= r[0] <= hi for lo, hi in windows)]
        checks["failures only in fault windows"] = "ok" if not outside else \
            f"{len(outside)} failed outside: {[(round(r[0] - self.began, 1), r[2], r[3]) for r in outside[:5]]}"
        report = self.report(checks)
        return report

    def replay(self, lo, hi):
        """`verify --since lo --until hi --as-arrived` (monotonic times): (disagreeing,
        compared, output)."""
        import re
        from datetime import datetime, timezone
        wall = self.faults[0]["wall"] if self.faults else time.time() - time.monotonic()
        text = lambda t: datetime.fromtimestamp(t + wall, timezone.utc).isoformat()  # noqa: E731
        rc, out, _ = self.q("verify", "--since", text(lo), "--until", text(hi), "--as-arrived", "--arrival-lag", str(ARRIVAL_LAG))
        m = re.search(r"(\d+) of (\d+) compared values disagree", out)
        if m:
            return int(m.group(1)), int(m.group(2)), out
        if "nothing logged" in out:
            return 0, 0, out
        return None, 0, out

    def replay_outside(self):
        """The serving log replayed as arrived between the fault windows (0 may
        disagree), and in each window (counted in the fault's report)."""
        end = self.load_end
        windows = sorted((f["start"] - 0.5, f.get("recovered", f["start"]) + GRACE, f) for f in self.faults)
        quiet, at = [], self.began
        for lo, hi, _ in windows:
            if lo > at:
                quiet.append((at, lo))
            at = max(at, hi)
        if end > at:
            quiet.append((at, end))
        bad, compared, problems = 0, 0, []
        for lo, hi in quiet:
            n, m, out = self.replay(lo, hi)
            if n is None:
                problems.append(out[-300:])
                continue
            bad, compared = bad + n, compared + m
            if n:
                problems.append(out[-1200:])
        for lo, hi, f in windows:
            n, m, _ = self.replay(lo, hi)
            f["replay_disagree"] = None if n is None else f"{n} of {m}"
        self.replayed_outside = compared
        if problems:
            return f"{bad} of {compared} compared values disagree: " + " | ".join(problems)
        return "ok" if compared else "no answers logged outside fault windows"

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
        # Freshness, from the data: an event's time to its Delta commit (the stream writes
        # online at the same time), the late events (produced two hours old) left out.
        ages, quiet_ages, by_minute = [], [], {}
        start_us = (self.began + self.wall_offset) * 1e6
        for rows in per.values():
            for commit, ev in rows:
                age = (commit - ev) / 1e6
                if age < 3600:
                    ages.append(age)
                    if not any(a <= commit <= b for a, b in windows):
                        quiet_ages.append(age)
                        by_minute.setdefault(int((commit - start_us) // 60e6), []).append(age)
        pick = lambda xs, q: round(sorted(xs)[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None  # noqa: E731
        self.freshness = {"p50_s": pick(ages, 0.5), "p99_s": pick(ages, 0.99), "p99_outside_fault_windows_s": pick(quiet_ages, 0.99)}
        self.freshness_by_minute = {m: pick(xs, 0.99) for m, xs in by_minute.items()}
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
            errors = sum(r[2] not in OK for r in rows)
            return {"requests": len(rows), "p50_ms": q(0.5), "p99_ms": q(0.99),
                    "error_rate": round(errors / len(rows), 4) if rows else 0.0}
        windows = [(f, f["start"] - 0.5, f.get("recovered", f["start"]) + GRACE) for f in self.faults]
        inside = lambda r: any(lo <= r[0] <= hi for _, lo, hi in windows)  # noqa: E731
        head = [r for r in self.requests if r[0] < self.baseline_end]
        # The quiet tail: after the last fault's window closed (no fault starts in it).
        tail = [r for r in self.requests if r[0] >= self.tail_begin and not inside(r)]
        baseline = head + tail
        quiet = [r for r in self.requests if self.baseline_end <= r[0] < self.tail_begin and not inside(r)]
        phases = {"baseline (no faults)": phase(baseline), "quiet": phase(quiet)}
        for kind in sorted({f["kind"] for f in self.faults}):
            rows = [r for r in self.requests if any(f["kind"] == kind and lo <= r[0] <= hi for f, lo, hi in windows)]
            phases[kind] = phase(rows)
        duration = self.args.minutes * 60
        # Lookups' p99 outside fault windows against the quiet run's (the issue's bound: 1.3x).
        lookups = lambda rows: phase([r for r in rows if r[3].startswith("lookup")])  # noqa: E731
        base_p99, quiet_p99 = lookups(baseline)["p99_ms"], lookups(quiet)["p99_ms"]
        ratio = round(quiet_p99 / base_p99, 3) if base_p99 and quiet_p99 else None
        head_p99, tail_p99 = lookups(head)["p99_ms"], lookups(tail)["p99_ms"]
        head_ratio = round(quiet_p99 / head_p99, 3) if head_p99 and quiet_p99 else None
        if self.args.latency_check:
            checks["lookups' p99 outside fault windows within 1.3x the quiet run's"] = \
                "ok" if ratio is not None and ratio <= 1.3 else f"{quiet_p99} ms against {base_p99} ms ({ratio}x)"
        # Minute by minute, outside fault windows: lookups' p99, freshness p99 of `trips`, and
        # the CPU seconds per second each part used (where the later minutes' time goes).
        by_minute = []
        for m in range(int(duration // 60 + 0.999)):
            lo, hi = self.began + 60 * m, self.began + 60 * (m + 1)
            rows = [r for r in quiet + baseline if lo <= r[0] < hi]
            cpu: dict = {}
            for row in getattr(self, "cpu", []):
                if lo < row["t"] <= hi:
                    for k, v in row.items():
                        if k != "t":
                            cpu[k] = cpu.get(k, 0.0) + v
            span = min(hi, self.load_end) - lo
            by_minute.append({"minute": m + 1, "lookups": lookups(rows)["requests"], "lookup_p99_ms": lookups(rows)["p99_ms"],
                              "freshness_p99_s": getattr(self, "freshness_by_minute", {}).get(m),
                              "cpu_per_s": {k: round(v / span, 2) for k, v in sorted(cpu.items())} if span > 0 else {}})
        report = {
            "seed": self.args.seed, "minutes": self.args.minutes, "events": len(self.valid) + self.malformed,
            "events_per_second": round((len(self.valid) + self.malformed) / duration, 1),
            "malformed": self.malformed, "faults": len(self.faults),
            "faults_left_out": {"disk-full": self.tmpfs} if getattr(self, "tmpfs", "") else {},
            "answers_checked_as_arrived": getattr(self, "arrival_answers", 0),
            "freshness": getattr(self, "freshness", None),
            "pushes_answered_pending": getattr(self, "pushes_pending", 0),
            "fault_times_s": [{"kind": f["kind"], "at": round(f["start"] - self.began, 1),
                               "recovered": round(f.get("recovered", f["start"]) - self.began, 1)} for f in self.faults],
            "recovery_seconds": [{"kind": f["kind"], "process": f.get("process"),
                                  "seconds": round(f.get("recovered", f["start"]) - f.get("back", f["start"]), 2),
                                  "online_trailed_delta_s": f.get("online_trailed_delta_s"),
                                  "replay_disagree": f.get("replay_disagree")} for f in self.faults],
            "values_replayed_outside_fault_windows": getattr(self, "replayed_outside", 0),
            "phases": phases, "lookup_p99_ms": {"baseline": base_p99, "outside_fault_windows": quiet_p99, "ratio": ratio,
                                                "first_minute": head_p99, "quiet_tail": tail_p99,
                                                "ratio_to_first_minute": head_ratio},
            "by_minute": by_minute,
            "checks": checks,
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
        print(f"lookups' p99: quiet run {base_p99} ms (first part {head_p99} ms, tail {tail_p99} ms), "
              f"outside fault windows {quiet_p99} ms ({ratio}x; {head_ratio}x the first part's)")
        for row in by_minute:
            cpu = " ".join(f"{k} {v}" for k, v in row["cpu_per_s"].items())
            print(f"minute {row['minute']:>3}: lookups {row['lookups']:>5} p99 {row['lookup_p99_ms']} ms, "
                  f"freshness p99 {row['freshness_p99_s']} s; CPU s/s: {cpu}")
        fresh = report["freshness"] or {}
        print(f"freshness (event time to Delta commit, trips): p50 {fresh.get('p50_s')} s, p99 {fresh.get('p99_s')} s, "
              f"p99 outside fault windows {fresh.get('p99_outside_fault_windows_s')} s")
        for f in report["recovery_seconds"]:
            print(f"fault {f['kind']:<17} answering again {f['seconds']:>5} s after it came back; "
                  f"online trailed Delta until {f['online_trailed_delta_s']} s after; "
                  f"replayed values disagreeing in its window: {f['replay_disagree']}")
        for name, result in checks.items():
            print(f"{'PASS' if result == 'ok' else 'FAIL'} {name}{'' if result == 'ok' else ': ' + result}")
        return report
