//! The offline store on an object store (docs/settings.md), end to end against the real
//! S3-compatible server `./run test` starts (moto): every command on `s3://` tables
//! answers as the same repository on local folders does, concurrent writers lose no
//! commit, another Delta reader (Python `deltalake`) reads the tables, and bad settings
//! fail with one clear line.

use std::path::Path;
use std::process::Output;

use crate::common;

use common::{fails_alone, ok, quiver};

const VIEWS: [&str; 4] = ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"];

/// The demo repository at `dir`, its tables under `offline` (a quiver.yaml section) and
/// the serving log on.
fn demo(dir: &Path, offline: Option<&str>) {
    assert!(quiver(dir.parent().unwrap(), &["init", dir.file_name().unwrap().to_str().unwrap(), "--demo"], &[]).status.success());
    let config = std::fs::read_to_string(dir.join("quiver.yaml")).unwrap();
    let local = config.lines().position(|l| l.starts_with("offline_store:")).unwrap();
    let mut lines: Vec<&str> = config.lines().collect();
    let section = offline.unwrap_or("offline_store:\n  path: data\n");
    lines.splice(local..local + 2, section.lines());
    let mut config = lines.join("\n");
    config.push_str("\nserving_log:\n  enabled: true\n  batch_ms: 100\n");
    std::fs::write(dir.join("quiver.yaml"), config).unwrap();
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Python `deltalake` (another Delta reader) on the table at `uri`: its version and rows.
fn python_reads(uri: &str, endpoint: &str) -> (i64, i64) {
    let python = std::env::var("QUIVER_TEST_PYTHON").expect("QUIVER_TEST_PYTHON: a Python with deltalake and pyarrow (./run test sets it)");
    let script = format!(
        "from deltalake import DeltaTable\n\
         t = DeltaTable({uri:?}, storage_options={{'AWS_ENDPOINT_URL': {endpoint:?}, 'AWS_ACCESS_KEY_ID': 'x', \
         'AWS_SECRET_ACCESS_KEY': 'x', 'AWS_REGION': 'us-east-1', 'AWS_ALLOW_HTTP': 'true'}})\n\
         print(t.version(), t.to_pyarrow_table().num_rows)\n\
         assert [h['version'] for h in t.history()] == list(range(t.version(), -1, -1)), t.history()\n\
         import os, sys; sys.stdout.flush(); os._exit(0)\n"
    );
    let out = std::process::Command::new(python).args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "python deltalake: {}", text(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut it = stdout.split_whitespace().map(|n| n.parse::<i64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

#[test]
fn every_command_runs_on_s3_tables_as_on_local_ones() {
    let prefix = common::unique("every-command");
    let Some(common::S3 { endpoint, bucket, section }) =
        common::s3_offline_store("every_command_runs_on_s3_tables_as_on_local_ones", &prefix)
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (s3, local) = (tmp.path().join("s3"), tmp.path().join("local"));
    demo(&s3, Some(&section));
    demo(&local, None);
    // The same sample files in both (init writes data of its own time).
    for v in VIEWS.iter().chain(&["spine"]) {
        std::fs::copy(s3.join(format!("sample_data/{v}.parquet")), local.join(format!("sample_data/{v}.parquet"))).unwrap();
    }
    for repo in [&s3, &local] {
        ok(repo, &["apply"]);
        for v in VIEWS {
            let out = ok(repo, &["ingest", v, &format!("sample_data/{v}.parquet")]);
            assert!(out.contains("(table version 1)"), "{out}");
        }
        ok(repo, &["historical", "--spine", "sample_data/spine.parquet", "--service", "ranker_v1", "--out", "joined.parquet"]);
    }
    assert_eq!(
        std::fs::read(s3.join("joined.parquet")).unwrap(),
        std::fs::read(local.join("joined.parquet")).unwrap(),
        "the join on S3 tables"
    );
    // Nothing of the tables is local.
    assert!(!s3.join("data").exists());

    // export, and --reproduce from the manifest (the S3 tables at their versions).
    let out = ok(&s3, &["export", "--service", "ranker_v1", "--spine", "sample_data/spine.parquet", "--out", "set"]);
    assert!(out.contains("500 rows"), "{out}");
    let manifest = std::fs::read_to_string(s3.join("set/manifest.json")).unwrap();
    assert!(manifest.contains("\"driver_hourly\": 1"), "the Delta versions read: {manifest}");
    assert!(!manifest.contains("quiver-secret"), "a secret in the manifest");
    let again = ok(&s3, &["export", "--reproduce", "set/manifest.json", "--out", "again"]);
    assert!(again.contains("every shard identical to the manifest"), "{again}");

    // materialize, push, verify.
    ok(&s3, &["materialize-incremental", "now"]);
    let agree = ok(&s3, &["verify", "--sample", "1000"]);
    assert!(agree.contains("0 of ") && agree.contains("disagree"), "{agree}");
    let pushed = s3.join("push.jsonl");
    let now = chrono::Utc::now().to_rfc3339();
    std::fs::write(&pushed, format!("{{\"driver_id\": 1001, \"event_timestamp\": \"{now}\", \"created_timestamp\": \"{now}\", \"conv_rate\": 0.125, \"acc_rate\": 0.5, \"avg_daily_trips\": 7}}\n")).unwrap();
    let out = ok(&s3, &["push", "driver_hourly", "push.jsonl"]);
    assert!(out.contains("1 row"), "{out}");
    let online = ok(&s3, &["online", "--features", "driver_hourly:conv_rate", "--entity", "driver_id=1001"]);
    assert!(online.contains("0.125"), "{online}");
    let (version, rows) = python_reads(&format!("s3://{bucket}/{prefix}/driver_hourly"), &endpoint);
    assert_eq!((version, rows), (2, 737), "another reader sees the ingest and the push");

    // The serving log on S3: serve, ask, replay.
    let began = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let (child, port) = common::spawn_serve(&s3);
    let ask = r#"{"entities": {"driver_id": [1001, 1002], "customer_id": ["C001", "C002"]}, "feature_service": "ranker_v1"}"#;
    for _ in 0..2 {
        let (status, body) = common::http(port, "POST", "/get-online-features", ask);
        assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    }
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let replay = ok(&s3, &["verify", "--since", &began.to_rfc3339()]);
    assert!(replay.contains(": 2 requests, "), "{replay}");
    let (_, logged) = python_reads(&format!("s3://{bucket}/{prefix}/_serving_log"), &endpoint);
    assert!(logged >= 4, "{logged} rows in the serving log");
}

#[test]
fn concurrent_writers_on_s3_lose_no_commit() {
    let prefix = common::unique("concurrent");
    let Some(common::S3 { endpoint, bucket, section }) = common::s3_offline_store("concurrent_writers_on_s3_lose_no_commit", &prefix)
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("demo");
    demo(&repo, Some(&section));
    ok(&repo, &["apply"]);
    ok(&repo, &["ingest", "driver_hourly", "sample_data/driver_hourly.parquet"]);
    // Four writers at once on one table: each commit lands on its own version, none is
    // lost (conditional puts: a writer that loses a version starts over on the next).
    // (The same file each time, so appended on purpose with --allow-duplicate.)
    let ingest_all = |n: usize, args: &[&str]| -> Vec<std::io::Result<Output>> {
        let writers: Vec<_> = (0..n)
            .map(|_| {
                let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_quiver"));
                for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("QUIVER_")) {
                    cmd.env_remove(k);
                }
                cmd.current_dir(&repo).args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
            })
            .collect();
        writers.into_iter().map(std::process::Child::wait_with_output).collect()
    };
    let writers = ingest_all(4, &["ingest", "driver_hourly", "sample_data/driver_hourly.parquet", "--allow-duplicate"]);
    let mut versions: Vec<i64> = Vec::new();
    for w in writers {
        let out = w.unwrap();
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        assert!(!t.contains("WARN"), "a lost race is not the user's concern: {t}");
        let v = t.split("(table version ").nth(1).and_then(|r| r.split(')').next()).unwrap();
        versions.push(v.parse().unwrap());
    }
    versions.sort();
    assert_eq!(versions, [2, 3, 4, 5], "one version each");
    let (version, rows) = python_reads(&format!("s3://{bucket}/{prefix}/driver_hourly"), &endpoint);
    assert_eq!((version, rows), (5, 5 * 736), "every commit's rows, once");
    // Three writers of one new file at once, as a retry racing the first try: it is
    // appended once; the others find it there (checked on the version they land on).
    let now = quiver::sdk::types::format_instant(chrono::Utc::now().timestamp_micros());
    std::fs::write(
        repo.join("one.jsonl"),
        format!(r#"{{"driver_id": 1, "event_timestamp": "{now}", "created_timestamp": "{now}", "conv_rate": 0.5, "acc_rate": 0.5, "avg_daily_trips": 3}}"#),
    )
    .unwrap();
    let outs: Vec<String> = ingest_all(3, &["ingest", "driver_hourly", "one.jsonl"]).into_iter().map(|o| text(&o.unwrap())).collect();
    assert_eq!(outs.iter().filter(|t| t.contains("ingested 1 row into driver_hourly (table version 6)")).count(), 1, "{outs:?}");
    assert_eq!(outs.iter().filter(|t| t.contains("table version 6 holds the same content")).count(), 2, "{outs:?}");
    assert_eq!(python_reads(&format!("s3://{bucket}/{prefix}/driver_hourly"), &endpoint), (6, 5 * 736 + 1));

    // The primitive underneath: a log entry is written only if absent.
    let location = quiver::sdk::StoreLocation::Uri(
        format!("s3://{bucket}/{prefix}/driver_hourly"),
        quiver::Repo::open(&repo).unwrap().config.storage_options.clone(),
    );
    let store = quiver::offline::delta::object_store(&location).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use object_store::{PutMode, PutOptions, PutPayload, path::Path as ObjectPath};
        let entry = ObjectPath::from("_delta_log/00000000000000000005.json");
        let put = store.put_opts(&entry, PutPayload::from_static(b"{}"), PutOptions { mode: PutMode::Create, ..Default::default() }).await;
        assert!(matches!(put, Err(object_store::Error::AlreadyExists { .. })), "an existing version overwritten: {put:?}");
    });
}

#[test]
fn bad_object_store_settings_fail_with_one_line() {
    let prefix = common::unique("bad");
    let Some(common::S3 { endpoint, bucket, section }) = common::s3_offline_store("bad_object_store_settings_fail_with_one_line", &prefix)
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("demo");
    // A misspelt option is refused, not ignored.
    demo(&repo, Some(&section.replace("AWS_REGION", "AWS_REGOIN")));
    fails_alone(&repo, &["apply"], 1, &[&format!("{prefix}/driver_hourly"), "`AWS_REGOIN` is not a setting of the s3 object store"]);
    // A server that is not there: the table named, no retry storm for minutes.
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("demo");
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    demo(&repo, Some(&section.replace(&endpoint, &format!("http://127.0.0.1:{dead}"))));
    let began = std::time::Instant::now();
    let table = format!("s3://{bucket}/{prefix}/driver_hourly");
    // Exit 3: a store that cannot be reached (a retry may succeed).
    fails_alone(&repo, &["apply"], 3, &[&table, "error sending request"]);
    assert!(began.elapsed().as_secs() < 120, "{:?}", began.elapsed());
}
