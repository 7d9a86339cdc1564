//! The stream as one lineage run (docs/lineage.md#long-running-jobs): START, a RUNNING
//! event per interval in which it committed, naming the table at its Delta version,
//! COMPLETE at shutdown. The events land in `QUIVER_TEST_LINEAGE_DIR` when set (`./run
//! test` sets it), where `python/tests/test_lineage.py` validates them against the
//! OpenLineage schemas.

use super::*;

/// The table's latest Delta version, from its log's file names.
fn delta_version(table: &Path) -> u64 {
    std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_suffix(".json")?.parse().ok())
        .max()
        .unwrap()
}

fn read_events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn table_version(event: &serde_json::Value, table: &str) -> Option<u64> {
    event["outputs"].as_array()?.iter().find(|d| d["name"] == table)?["facets"]["version"]["datasetVersion"].as_str()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_is_one_lineage_run_naming_its_topic_and_table_versions() {
    let Some((brokers, redis)) = services("the_stream_is_one_lineage_run_naming_its_topic_and_table_versions") else { return };
    let s = setup("slineage", &brokers, &redis, 1).await;
    let file = match std::env::var("QUIVER_TEST_LINEAGE_DIR") {
        Ok(dir) => {
            std::fs::create_dir_all(&dir).unwrap();
            PathBuf::from(dir).join(format!("{}.jsonl", s.project))
        }
        Err(_) => s.dir.join("lineage.jsonl"),
    };
    let mut config = std::fs::read_to_string(s.dir.join("quiver.yaml")).unwrap();
    config.push_str(&format!("lineage:\n  transport: file\n  path: {}\n  interval: 1s\n", file.display()));
    std::fs::write(s.dir.join("quiver.yaml"), config).unwrap();
    let streamer = start(&s, "a", &[]);
    produce(&s, 0..200, 1).await;
    wait_for_rows(&s, expected_rows(0..200).len(), &[&streamer]).await;
    let table = std::fs::canonicalize(s.dir.join("data").join("trips")).unwrap();
    let name = table.display().to_string();
    let version = delta_version(&table);
    wait_until("a RUNNING event naming the table's version", &[&streamer], || {
        read_events(&file).iter().any(|e| e["eventType"] == "RUNNING" && table_version(e, &name) == Some(version))
    });
    let (status, _) = streamer.stop();
    assert!(status.success(), "{status:?}");
    let got: Vec<serde_json::Value> = read_events(&file).into_iter().filter(|e| e["job"]["name"] == "stream").collect();
    let kinds: Vec<&str> = got.iter().map(|e| e["eventType"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"START"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"COMPLETE"), "{kinds:?}");
    assert!(kinds[1..kinds.len() - 1].iter().all(|k| *k == "RUNNING"), "{kinds:?}");
    assert!(got.iter().all(|e| e["run"]["runId"] == got[0]["run"]["runId"]), "one run");
    // Never one per batch: at most one RUNNING per interval (1s) the stream ran.
    let batches = kinds.len() - 2;
    assert!(batches >= 1, "{kinds:?}");
    let first = brokers.split(',').next().unwrap();
    let input = &got[0]["inputs"][0];
    assert_eq!(
        (input["namespace"].as_str().unwrap(), input["name"].as_str().unwrap()),
        (format!("kafka://{first}").as_str(), s.topic.as_str())
    );
    let complete = got.last().unwrap();
    assert!(table_version(complete, &name).unwrap_or(0) <= delta_version(&table));
    let keys: Vec<&str> = complete["outputs"].as_array().unwrap().iter().filter_map(|d| d["name"].as_str()).collect();
    assert!(keys.contains(&format!("quiver:{}:trips:", s.project).as_str()), "{keys:?}");
    // Each stored feature from the message field of its name.
    let running = got.iter().find(|e| table_version(e, &name) == Some(version)).unwrap();
    let lineage =
        &running["outputs"].as_array().unwrap().iter().find(|d| d["name"] == name.as_str()).unwrap()["facets"]["columnLineage"]["fields"];
    assert_eq!(lineage["fare"]["inputFields"][0]["name"], s.topic.as_str());
    assert_eq!(lineage["fare"]["inputFields"][0]["field"], "fare");
}
