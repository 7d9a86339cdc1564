//! Faults and abuse (docs/limits.md, issue 14), against the real `quiver` binary, the real
//! Redis `./run test` starts, and a private `redis-server` where a test needs its own
//! settings. Each test is one mistake or attack a new user or a hostile client makes;
//! each asserts the refusal (a one-line error naming the file, row or field; 4xx or
//! exit 1), that nothing was written, and that serving went on.
//!
//! The streaming faults (a paused consumer fenced, a dead letter the DLQ refuses, a
//! registry change picked up) are in `tests/stream/` (`groups.rs`, `edges.rs`), beside
//! the broker helpers in its `main.rs`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use common::{fails, ok, quiver, request, unique};

const HOUR_US: i64 = 3_600_000_000;

const FEATURES: &str = r#"entities:
  - name: driver
    join_keys: [{name: driver_id, dtype: int64}]
feature_views:
  - name: trips
    entities: [driver]
    ttl: 1h
    online: true
    source: {timestamp_field: event_timestamp}
    features:
      - {name: fare, dtype: float64}
      - {name: seq, dtype: int64}
  - name: audit
    entities: [driver]
    online: false
    source: {timestamp_field: event_timestamp}
    features:
      - {name: fare, dtype: float64}
"#;

fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

fn rfc3339(us: i64) -> String {
    quiver::sdk::types::format_instant(us)
}

/// A repository with [`FEATURES`] applied; `online` is the `online_store:` mapping and
/// `extra` more of `quiver.yaml`.
fn repo(tmp: &Path, online: &str, extra: &str) -> PathBuf {
    let dir = tmp.join("repo");
    std::fs::create_dir_all(&dir).unwrap();
    let project = unique("abuse");
    std::fs::write(
        dir.join("quiver.yaml"),
        format!("project: {project}\nregistry: registry.json\noffline_store:\n  path: data\nonline_store: {online}\n{extra}"),
    )
    .unwrap();
    std::fs::write(dir.join("features.yaml"), FEATURES).unwrap();
    ok(&dir, &["apply"]);
    dir
}

fn embedded() -> &'static str {
    "{type: embedded, path: online.db}"
}

fn redis_online(url: &str) -> String {
    format!("{{type: redis, url: \"{url}\"}}")
}

/// JSON lines of `trips` rows: (driver, event time, fare, seq).
fn write_rows(path: &Path, rows: &[(i64, i64, f64, i64)]) {
    let text: String = rows
        .iter()
        .map(|(d, t, f, s)| format!("{{\"driver_id\": {d}, \"event_timestamp\": \"{}\", \"fare\": {f:?}, \"seq\": {s}}}\n", rfc3339(*t)))
        .collect();
    std::fs::write(path, text).unwrap();
}

/// The rows of a view's Delta table.
fn delta_rows(dir: &Path, view: &str) -> usize {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let repo = quiver::Repo::open(dir).unwrap();
    let defs = repo.applied().unwrap().definitions;
    let view = defs.feature_view(view).unwrap().clone();
    rt.block_on(quiver::offline::historical::read_view(&repo.config, &defs, &view)).unwrap().iter().map(|b| b.num_rows()).sum()
}

/// `quiver serve` in `dir` with its stderr kept; stopped (SIGKILL) when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_quiver"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("QUIVER_")) {
            cmd.env_remove(k);
        }
        cmd.current_dir(dir).args(["serve", "--port", &port.to_string()]).args(extra);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        let began = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(began.elapsed() < Duration::from_secs(30), "server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Server { child, port }
    }

    fn post(&self, path: &str, body: &str) -> (u16, String) {
        request(self.port, "POST", path, &[], body)
    }

    fn get(&self, path: &str) -> (u16, String) {
        request(self.port, "GET", path, &[], "")
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name} in {text}"))
    }

    /// SIGTERM; the exit status, how long it took, and stdout + stderr.
    fn stop(mut self) -> (std::process::ExitStatus, Duration, String) {
        let began = Instant::now();
        assert!(Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().unwrap().success());
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(began.elapsed() < Duration::from_secs(30), "the server did not stop within 30 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = began.elapsed();
        let mut out = String::new();
        self.child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        self.child.stderr.take().unwrap().read_to_string(&mut out).unwrap();
        (status, took, out)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The values and statuses of `features` for one driver, as the server answers.
fn lookup(server: &Server, features: &[&str], driver: i64) -> Vec<(serde_json::Value, String)> {
    let body = serde_json::json!({"entities": {"driver_id": [driver]}, "features": features}).to_string();
    let (code, text) = server.post("/get-online-features", &body);
    assert_eq!(code, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["results"].as_array().unwrap()[1..].iter().map(|r| (r["values"][0].clone(), r["statuses"][0].as_str().unwrap().to_string())).collect()
}

// ---------------------------------------------------------------------------------------

/// `verify --sample` right after `materialize`, on data whose latest rows span more than
/// the TTL plus the key's 24 h grace: expired keys answer NOT_FOUND online, and verify
/// judges them so — no "missing online" on a healthy store (embedded and Redis).
#[test]
fn verify_sample_judges_expired_keys_as_the_lookup_answers_them() {
    let mut stores = vec![embedded().to_string()];
    if let Some(url) = common::redis_url("verify_sample_judges_expired_keys_as_the_lookup_answers_them (redis)") {
        stores.push(redis_online(&url));
    }
    for store in stores {
        let tmp = tempfile::tempdir().unwrap();
        let dir = repo(tmp.path(), &store, "");
        let now = now_us();
        let mut rows = Vec::new();
        for d in 0..60i64 {
            // 0..20: last row 3 days old (expired), 20..40: 2 h (outside max age, within
            // the grace), 40..60: 10 minutes (present). Each has an older row too.
            let age = match d {
                0..20 => 72 * HOUR_US,
                20..40 => 2 * HOUR_US,
                _ => HOUR_US / 6,
            };
            rows.push((d, now - age - 5 * HOUR_US, 1.0, 0));
            rows.push((d, now - age, d as f64 + 0.5, d));
        }
        write_rows(&dir.join("rows.jsonl"), &rows);
        ok(&dir, &["ingest", "trips", "rows.jsonl"]);
        // The 20 whose keys would expire at once are not written, and not counted so.
        let out = ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
        assert!(
            out.contains("trips: 60 entities, 40 written, 20 skipped as already expired (past the ttl and its day of grace)\n"),
            "{store}: {out}"
        );
        let out = ok(&dir, &["verify", "--sample", "60"]);
        assert!(out.contains("0 of 120 compared values disagree"), "{store}: {out}");
        // The expired ones are really NOT_FOUND online, the stale ones OUTSIDE_MAX_AGE.
        let online = |d: i64| ok(&dir, &["online", "--features", "trips:fare", "--entity", &format!("driver_id={d}")]);
        assert!(online(3).contains("NOT_FOUND"), "{}", online(3));
        assert!(online(23).contains("OUTSIDE_MAX_AGE"), "{}", online(23));
        assert!(online(43).contains("PRESENT"), "{}", online(43));
    }
}

/// An event time from the future (after the wall clock plus `max_future_skew`, 5m by
/// default) is refused by ingest, `quiver push` and `/push`, naming the file or row and
/// the field, with nothing written; one minute ahead is fine. A year-9999 row that got
/// into the online store (before writers refused them) is replaced by materialize.
#[test]
fn future_event_times_are_refused_and_never_block_a_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo(tmp.path(), embedded(), "");
    let now = now_us();
    let year_9999 = 253_402_300_799_000_000;
    write_rows(&dir.join("future.jsonl"), &[(1, now - HOUR_US, 1.0, 1), (1, now, 2.0, 2), (1, year_9999, 3.0, 3)]);
    fails(
        &dir,
        &["ingest", "trips", "future.jsonl"],
        &["future.jsonl", "row 3", "event_timestamp", "9999-12-31T23:59:59Z is in the future"],
    );
    fails(&dir, &["push", "trips", "future.jsonl"], &["future.jsonl", "row 3", "is in the future"]);
    assert_eq!(delta_rows(&dir, "trips"), 0, "nothing written");
    let recent = now - 10 * 60_000_000;
    write_rows(&dir.join("good.jsonl"), &[(1, recent, 1.0, 1), (1, now + 60_000_000, 2.0, 2), (2, recent, 5.0, 5)]);
    ok(&dir, &["ingest", "trips", "good.jsonl"]);
    assert_eq!(delta_rows(&dir, "trips"), 3, "a minute ahead is within max_future_skew");

    // /push: 400 naming the row; nothing written in either store.
    ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    let server = Server::start(&dir, &[]);
    let push = |ts: &str| {
        serde_json::json!({"feature_view": "trips", "to": "online_and_offline",
            "df": {"driver_id": [2, 2], "event_timestamp": [rfc3339(now), ts], "fare": [6.0, 7.0], "seq": [6, 7]}})
        .to_string()
    };
    let (code, body) = server.post("/push", &push("9999-12-31T23:59:59Z"));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("row 2") && body.contains("`event_timestamp` 9999-12-31T23:59:59Z is in the future"), "{body}");
    assert_eq!(lookup(&server, &["trips:fare"], 2)[0].0, serde_json::json!(5.0), "nothing pushed online");
    assert_eq!(server.metric("quiver_limit_refusals_total{limit=\"max_future_skew\"}"), 1.0);
    drop(server);
    assert_eq!(delta_rows(&dir, "trips"), 3, "nothing pushed offline");

    // A poisoned key (written straight into the store) is repaired by materialize.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let repo = quiver::Repo::open(&dir).unwrap();
        let defs = repo.applied().unwrap().definitions;
        let view = defs.feature_view("trips").unwrap();
        let store = quiver::online::open_store(&repo.config).await.unwrap();
        let poison = quiver::runtime::rows::ViewRow {
            keys: vec![quiver::runtime::encoding::KeyValue::Int(2)],
            event_ts: year_9999,
            created_ts: None,
            values: vec![quiver::runtime::encoding::Value::Float64(666.0), quiver::runtime::encoding::Value::Int64(666)],
        };
        assert_eq!(store.write(&quiver::online::WriteRow::of_rows(&repo.config.project, view, &[poison])).await.unwrap(), 1);
    });
    let poisoned = ok(&dir, &["online", "--features", "trips:fare", "--entity", "driver_id=2"]);
    assert!(poisoned.contains("666.0"), "{poisoned}");
    ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    let repaired = ok(&dir, &["online", "--features", "trips:fare", "--entity", "driver_id=2"]);
    assert!(repaired.contains("5.0") && repaired.contains("PRESENT"), "{repaired}");
}

/// `max_cells` (entity rows x features) answers 413 before any work; duplicate feature
/// references and features of offline-only views answer 400; the refusals show in
/// `/metrics`.
#[test]
fn oversized_duplicate_and_offline_lookups_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo(tmp.path(), embedded(), "server: {max_cells: 1000}\n");
    let server = Server::start(&dir, &[]);
    let drivers: Vec<i64> = (0..100).collect();
    let many: Vec<String> = (0..11).map(|i| format!("trips:f{i}")).collect();
    let body = serde_json::json!({"entities": {"driver_id": drivers}, "features": many}).to_string();
    let (code, text) = server.post("/get-online-features", &body);
    assert_eq!(code, 413, "{text}");
    assert!(text.contains("100 entity rows x 11 features = 1100 values; at most 1000 per request (server.max_cells)"), "{text}");
    // The default (1,000,000) stops the reported 10,000 x 300 request as well.
    let tmp2 = tempfile::tempdir().unwrap();
    let dir2 = repo(tmp2.path(), embedded(), "");
    let server2 = Server::start(&dir2, &[]);
    let drivers: Vec<i64> = (0..10_000).collect();
    let refs: Vec<String> = (0..300).map(|i| format!("trips:f{i}")).collect();
    let (code, text) =
        server2.post("/get-online-features", &serde_json::json!({"entities": {"driver_id": drivers}, "features": refs}).to_string());
    assert_eq!(code, 413, "{text}");
    assert!(text.contains("3000000 values"), "{text}");
    drop(server2);

    let (code, text) =
        server.post("/get-online-features", r#"{"entities": {"driver_id": [1]}, "features": ["trips:fare", "trips:seq", "trips:fare"]}"#);
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("feature `trips:fare` is asked for twice"), "{text}");
    let (code, text) = server.post("/get-online-features", r#"{"entities": {"driver_id": [1]}, "features": ["audit:fare"]}"#);
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("feature view `audit` is offline only"), "{text}");
    assert_eq!(server.metric("quiver_limit_refusals_total{limit=\"max_cells\"}"), 1.0);
    // And good requests are still answered.
    assert_eq!(lookup(&server, &["trips:fare"], 1)[0].1, "NOT_FOUND");
}

/// Connections that send half a request are closed after `request_timeout`; beyond
/// `max_connections` a connection gets `/health` (200) or a 503 and is closed; a body
/// that does not arrive answers 408; SIGTERM does not wait on half-sent requests.
#[test]
fn half_sent_requests_are_closed_and_never_hold_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo(tmp.path(), embedded(), "server: {request_timeout: 2s, max_connections: 20}\n");
    let server = Server::start(&dir, &[]);
    let half = |port: u16| {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"POST /get-online-features HTTP/1.1\r\nHost: x\r\n").unwrap();
        s
    };
    let held: Vec<TcpStream> = (0..20).map(|_| half(server.port)).collect();
    std::thread::sleep(Duration::from_millis(300));
    // Over the cap: /health still answers, the rest is refused at once.
    let (code, body) = server.get("/health");
    assert_eq!(code, 200, "{body}");
    let (code, body) = server.post("/get-online-features", r#"{"entities": {"driver_id": [1]}, "features": ["trips:fare"]}"#);
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("too many connections") && body.contains("server.max_connections"), "{body}");
    // Within request_timeout + margin the server closes the half-sent ones.
    let began = Instant::now();
    for s in held {
        assert!(closed_within(s, Duration::from_secs(8)), "a half-sent request was not closed");
    }
    assert!(began.elapsed() < Duration::from_secs(6), "closed after {:?}", began.elapsed());
    assert_eq!(lookup(&server, &["trips:fare"], 1)[0].1, "NOT_FOUND", "serving goes on");
    // A body that never arrives: 408 within the timeout.
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.write_all(b"POST /get-online-features HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ent")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive within 2s (server.request_timeout)"), "{answer}");
    assert!(server.metric("quiver_limit_refusals_total{limit=\"request_timeout\"}") >= 20.0);
    assert!(server.metric("quiver_limit_refusals_total{limit=\"max_connections\"}") >= 2.0);
    // SIGTERM with half-sent requests open: it stops without waiting for them.
    let _held: Vec<TcpStream> = (0..5).map(|_| half(server.port)).collect();
    let (status, took, out) = server.stop();
    assert!(status.success(), "{out}");
    assert!(took < Duration::from_secs(4), "SIGTERM took {took:?}");
    assert!(out.contains("stopped"), "{out}");
}

/// Whether the peer closes `s` within `limit` (whatever it sends first).
fn closed_within(mut s: TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
}

/// Adding a feature (an apply without `--force`) keeps the features already served:
/// rows written before it are read by name, the new feature is NULL_VALUE until data
/// arrives; verify agrees. Removing a feature makes the view's next version, served
/// beside the first.
#[test]
fn adding_a_feature_never_blanks_the_features_already_served() {
    let Some(url) = common::redis_url("adding_a_feature_never_blanks_the_features_already_served") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo(tmp.path(), &redis_online(&url), "");
    let now = now_us();
    write_rows(&dir.join("rows.jsonl"), &[(1, now - 60_000_000, 1.5, 1), (2, now - 60_000_000, 2.5, 2)]);
    ok(&dir, &["ingest", "trips", "rows.jsonl"]);
    ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    let server = Server::start(&dir, &[]);
    assert_eq!(lookup(&server, &["trips:fare"], 1)[0], (serde_json::json!(1.5), "PRESENT".to_string()));
    let added =
        FEATURES.replace("      - {name: seq, dtype: int64}\n", "      - {name: tip, dtype: float64}\n      - {name: seq, dtype: int64}\n");
    std::fs::write(dir.join("features.yaml"), &added).unwrap();
    let out = ok(&dir, &["apply"]);
    assert!(out.contains("applied"), "{out}");
    let got = lookup(&server, &["trips:fare", "trips:seq", "trips:tip"], 1);
    assert_eq!(got[0], (serde_json::json!(1.5), "PRESENT".to_string()), "the served feature stays served");
    assert_eq!(got[1], (serde_json::json!(1), "PRESENT".to_string()));
    assert_eq!(got[2], (serde_json::Value::Null, "NULL_VALUE".to_string()), "the new feature is null until data arrives");
    let out = ok(&dir, &["verify", "--sample", "10"]);
    assert!(out.contains("0 of 6 compared values disagree"), "{out}");
    // Data for the new feature arrives and is served.
    let push = serde_json::json!({"feature_view": "trips", "to": "online",
        "df": {"driver_id": [2], "event_timestamp": [rfc3339(now)], "fare": [3.0], "tip": [0.5], "seq": [3]}});
    let (code, body) = server.post("/push", &push.to_string());
    assert_eq!(code, 200, "{body}");
    assert_eq!(lookup(&server, &["trips:tip"], 2)[0], (serde_json::json!(0.5), "PRESENT".to_string()));
    // Removing a feature of a view that holds data makes version 2; version 1 is still
    // served, by its own keys, beside it.
    let removed = added.replace("      - {name: tip, dtype: float64}\n", "");
    std::fs::write(dir.join("features.yaml"), &removed).unwrap();
    let out = ok(&dir, &["apply"]);
    assert!(out.contains("^ feature_view trips: version 2 beside version 1 (feature `tip` would be removed)"), "{out}");
    // The server picks the new registry up within its check interval.
    let began = std::time::Instant::now();
    while !server.get("/registry").1.contains("\"earlier_versions\"") {
        assert!(began.elapsed() < Duration::from_secs(10), "the server did not read the new registry");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(lookup(&server, &["trips@1:tip"], 2)[0], (serde_json::json!(0.5), "PRESENT".to_string()));
    assert_eq!(lookup(&server, &["trips@1:fare"], 1)[0], (serde_json::json!(1.5), "PRESENT".to_string()));
    assert_eq!(lookup(&server, &["trips:fare"], 1)[0], (serde_json::Value::Null, "NOT_FOUND".to_string()), "version 2 has no rows yet");
    let push = serde_json::json!({"feature_view": "trips@2", "to": "online",
        "df": {"driver_id": [1], "event_timestamp": [rfc3339(now)], "fare": [9.0], "seq": [4]}});
    let (code, body) = server.post("/push", &push.to_string());
    assert_eq!(code, 200, "{body}");
    assert_eq!(lookup(&server, &["trips:fare"], 1)[0], (serde_json::json!(9.0), "PRESENT".to_string()));
    assert_eq!(lookup(&server, &["trips@1:fare"], 1)[0], (serde_json::json!(1.5), "PRESENT".to_string()), "version 1 unchanged");
}

/// A registry file that cannot be read (half-written, deleted) never takes `quiver
/// serve` down: the last good definitions keep answering, `/metrics` says so, and a
/// good registry is picked up again.
#[test]
fn a_broken_or_deleted_registry_keeps_the_last_good_definitions() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo(tmp.path(), embedded(), "");
    write_rows(&dir.join("rows.jsonl"), &[(1, now_us() - 60_000_000, 4.5, 1)]);
    ok(&dir, &["ingest", "trips", "rows.jsonl"]);
    ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
    let server = Server::start(&dir, &[]);
    let good = std::fs::read(dir.join("registry.json")).unwrap();
    let served = || lookup(&server, &["trips:fare"], 1)[0].clone();
    assert_eq!(served(), (serde_json::json!(4.5), "PRESENT".to_string()));
    assert_eq!(server.metric("quiver_registry_stale"), 0.0);
    for broken in [&b"{"[..], b""] {
        std::thread::sleep(Duration::from_millis(20)); // a new modification time
        std::fs::write(dir.join("registry.json"), broken).unwrap();
        assert_eq!(served(), (serde_json::json!(4.5), "PRESENT".to_string()), "served on from the last good registry");
        assert_eq!(server.metric("quiver_registry_stale"), 1.0);
    }
    std::fs::remove_file(dir.join("registry.json")).unwrap();
    assert_eq!(served(), (serde_json::json!(4.5), "PRESENT".to_string()), "a deleted registry does not unknow every feature");
    let (code, body) = server.get("/registry");
    assert!(code == 200 && body.contains("\"trips\""), "{body}");
    assert!(server.metric("quiver_registry_errors_total") >= 3.0);
    std::fs::write(dir.join("registry.json"), &good).unwrap();
    assert_eq!(served(), (serde_json::json!(4.5), "PRESENT".to_string()));
    assert_eq!(server.metric("quiver_registry_stale"), 0.0);
}

/// A view with `online: false` takes no online writes: `/push` and `quiver push` to
/// online are refused naming the view; the default push of such a view goes offline.
#[test]
fn offline_only_views_take_no_online_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo(tmp.path(), embedded(), "");
    let now = now_us();
    std::fs::write(dir.join("audit.jsonl"), format!("{{\"driver_id\": 1, \"event_timestamp\": \"{}\", \"fare\": 1.0}}\n", rfc3339(now)))
        .unwrap();
    fails(&dir, &["push", "audit", "audit.jsonl", "--to", "online"], &["feature view `audit` is offline only", "no online writes"]);
    fails(&dir, &["push", "audit", "audit.jsonl", "--to", "online-and-offline"], &["feature view `audit` is offline only"]);
    assert_eq!(delta_rows(&dir, "audit"), 0, "a refused push writes nothing");
    let out = ok(&dir, &["push", "audit", "audit.jsonl"]);
    assert!(out.contains("offline: table version") && !out.contains("online:"), "{out}");
    assert_eq!(delta_rows(&dir, "audit"), 1);
    let server = Server::start(&dir, &[]);
    for to in ["online", "online_and_offline"] {
        let body = serde_json::json!({"feature_view": "audit", "to": to,
            "df": {"driver_id": [1], "event_timestamp": [rfc3339(now)], "fare": [2.0]}});
        let (code, text) = server.post("/push", &body.to_string());
        assert_eq!(code, 400, "{text}");
        assert!(text.contains("feature view `audit` is offline only"), "{text}");
    }
    let body = serde_json::json!({"feature_view": "audit", "to": "offline",
        "df": {"driver_id": [1], "event_timestamp": [rfc3339(now)], "fare": [2.0]}});
    let (code, text) = server.post("/push", &body.to_string());
    assert_eq!(code, 200, "{text}");
    drop(server);
    assert_eq!(delta_rows(&dir, "audit"), 2);
}

/// Two views never share a table, however its path is spelled, nor use the serving
/// log's table; `apply` refuses naming both and writes nothing.
#[test]
fn tables_are_never_shared_however_the_path_is_spelled() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo(tmp.path(), embedded(), "");
    let before = std::fs::read(dir.join("registry.json")).unwrap();
    std::os::unix::fs::symlink(dir.join("data/trips"), dir.join("alias")).unwrap();
    let absolute = format!("{}/data/trips", dir.display());
    for (path, error) in [
        ("./data/trips/", "feature views `trips` and `copy` use the same table"),
        ("data//trips", "feature views `trips` and `copy` use the same table"),
        ("data/x/../trips", "feature views `trips` and `copy` use the same table"),
        (absolute.as_str(), "feature views `trips` and `copy` use the same table"),
        ("alias", "feature views `trips` and `copy` use the same table"),
        ("data/trips/inner", "is inside feature view `trips`'s table"),
        ("data/_serving_log", "feature view `copy` uses the serving log's table"),
    ] {
        let copy = format!(
            "  - name: copy\n    entities: [driver]\n    online: true\n    source: {{timestamp_field: event_timestamp, path: \"{path}\"}}\n    features:\n      - {{name: fare, dtype: float64}}\n"
        );
        std::fs::write(dir.join("features.yaml"), format!("{FEATURES}{copy}")).unwrap();
        fails(&dir, &["apply"], &[error]);
        assert_eq!(std::fs::read(dir.join("registry.json")).unwrap(), before, "{path}: the registry is unchanged");
    }
    // A view named like the serving log's table lands on it too.
    let named = "  - name: _serving_log\n    entities: [driver]\n    source: {timestamp_field: event_timestamp}\n    features:\n      - {name: fare, dtype: float64}\n";
    std::fs::write(dir.join("features.yaml"), format!("{FEATURES}{named}")).unwrap();
    let out = quiver(&dir, &["apply"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("_serving_log"), "{err}");
    assert_eq!(std::fs::read(dir.join("registry.json")).unwrap(), before);
    assert!(!dir.join("data/_serving_log").exists(), "no table created");
}

/// A private `redis-server` with `args`, on a free port; killed when dropped.
struct PrivateRedis(Child, u16);

impl PrivateRedis {
    fn start(args: &[&str]) -> PrivateRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (./run test installs it)");
        let began = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(began.elapsed() < Duration::from_secs(10), "redis-server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        PrivateRedis(child, port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A Redis that may evict any key (`allkeys-*`) would let an older row win once the
/// newer one is evicted: every command that opens the store refuses it, naming the
/// policy; `volatile-*` and `noeviction` are fine.
#[test]
fn a_redis_that_evicts_any_key_is_refused() {
    if common::redis_url("a_redis_that_evicts_any_key_is_refused").is_none() {
        return;
    }
    for (policy, refused) in [("allkeys-lru", true), ("allkeys-random", true), ("volatile-lru", false), ("noeviction", false)] {
        let redis = PrivateRedis::start(&["--maxmemory", "100mb", "--maxmemory-policy", policy]);
        let tmp = tempfile::tempdir().unwrap();
        let dir = repo(tmp.path(), &redis_online(&format!("redis://127.0.0.1:{}/0", redis.1)), "");
        let args = ["materialize", "2000-01-01T00:00:00Z", "now"];
        if refused {
            fails(&dir, &args, &[&format!("maxmemory-policy is `{policy}`"), "older row win"]);
            let out = quiver(&dir, &["serve", "--port", "1"], &[]);
            assert!(String::from_utf8_lossy(&out.stderr).contains("maxmemory-policy"), "serve refuses too");
        } else {
            ok(&dir, &args);
        }
    }
}

/// Two applies at once never both write the same version: each waits for the lock
/// (`<registry>.lock`), so versions follow one another and the history has every one.
#[test]
fn concurrent_applies_wait_for_each_other() {
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("registry.json");
    let project = unique("lock");
    let repos: Vec<PathBuf> = (0..6)
        .map(|i| {
            let dir = tmp.path().join(format!("r{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("quiver.yaml"), format!("project: {project}\nregistry: {}\n", shared.display())).unwrap();
            let features = FEATURES.replace("{name: seq, dtype: int64}", &format!("{{name: seq{i}, dtype: int64}}"));
            std::fs::write(dir.join("features.yaml"), features).unwrap();
            dir
        })
        .collect();
    // The lock held from here: an apply waits rather than write.
    let lock = quiver::sdk::FileRegistry::new(&shared).lock(Duration::ZERO).unwrap();
    let mut waiting =
        Command::new(env!("CARGO_BIN_EXE_quiver")).current_dir(&repos[0]).arg("apply").stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(waiting.try_wait().unwrap().is_none(), "apply went ahead while another held the lock");
    assert!(!shared.exists(), "nothing written while waiting");
    drop(lock);
    assert!(waiting.wait().unwrap().success());
    // Six at once, three rounds: every apply is a change, so every one is a version.
    for _ in 0..3 {
        let children: Vec<Child> = repos
            .iter()
            .map(|d| {
                Command::new(env!("CARGO_BIN_EXE_quiver"))
                    .current_dir(d)
                    .arg("apply")
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&shared).unwrap()).unwrap();
    let versions: Vec<u64> = doc["history"].as_array().unwrap().iter().map(|h| h["version"].as_u64().unwrap()).collect();
    let n = versions.len() as u64;
    assert_eq!(versions, (1..=n).collect::<Vec<_>>(), "no version written twice, none lost");
    assert_eq!(doc["version"].as_u64(), Some(n));
    assert!(n >= 2, "{versions:?}");
}

/// A token in `quiver.yaml` is flagged (it is easily committed); serving on a
/// non-loopback address without a token is warned about.
#[test]
fn exposure_is_warned_about() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo(tmp.path(), embedded(), "server: {auth_token: s3cret-token}\n");
    let server = Server::start(&dir, &[]);
    let (code, _) = server.get("/registry");
    assert_eq!(code, 401);
    let (code, _) = request(server.port, "GET", "/registry", &[("Authorization", "Bearer s3cret-token")], "");
    assert_eq!(code, 200);
    let (_, _, out) = server.stop();
    assert!(out.contains("holds server.auth_token; keep it out of version control"), "{out}");
    assert!(!out.contains("reachable from other machines"), "{out}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo(tmp.path(), embedded(), "");
    let server = Server::start(&dir, &["--host", "0.0.0.0"]);
    let (_, _, out) = server.stop();
    assert!(out.contains("reachable from other machines, with no server.auth_token"), "{out}");
}

/// About 30 s of mixed good and bad traffic from several clients while `materialize`
/// and `quiver push` run: afterwards every good push is in Delta exactly once and the
/// online store serves each driver's latest pushed value; every bad request got a 4xx
/// (never a 5xx, never a hang).
#[test]
fn a_short_soak_of_good_and_bad_traffic_loses_nothing() {
    let Some(url) = common::redis_url("a_short_soak_of_good_and_bad_traffic_loses_nothing") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = repo(tmp.path(), &redis_online(&url), "server: {max_cells: 5000}\n");
    let now = now_us();
    // History that materialize keeps writing: always older than the pushes.
    let history: Vec<(i64, i64, f64, i64)> = (0..50).map(|d| (d, now - 50 * 60_000_000, -1.0, -1)).collect();
    write_rows(&dir.join("history.jsonl"), &history);
    ok(&dir, &["ingest", "trips", "history.jsonl"]);
    let server = Server::start(&dir, &[]);
    let port = server.port;
    let stop_at = Instant::now() + Duration::from_secs(30);
    let bad_bodies: Vec<(&str, String)> = vec![
        ("/get-online-features", "{not json".to_string()),
        ("/get-online-features", r#"{"entities": {"driver_id": [1]}, "features": ["trips:nope"]}"#.to_string()),
        ("/get-online-features", r#"{"entities": {"driver_id": [1]}, "features": ["trips:fare", "trips:fare"]}"#.to_string()),
        ("/get-online-features", serde_json::json!({"entities": {"driver_id": (0..1000).collect::<Vec<_>>()}, "features": ["trips:fare", "trips:seq", "trips:a", "trips:b", "trips:c", "trips:d"]}).to_string()),
        ("/get-online-features", r#"{"entities": {"driver_id": ["x"]}, "features": ["trips:fare"]}"#.to_string()),
        ("/push", r#"{"feature_view": "trips", "df": {"driver_id": [1], "event_timestamp": ["9999-12-31T23:59:59Z"], "fare": [1.0], "seq": [1]}}"#.to_string()),
        ("/push", r#"{"feature_view": "trips", "df": {"driver_id": [1], "event_timestamp": ["2025-01-01T00:00:00"], "fare": [1.0], "seq": [1]}}"#.to_string()),
        ("/push", r#"{"feature_view": "audit", "to": "online", "df": {"driver_id": [1], "event_timestamp": ["2025-01-01T00:00:00Z"], "fare": [1.0]}}"#.to_string()),
        ("/push", r#"{"feature_view": "nope", "df": {}}"#.to_string()),
    ];
    let bad_bodies = std::sync::Arc::new(bad_bodies);
    let mut clients = Vec::new();
    // Pushers: driver d gets seq 0, 1, 2, ... with increasing event times, online and
    // offline; they own disjoint drivers.
    for w in 0..3i64 {
        clients.push(std::thread::spawn(move || {
            let mut pushed: Vec<(i64, i64)> = Vec::new(); // (driver, seq)
            let base = now_us() - 40 * 60_000_000;
            let mut seq = 0i64;
            while Instant::now() < stop_at {
                let drivers: Vec<i64> = (0..5).map(|k| w * 10 + k).collect();
                let ts: Vec<String> = drivers.iter().map(|_| rfc3339(base + seq * 1_000_000)).collect();
                let body = serde_json::json!({"feature_view": "trips", "to": "online_and_offline",
                    "df": {"driver_id": drivers, "event_timestamp": ts, "fare": vec![seq as f64 + 0.5; 5], "seq": vec![seq; 5]}});
                let (code, text) = request(port, "POST", "/push", &[], &body.to_string());
                assert_eq!(code, 200, "good push: {text}");
                pushed.extend(drivers.iter().map(|d| (*d, seq)));
                seq += 1;
            }
            (0, 0, pushed)
        }));
    }
    // Readers and abusers.
    for w in 0..3usize {
        let bad = bad_bodies.clone();
        clients.push(std::thread::spawn(move || {
            let (mut good, mut refused) = (0, 0);
            let mut i = w;
            while Instant::now() < stop_at {
                let (path, body) = &bad[i % bad.len()];
                let (code, text) = request(port, "POST", path, &[], body);
                assert!((400..500).contains(&code), "bad request {body:.80} got {code}: {text}");
                refused += 1;
                let (code, text) = request(
                    port,
                    "POST",
                    "/get-online-features",
                    &[],
                    r#"{"entities": {"driver_id": [1, 2, 3]}, "features": ["trips:fare", "trips:seq"]}"#,
                );
                assert_eq!(code, 200, "{text}");
                good += 1;
                i += 1;
            }
            (good, refused, Vec::new())
        }));
    }
    // Meanwhile: materialize over and over, and a CLI push of other drivers.
    let mut materialized = 0;
    let mut cli_pushes = 0;
    while Instant::now() < stop_at {
        ok(&dir, &["materialize", "2000-01-01T00:00:00Z", "now"]);
        materialized += 1;
        write_rows(&dir.join("cli.jsonl"), &[(40, now - 30 * 60_000_000 + cli_pushes * 1_000_000, 9.5, cli_pushes)]);
        ok(&dir, &["push", "trips", "cli.jsonl"]);
        cli_pushes += 1;
    }
    let mut last: std::collections::BTreeMap<i64, i64> = std::collections::BTreeMap::new();
    let (mut pushed_rows, mut good, mut refused) = (0usize, 0, 0);
    for c in clients {
        let (g, r, pushed) = c.join().expect("a client failed");
        good += g;
        refused += r;
        pushed_rows += pushed.len();
        for (d, s) in pushed {
            last.insert(d, s);
        }
    }
    assert!(good > 10 && refused > 10 && materialized >= 2, "{good} good, {refused} refused, {materialized} materializations");
    // Nothing good was lost: Delta holds every pushed row once (history + pushes + CLI).
    assert_eq!(delta_rows(&dir, "trips"), history.len() + pushed_rows + cli_pushes as usize);
    for (d, s) in &last {
        let got = lookup(&server, &["trips:seq"], *d);
        assert_eq!(got[0], (serde_json::json!(s), "PRESENT".to_string()), "driver {d}");
    }
    let got = lookup(&server, &["trips:seq"], 40);
    assert_eq!(got[0].0, serde_json::json!(cli_pushes - 1), "the CLI's last push");
}
