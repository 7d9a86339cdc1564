//! `online_store: {type: redis_cluster}` end to end against the six-node cluster `./run
//! test` starts (three masters, three replicas): materialize and serve through it, then
//! kill the master holding a requested key — the server answers 503 while that key's
//! slot has no master (never a wrong answer), recovers by itself once a replica is
//! promoted, and every acknowledged write is still there.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;

use common::ok;
use quiver::runtime::encoding::{KeyValue, store_key};

fn cli(port: &str, args: &[&str]) -> String {
    let out = Command::new("redis-cli").args(["-p", port]).args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn port_of(url: &str) -> &str {
    url.rsplit(':').next().unwrap().trim_end_matches('/')
}

/// The port of the master serving `slot`, as node `seed` sees the cluster.
fn master_of(seed: &str, slot: u16) -> String {
    for line in cli(seed, &["cluster", "nodes"]).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !fields[2].contains("master") || fields[2].contains("fail") {
            continue;
        }
        let serves = fields[8..].iter().any(|range| {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
        });
        if serves {
            return fields[1].split('@').next().unwrap().rsplit(':').next().unwrap().to_string();
        }
    }
    panic!("no master serves slot {slot}");
}

/// Until every node sees the cluster healthy with three masters and three replicas.
fn wait_healthy(ports: &[&str]) {
    let began = Instant::now();
    loop {
        let ok = ports.iter().all(|p| cli(p, &["cluster", "info"]).contains("cluster_state:ok"))
            && cli(ports[0], &["cluster", "nodes"]).lines().filter(|l| l.contains("slave") && !l.contains("fail")).count() == 3;
        if ok {
            return;
        }
        assert!(began.elapsed() < Duration::from_secs(60), "the cluster did not heal: {}", cli(ports[0], &["cluster", "nodes"]));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The server, killed if the test fails half-way (else it holds the test's output open).
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn a_killed_master_means_503s_then_recovery_without_a_restart_and_nothing_lost() {
    let Some((urls, dir)) = common::redis_cluster("a_killed_master_means_503s_then_recovery_without_a_restart_and_nothing_lost") else {
        return;
    };
    let ports: Vec<&str> = urls.iter().map(|u| port_of(u)).collect();
    wait_healthy(&ports);
    let tmp = tempfile::tempdir().unwrap();
    let project = common::unique("cluster");
    assert!(common::quiver(tmp.path(), &["init", &project, "--demo"], &[]).status.success());
    let repo = tmp.path().join(&project);
    let config = std::fs::read_to_string(repo.join("quiver.yaml")).unwrap();
    let seeds = urls.iter().map(|u| u.as_str()).collect::<Vec<_>>().join(", ");
    let config = config.replace("  type: embedded", &format!("  type: redis_cluster\n  urls: [{seeds}]\n  replica_acks: 1\n  # was"));
    std::fs::write(repo.join("quiver.yaml"), config).unwrap();
    ok(&repo, &["apply"]);
    for v in ["driver_hourly", "customer_profile", "driver_customer", "customer_rides"] {
        ok(&repo, &["ingest", v, &format!("sample_data/{v}.parquet")]);
    }
    let out = ok(&repo, &["materialize-incremental", "now"]);
    assert!(out.contains("materialized"), "{out}");
    let agree = ok(&repo, &["verify", "--sample", "1000"]);
    assert!(agree.contains("0 of "), "{agree}");

    let (child, port) = common::spawn_serve(&repo);
    let mut serve = KillOnDrop(Some(child));
    let ask = r#"{"entities": {"driver_id": [1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008]}, "features": ["driver_hourly:conv_rate", "driver_hourly:avg_daily_trips"]}"#;
    let (status, before) = common::request(port, "POST", "/get-online-features", &[], ask);
    assert_eq!(status, 200, "{before}");
    assert!(!before.contains("NOT_FOUND"), "{before}");

    // Kill the master of driver 1001's slot.
    let key = store_key(&project, "driver_hourly", &[KeyValue::Int(1001)]);
    let slot: u16 = cli(ports[0], &["cluster", "keyslot", &key]).trim().parse().unwrap();
    let victim = master_of(ports[0], slot);
    let _ = cli(&victim, &["shutdown", "nosave"]);
    let (mut saw_503, began) = (false, Instant::now());
    loop {
        let (status, body) = common::request(port, "POST", "/get-online-features", &[], ask);
        match status {
            503 => saw_503 = true,
            200 => {
                assert_eq!(body, before, "an answer during the failover differs");
                if saw_503 {
                    break;
                }
            }
            other => panic!("{other} during the failover: {body}"),
        }
        assert!(began.elapsed() < Duration::from_secs(60), "no recovery within a minute (503 seen: {saw_503})");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The same server, not restarted, answers as before: nothing acknowledged was lost.
    let (status, after) = common::request(port, "POST", "/get-online-features", &[], ask);
    assert_eq!((status, after), (200, before.clone()));
    assert_ne!(master_of(ports.iter().find(|p| **p != victim).unwrap(), slot), victim, "a replica took the slot over");

    // The old master rejoins as a replica; writes (each acknowledged by a replica) and
    // reads go on through the same server.
    let restarted = Command::new("redis-server").arg(format!("{dir}/{victim}/redis.conf")).status().unwrap();
    assert!(restarted.success());
    wait_healthy(&ports);
    let began = Instant::now();
    while !cli(&victim, &["info", "replication"]).contains("master_link_status:up") {
        assert!(began.elapsed() < Duration::from_secs(60), "the old master did not sync as a replica");
        std::thread::sleep(Duration::from_millis(100));
    }
    let now = chrono::Utc::now().to_rfc3339();
    let row = format!(
        "{{\"driver_id\": 1001, \"event_timestamp\": \"{now}\", \"created_timestamp\": \"{now}\", \"conv_rate\": 0.125, \"acc_rate\": 0.5, \"avg_daily_trips\": 7}}\n"
    );
    std::fs::write(repo.join("push.jsonl"), row).unwrap();
    ok(&repo, &["push", "driver_hourly", "push.jsonl"]);
    let (status, body) = common::request(port, "POST", "/get-online-features", &[], ask);
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["results"][1]["values"][0], 0.125, "{body}");
    let child = serve.0.take().unwrap();
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
}
