//! A table kept open between appends (`OpenTable`, what `quiver stream` does) commits
//! each append as the table's next version and sees other writers' commits: their
//! versions, and their `txn` progress for the fence.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use quiver_offline::Error;
use quiver_offline::delta::txn_versions;
use quiver_offline::ingest::{AppendOptions, OpenTable, append};
use quiver_sdk::yaml::parse_definitions;
use quiver_sdk::{Config, Definitions};

const DEFS: &str = r#"
entities:
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
feature_views:
  - name: trips
    entities: [driver]
    features:
      - {name: fare, dtype: float64}
"#;

fn rows(first: i64, n: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("driver_id", DataType::Int64, false),
        Field::new("event_timestamp", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
        Field::new("fare", DataType::Float64, true),
    ]));
    let ids: Vec<i64> = (first..first + n).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids.clone())),
        Arc::new(TimestampMicrosecondArray::from(ids.iter().map(|i| 1_700_000_000_000_000 + i).collect::<Vec<_>>()).with_timezone("UTC")),
        Arc::new(Float64Array::from(ids.iter().map(|&i| i as f64).collect::<Vec<_>>())),
    ];
    RecordBatch::try_new(schema, columns).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_kept_open_sees_other_writers_commits_and_their_progress() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(dir.path(), &dir.path().join("quiver.yaml"), "project: t\n", Vec::new()).unwrap();
    let defs: Definitions = parse_definitions(DEFS).unwrap();
    let view = defs.find_view("trips").unwrap().clone();
    let location = config.view_table(&view);
    let noop = |_: &str, _: u64| {};
    let app = |name: &str| name.to_string();
    let open = OpenTable::default();
    let stream = |txn: i64, expected: Option<i64>| {
        AppendOptions::new(None)
            .with_txns(vec![(app("s"), txn)])
            .with_expected_txns(vec![(app("s"), expected)])
            .with_open_table(open.clone())
    };

    let first = append(&location, &defs, &view, "a", vec![rows(0, 10)], stream(10, None), &noop).await.unwrap();
    // Another writer (an ingest) commits in between, without the open table.
    let other = append(&location, &defs, &view, "b", vec![rows(100, 5)], AppendOptions::new(None), &noop).await.unwrap();
    assert_eq!(other.version, first.version.map(|v| v + 1));
    let second = append(&location, &defs, &view, "a", vec![rows(10, 10)], stream(20, Some(10)), &noop).await.unwrap();
    assert_eq!(second.version, other.version.map(|v| v + 1), "the open table's next commit lands after the other writer's");
    assert_eq!(second.rows, 10);

    // Another member records more progress for the same app: the open table's next
    // append is fenced, and writes nothing.
    let taken = AppendOptions::new(None).with_txns(vec![(app("s"), 30)]);
    let took = append(&location, &defs, &view, "c", vec![rows(20, 10)], taken, &noop).await.unwrap();
    let fenced = append(&location, &defs, &view, "a", vec![rows(20, 10)], stream(30, Some(20)), &noop).await;
    match fenced {
        Err(Error::Fenced { recorded, expected, .. }) => assert_eq!((recorded, expected), (Some(30), Some(20))),
        other => panic!("expected the append to be fenced, got {other:?}"),
    }
    let after = append(&location, &defs, &view, "a", vec![rows(30, 10)], stream(40, Some(30)), &noop).await.unwrap();
    assert_eq!(after.version, took.version.map(|v| v + 1), "nothing was committed by the fenced append");
    assert_eq!(txn_versions(&location, &[app("s")]).await.unwrap(), vec![Some(40)]);

    // The table is deleted under the open one: nothing is committed at a version of the
    // old log. The next append finds it gone; the one after creates the table afresh,
    // where the fence sees no progress recorded.
    let quiver_sdk::StoreLocation::Local(path) = &location else { panic!("a local table") };
    std::fs::remove_dir_all(path).unwrap();
    let gone = append(&location, &defs, &view, "a", vec![rows(40, 10)], stream(50, Some(40)), &noop).await;
    assert!(matches!(gone, Err(Error::Request(ref m)) if m.contains("vanished")), "{gone:?}");
    let fresh = append(&location, &defs, &view, "a", vec![rows(40, 10)], stream(50, Some(40)), &noop).await;
    match fresh {
        Err(Error::Fenced { recorded, expected, .. }) => assert_eq!((recorded, expected), (None, Some(40))),
        other => panic!("expected the append to the recreated table to be fenced, got {other:?}"),
    }
    assert_eq!(txn_versions(&location, &[app("s")]).await.unwrap(), vec![None]);
}
