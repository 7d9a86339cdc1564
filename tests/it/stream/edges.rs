//! Edges of the stream: dead letters the dead-letter topic refuses, events from the
//! future, offline-only views, and a registry changed while streaming.

use super::*;

/// A dead letter the dead-letter topic refuses (too large once the headers are added)
/// does not stall the partition: after bounded retries it is sent cut short, with the
/// original size in a header, and the messages after it are written. An event from the
/// future is a dead letter too, and never reaches the online store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_dead_letters_and_future_events_do_not_stall_the_stream() {
    let Some((brokers, redis)) = services("refused_dead_letters_and_future_events_do_not_stall_the_stream") else { return };
    let s = setup("sbig", &brokers, &redis, 1).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // Fits the source topic (librdkafka's default message.max.bytes is 1,000,000), but
    // not once the dead letter's headers are added.
    let big = vec![b'x'; 999_850];
    let future = br#"{"driver_id": 1, "event_timestamp": "9999-12-31T23:59:59Z", "fare": 1.0, "seq": -1, "city": "z"}"#.to_vec();
    let mut payloads = vec![message(0).into_bytes(), big.clone(), future];
    payloads.extend((1..50).filter(|&i| kind(i) == Kind::Good).map(|i| message(i).into_bytes()));
    produce_raw(&s, &payloads).await;
    let a = start_with(&s, "a", &[], &["--metrics-port", &port.to_string()]);
    let good: Vec<i64> = (0..50).filter(|&i| kind(i) == Kind::Good).collect();
    wait_for_rows(&s, good.len(), &[&a]).await;
    let letters = {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &s.brokers)
            .set("group.id", unique("dlqreader"))
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        consumer.subscribe(&[&format!("{}.dlq", s.topic)]).unwrap();
        let mut out = Vec::new();
        let began = Instant::now();
        while out.len() < 2 && began.elapsed() < WAIT {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                let header = |name: &str| {
                    m.headers()
                        .and_then(|h| h.iter().find(|x| x.key == name))
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                };
                out.push((
                    header("quiver.source.offset"),
                    header("quiver.payload.truncated"),
                    m.payload().map_or(0, <[u8]>::len),
                    header("quiver.error"),
                ));
            }
        }
        out
    };
    assert_eq!(letters.len(), 2, "{letters:?}");
    let big_letter = letters.iter().find(|l| l.0.as_deref() == Some("1")).expect("the large message's dead letter");
    assert_eq!(big_letter.1.as_deref(), Some("999850"), "the original size is recorded");
    assert_eq!(big_letter.2, quiver::streaming::consumer::TRUNCATED_PAYLOAD_BYTES);
    let future_letter = letters.iter().find(|l| l.0.as_deref() == Some("2")).expect("the future event's dead letter");
    assert!(future_letter.3.as_deref().is_some_and(|r| r.contains("is in the future")), "{future_letter:?}");
    let (_, body) = common::http(port, "GET", "/metrics", "");
    assert_eq!(counter(&body, "quiver_stream_dead_letters_truncated_total"), 1.0);
    assert!(a.log().contains("refused the dead letter"), "{}", a.log());
    let (status, _) = a.stop();
    assert!(status.success());
    // Driver 1's online row is its real latest event, not the one from year 9999.
    let store = RedisStore::connect(&s.redis).await.unwrap();
    let row = store.read(&[store_key(&s.project, "trips", &[KeyValue::Int(1)])]).await.unwrap()[0].clone().unwrap();
    assert_eq!(OnlineRow::decode(&row).unwrap().event_ts, BASE_TS + 41 * 1_000_000);
}

/// A view with `online: false` streams into Delta only; a feature added by `apply`
/// while the stream runs is picked up without a restart (Delta gains the column, the
/// online rows carry the value, the features already served stay served).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_views_get_no_online_writes_and_a_changed_registry_is_picked_up() {
    let Some((brokers, redis)) = services("offline_views_get_no_online_writes_and_a_changed_registry_is_picked_up") else { return };
    let s = setup("sreload", &brokers, &redis, 1).await;
    let features = std::fs::read_to_string(s.dir.join("features.yaml")).unwrap();
    let audit = format!(
        "  - name: audit\n    entities: [driver]\n    online: false\n    source:\n      timestamp_field: event_timestamp\n      stream: {{topic: {}, format: json}}\n    features:\n      - {{name: fare, dtype: float64}}\n",
        s.topic
    );
    let with_audit = format!("{features}{audit}");
    std::fs::write(s.dir.join("features.yaml"), &with_audit).unwrap();
    quiver_ok(&s.dir, &["apply"]);
    // The metrics port follows the server's token rule.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let a = start_with(&s, "a", &[("QUIVER_SERVER_AUTH_TOKEN", "t0ken")], &["--metrics-port", &port.to_string()]);
    produce(&s, 0..100, 1).await;
    wait_for_rows(&s, expected_rows(0..100).len(), &[&a]).await;
    let (status, _) = common::http(port, "GET", "/metrics", "");
    assert!(status.contains("401"), "{status}");
    let (code, body) = common::request(port, "GET", "/metrics", &[("Authorization", "Bearer t0ken")], "");
    assert_eq!(code, 200);
    assert!(body.contains("quiver_stream_consumed_total"), "{body}");
    let store = RedisStore::connect(&s.redis).await.unwrap();
    let keys: Vec<String> = (0..DRIVERS).map(|d| store_key(&s.project, "audit", &[KeyValue::Int(d)])).collect();
    assert!(store.read(&keys).await.unwrap().iter().all(Option::is_none), "an offline-only view has no online rows");
    let repo = Repo::open(&s.dir).unwrap();
    let defs = repo.applied().unwrap().definitions;
    // `wait_for_rows` waited for the online view's table; the offline-only view's commit
    // of the same micro-batch may land a moment later.
    let mut audit_rows = 0;
    for _ in 0..100 {
        audit_rows = quiver::offline::historical::read_view(&repo.config, &defs, defs.feature_view("audit").unwrap())
            .await
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum();
        if audit_rows >= expected_rows(0..100).len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(audit_rows, expected_rows(0..100).len(), "but every event is in its Delta table");

    // A feature is added while the stream runs.
    let added = with_audit
        .replace("      - {name: city, dtype: string}\n", "      - {name: city, dtype: string}\n      - {name: tip, dtype: float64}\n");
    assert_ne!(added, with_audit);
    std::fs::write(s.dir.join("features.yaml"), &added).unwrap();
    quiver_ok(&s.dir, &["apply"]);
    wait_until("the stream reloading the registry", &[&a], || a.log().contains("definitions reloaded"));
    let ts = chrono::DateTime::from_timestamp_micros(BASE_TS + 500 * 1_000_000).unwrap().to_rfc3339();
    let tipped = format!(r#"{{"driver_id": 3, "event_timestamp": "{ts}", "fare": 2.5, "seq": 500, "city": "c1", "tip": 0.75}}"#);
    produce_raw(&s, &[tipped.into_bytes()]).await;
    wait_for_rows(&s, expected_rows(0..100).len() + 1, &[&a]).await;
    let (status, _) = a.stop();
    assert!(status.success(), "{}", a_log_or(&s));
    let row = store.read(&[store_key(&s.project, "trips", &[KeyValue::Int(3)])]).await.unwrap()[0].clone().unwrap();
    let row = OnlineRow::decode(&row).unwrap();
    assert_eq!(row.values, vec![Value::Float64(2.5), Value::Int64(500), Value::String("c1".into()), Value::Float64(0.75)]);
    // Driver 4's row was written before the feature existed: still served, tip null.
    let out = quiver_ok(&s.dir, &["online", "--features", "trips:fare,trips:tip", "--entity", "driver_id=4"]);
    let fare_line = out.lines().find(|l| l.starts_with("trips__fare")).unwrap();
    assert!(fare_line.contains("PRESENT"), "{out}");
    let tip_line = out.lines().find(|l| l.starts_with("trips__tip")).unwrap();
    assert!(tip_line.contains("NULL_VALUE"), "{out}");
}

/// A view with write-time expressions on the same topic (docs/transformations.md#write-time):
/// the stream reads its raw rows, drops those failing the filter (counted on `/metrics`
/// and in the summary line), stores what the expressions compute — a value that cannot
/// be computed null — in Delta and online, and a raw value of the wrong type is
/// dead-lettered as any bad message. The expected rows are computed by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_time_expressions_shape_the_streamed_rows() {
    let Some((brokers, redis)) = services("write_time_expressions_shape_the_streamed_rows") else { return };
    let shaped = r#"  - name: shaped
    entities: [driver]
    source:
      timestamp_field: event_timestamp
      stream: {topic: TOPIC, format: json}
      filter: "seq % 3 <> 0"
      raw: [{name: fare, dtype: float64}, {name: city, dtype: string}]
    features:
      - {name: seq, dtype: int64}
      - {name: fare_cents, dtype: int64, expr: "CAST(round(fare * 100) AS BIGINT)"}
      - {name: city_up, dtype: string, expr: "upper(city)"}
      - {name: per_step, dtype: float64, expr: "fare / (seq % 5)"}
"#;
    let s = setup_with("sshape", &brokers, &redis, 2, shaped).await;
    let n = 300;
    produce(&s, 0..n, 2).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let streamer = start_with(&s, "a", &[], &["--metrics-port", &port.to_string()]);
    wait_for_rows(&s, expected_rows(0..n).len(), &[&streamer]).await;
    // The hand evaluator: (driver, time) -> (seq, fare_cents, city_up, per_step).
    type Shaped = (i64, Option<i64>, Option<String>, Option<f64>);
    let good: Vec<i64> = (0..n).filter(|&i| kind(i) == Kind::Good).collect();
    let kept: Vec<i64> = good.iter().copied().filter(|i| i % 3 != 0).collect();
    let want: BTreeMap<(i64, i64), Shaped> = kept
        .iter()
        .map(|&i| {
            let per_step = (i % 5 != 0).then(|| fare(i) / (i % 5) as f64);
            ((i % DRIVERS, BASE_TS + i * 1_000_000), (i, Some((fare(i) * 100.0).round() as i64), Some(format!("C{}", i % 7)), per_step))
        })
        .collect();
    let read = || async {
        let repo = Repo::open(&s.dir).unwrap();
        let defs = repo.applied().unwrap().definitions;
        let view = defs.feature_view("shaped").unwrap();
        let layout = quiver::offline::schema::ViewLayout::scanned(&defs, view);
        let mut rows: BTreeMap<(i64, i64), Shaped> = BTreeMap::new();
        for b in quiver::offline::historical::read_view(&repo.config, &defs, view).await.unwrap() {
            let col = |k: usize| arrow::compute::cast(b.column(layout.feature(k)), &view.features[k].dtype.arrow_type()).unwrap();
            let (seq, cents, city, per) = (col(0), col(1), col(2), col(3));
            for r in 0..b.num_rows() {
                let key =
                    (b.column(0).as_primitive::<Int64Type>().value(r), b.column(1).as_primitive::<TimestampMicrosecondType>().value(r));
                let value = (
                    seq.as_primitive::<Int64Type>().value(r),
                    (!cents.is_null(r)).then(|| cents.as_primitive::<Int64Type>().value(r)),
                    (!city.is_null(r)).then(|| city.as_string::<i32>().value(r).to_string()),
                    (!per.is_null(r)).then(|| per.as_primitive::<Float64Type>().value(r)),
                );
                assert!(rows.insert(key, value).is_none(), "row {key:?} twice");
            }
        }
        rows
    };
    let began = Instant::now();
    let mut rows = read().await;
    while rows.len() < want.len() && began.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(300)).await;
        rows = read().await;
    }
    assert_eq!(rows, want, "Delta holds what the expressions compute, of the rows the filter keeps");
    // Online: each driver's latest kept row, computed.
    let store = RedisStore::connect(&s.redis).await.unwrap();
    let mut latest: BTreeMap<i64, i64> = BTreeMap::new();
    for &i in &kept {
        latest.insert(i % DRIVERS, i);
    }
    let began = Instant::now();
    for (d, i) in &latest {
        let key = store_key(&s.project, "shaped", &[KeyValue::Int(*d)]);
        let want = &want[&(*d, BASE_TS + i * 1_000_000)];
        let value = |w: &Shaped| {
            vec![
                Value::Int64(w.0),
                w.1.map_or(Value::Null, Value::Int64),
                w.2.clone().map_or(Value::Null, Value::String),
                w.3.map_or(Value::Null, Value::Float64),
            ]
        };
        loop {
            let got = store.read(std::slice::from_ref(&key)).await.unwrap()[0].clone().map(|b| OnlineRow::decode(&b).unwrap());
            if got.as_ref().is_some_and(|r| r.event_ts == BASE_TS + i * 1_000_000 && r.values == value(want)) {
                break;
            }
            assert!(began.elapsed() < WAIT, "driver {d}: online {got:?}, want message {i}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    // The filtered rows are counted; so are the divisions by zero of the kept rows.
    let body = http_get(port, "/metrics");
    assert_eq!(counter(&body, "quiver_stream_filtered_total"), (good.len() - kept.len()) as f64);
    assert_eq!(counter(&body, "quiver_stream_uncomputed_total"), kept.iter().filter(|&&i| i % 5 == 0).count() as f64);
    // A fare that is not a float is dead-lettered naming the raw column.
    let letters = dead_letters(&s, (0..n).filter(|&i| kind(i) != Kind::Good).count());
    let wrong = (0..n).find(|&i| kind(i) == Kind::WrongType).unwrap();
    let reason = &letters[&((wrong % 2) as i32, wrong / 2)];
    assert!(reason.contains("fare"), "{reason}");
    let (status, out) = streamer.stop();
    assert!(status.success());
    assert!(out.contains(&format!("{} rows dropped by the source filter", good.len() - kept.len())), "{out}");
}

/// An event log with write-time expressions on the stream: its aggregations read a
/// computed column over the rows its filter keeps, as a hand count and maximum of the
/// same rows say, served online by `quiver online`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_event_log_aggregates_computed_columns() {
    let Some((brokers, redis)) = services("a_streamed_event_log_aggregates_computed_columns") else { return };
    let log = r#"  - name: shaped_log
    entities: [driver]
    online: true
    source:
      timestamp_field: event_timestamp
      stream: {topic: TOPIC, format: json}
      filter: "seq % 3 <> 0"
      raw: [{name: fare, dtype: float64}, {name: seq, dtype: int64}]
    features:
      - {name: cents, dtype: int64, expr: "CAST(round(fare * 100) AS BIGINT)"}
    aggregations:
      - {name: n, function: count, column: cents, window: 1000d}
      - {name: cents_max, function: max, column: cents, window: 1000d}
"#;
    let s = setup_with("slogx", &brokers, &redis, 1, log).await;
    let n = 200;
    produce(&s, 0..n, 1).await;
    let streamer = start(&s, "a", &[]);
    wait_for_rows(&s, expected_rows(0..n).len(), &[&streamer]).await;
    let kept: Vec<i64> = (0..n).filter(|&i| kind(i) == Kind::Good && i % 3 != 0).collect();
    let began = Instant::now();
    for d in [1i64, 2, 7] {
        let mine: Vec<i64> = kept.iter().copied().filter(|i| i % DRIVERS == d).collect();
        let want_n = mine.len();
        let want_max = mine.iter().map(|&i| (fare(i) * 100.0).round() as i64).max();
        loop {
            let out =
                quiver_ok(&s.dir, &["online", "--features", "shaped_log:n,shaped_log:cents_max", "--entity", &format!("driver_id={d}")]);
            let value =
                |name: &str| out.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().nth(1)).map(str::to_string);
            let max = want_max.map_or("null".to_string(), |m| m.to_string());
            if value("shaped_log__n ").as_deref() == Some(&want_n.to_string())
                && value("shaped_log__cents_max").as_deref() == Some(max.as_str())
            {
                break;
            }
            assert!(began.elapsed() < WAIT, "driver {d}: {out} (want n {want_n}, max {max})");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let (status, _) = streamer.stop();
    assert!(status.success());
}

/// The write-time differential of `write_time.rs` through the stream: the same random
/// raw rows (nulls, zeros, extremes, mixed case, both sides of the filter) as Kafka
/// messages give the Delta rows and the online rows the hand evaluator computes, and
/// the dropped rows and values not computed are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_raw_rows_store_what_the_hand_evaluator_computes() {
    use crate::write_time::{FEATURES, delta_rows, latest, oracle, raw_json, raw_rows, stored_of, uncomputable};
    let Some((brokers, redis)) = services("streamed_raw_rows_store_what_the_hand_evaluator_computes") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    std::fs::create_dir_all(&dir).unwrap();
    let project = unique("sraw");
    let topic = format!("{project}_payments");
    std::fs::write(
        dir.join("quiver.yaml"),
        format!("project: {project}\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n  type: redis\n  url: {redis}\nkafka:\n  brokers: {brokers}\n"),
    )
    .unwrap();
    // `payments` streams from the topic (its event log too, to be read the same way).
    let features = FEATURES.replacen("      filter:", &format!("      stream: {{topic: {topic}, format: json}}\n      filter:"), 1);
    std::fs::write(dir.join("features.yaml"), features).unwrap();
    quiver_ok(&dir, &["apply"]);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", &brokers).create().unwrap();
    let created = admin.create_topics(&[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let s = Setup { _tmp: tmp, dir: dir.clone(), topic, project: project.clone(), brokers, redis: redis.clone() };
    let raw = raw_rows(300, 77);
    produce_raw(&s, &raw.iter().map(|r| raw_json(r).to_string().into_bytes()).collect::<Vec<_>>()).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let streamer = start_with(&s, "a", &[], &["--metrics-port", &port.to_string()]);
    let mut want: Vec<_> = raw.iter().filter_map(oracle).collect();
    want.sort_by(|a, b| (&a.customer, a.ts).cmp(&(&b.customer, b.ts)));
    let began = Instant::now();
    let mut got = delta_rows(&dir).await;
    while got.len() < want.len() && began.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(300)).await;
        got = delta_rows(&dir).await;
    }
    assert_eq!(got, want, "Delta holds what the hand evaluator computes");
    let store = RedisStore::connect(&redis).await.unwrap();
    for (customer, row) in latest(&want) {
        let key = store_key(&project, "payments", &[KeyValue::Str(customer.clone())]);
        loop {
            let online = store.read(std::slice::from_ref(&key)).await.unwrap()[0].clone().map(|b| {
                let decoded = OnlineRow::decode(&b).unwrap();
                stored_of(customer.clone(), decoded.event_ts, &decoded.values)
            });
            if online.as_ref() == Some(&row) {
                break;
            }
            assert!(began.elapsed() < WAIT, "{customer}: online {online:?}, want {row:?}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let body = http_get(port, "/metrics");
    assert_eq!(counter(&body, "quiver_stream_filtered_total"), (raw.len() - want.len()) as f64);
    assert_eq!(counter(&body, "quiver_stream_uncomputed_total"), uncomputable(&raw) as f64);
    let (status, _) = streamer.stop();
    assert!(status.success());
}
