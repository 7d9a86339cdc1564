//! Consumer groups: two streams split the partitions (also on a Redis Cluster), and a
//! consumer that lost its partition never appends over its successor.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streams_in_a_group_split_the_partitions() {
    let Some((brokers, redis)) = services("two_streams_in_a_group_split_the_partitions") else { return };
    group_splits_partitions(setup("sgroup", &brokers, &redis, 4).await).await;
}

/// The same on a Redis Cluster as the online store (docs/settings.md): the processes share the
/// partitions, each message once in Delta, each driver's latest row on its slot's master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_streams_share_the_partitions_on_a_redis_cluster() {
    let test = "two_streams_share_the_partitions_on_a_redis_cluster";
    let Some((brokers, redis)) = services(test) else { return };
    let Some((urls, _)) = common::redis_cluster(test) else { return };
    let online = format!("online_store:\n  type: redis_cluster\n  urls: [{}]\n", urls.join(", "));
    let s = setup_in("sgroupcl", &brokers, &redis, &online, 4, "", "offline_store:\n  path: data\n").await;
    group_splits_partitions(s).await;
}

/// Two `quiver stream` processes of one group on `s`'s 4 partitions: each holds some,
/// none twice, every message consumed once, Delta and the online store as expected.
async fn group_splits_partitions(s: Setup) {
    let a = start(&s, "a", &[]);
    let b = start(&s, "b", &[]);
    // Wait until the group settled: each process holds some partitions, none twice.
    let held = |log: &str| {
        let mut set = BTreeSet::new();
        for line in log.lines() {
            if let Some(p) = line.strip_prefix("assigned ") {
                set.insert(p.to_string());
            } else if let Some(p) = line.strip_prefix("revoked ") {
                set.remove(p);
            }
        }
        set
    };
    let began = Instant::now();
    loop {
        let (ha, hb) = (held(&a.log()), held(&b.log()));
        if !ha.is_empty() && !hb.is_empty() && ha.is_disjoint(&hb) && ha.len() + hb.len() == 4 {
            break;
        }
        assert!(began.elapsed() < WAIT, "the group did not settle:\n{}\n---\n{}", a.log(), b.log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    produce(&s, 0..2000, 4).await;
    wait_for_rows(&s, expected_rows(0..2000).len(), &[&a, &b]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (sa, out_a) = a.stop();
    let (sb, out_b) = b.stop();
    assert!(sa.success() && sb.success());
    let consumed =
        |out: &str| -> u64 { out.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("summary: {out}")) };
    let (ca, cb) = (consumed(&out_a), consumed(&out_b));
    assert!(ca > 0 && cb > 0, "both consumed: {ca} and {cb}");
    assert_eq!(ca + cb, 2000, "each message consumed once across the group");
    assert_exactly_once(&s, 0..2000).await;
    assert_online(&s, 0..2000).await;
}

/// docs/limits.md: a consumer that lost its partition while holding a batch (here
/// SIGSTOPped past the session timeout while another member took over and wrote the
/// same messages) never appends that batch again, nor records a stale offset: Delta
/// holds each message once and the partition's `txn` version is the last offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_consumer_never_appends_over_its_successor() {
    let Some((brokers, redis)) = services("a_paused_consumer_never_appends_over_its_successor") else { return };
    let s = setup("sfence", &brokers, &redis, 1).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // A holds its batch for 4 s before it is due.
    let a = start_with(&s, "a", &[], &["--batch-rows", "100000", "--batch-ms", "4000", "--metrics-port", &port.to_string()]);
    wait_until("A's assignment", &[&a], || a.log().contains("assigned "));
    produce(&s, 0..300, 1).await;
    wait_until("A reading the 300 messages", &[&a], || {
        let (status, body) = common::http(port, "GET", "/metrics", "");
        status.contains("200") && counter(&body, "quiver_stream_consumed_total") >= 300.0
    });
    signal(&a.child, "STOP");
    // Past the session timeout (6 s) the broker gives the partition to B.
    std::thread::sleep(Duration::from_secs(9));
    let b = start(&s, "b", &[]);
    wait_for_rows(&s, expected_rows(0..300).len(), &[&a, &b]).await;
    // B has written and committed everything; A wakes up with its stale batch.
    std::thread::sleep(Duration::from_secs(2));
    signal(&a.child, "CONT");
    // A's batch is overdue: it flushes (or learns of the lost partition) at once.
    std::thread::sleep(Duration::from_secs(8));
    let a_log = a.log();
    let (sa, _) = a.stop();
    let (sb, _) = b.stop();
    assert_exactly_once(&s, 0..300).await;
    assert!(sa.success() && sb.success(), "{sa:?} {sb:?}");
    assert!(
        a_log.contains("another writer took over") || a_log.contains("partitions lost before the batch was flushed"),
        "A says why it dropped its batch: {a_log}"
    );
    let repo = Repo::open(&s.dir).unwrap();
    let view = repo.applied().unwrap().definitions.feature_views[0].clone();
    let app = quiver::streaming::consumer::app_id("trips", &s.topic, 0);
    let recorded = quiver::offline::delta::txn_versions(&repo.config.view_table(&view), &[app]).await.unwrap();
    assert_eq!(recorded, vec![Some(299)], "the partition's progress is the last offset, never regressed");
}
