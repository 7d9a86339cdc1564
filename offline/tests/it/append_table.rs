//! An append-only table (`AppendTable`, the serving log's storage) written by two
//! writers at once: every append lands once, at a version of its own, the writers'
//! versions together are every version; a checkpoint every hundred versions; another
//! writer's change of the schema makes a writer open the table again.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, TimeUnit};
use quiver_offline::append_table::{AppendTable, CHECKPOINT_EVERY, read_range};
use quiver_sdk::Timestamp;
use quiver_sdk::config::StoreLocation;

const T0: i64 = 1_700_000_000_000_000;

fn schema(extra: bool) -> SchemaRef {
    let mut fields = vec![
        Field::new("request_time", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
        Field::new("id", DataType::Int64, false),
    ];
    if extra {
        fields.push(Field::new("note", DataType::Utf8, true));
    }
    Arc::new(Schema::new(fields))
}

fn rows(schema: &SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
    let ids: Vec<i64> = ids.collect();
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(TimestampMicrosecondArray::from(ids.iter().map(|i| T0 + i).collect::<Vec<_>>()).with_timezone("UTC")),
        Arc::new(Int64Array::from(ids.clone())),
    ];
    if schema.fields().len() == 3 {
        columns.push(Arc::new(StringArray::from(ids.iter().map(|i| Some(format!("n{i}"))).collect::<Vec<_>>())));
    }
    RecordBatch::try_new(schema.clone(), columns).unwrap()
}

async fn ids_and_notes(location: &StoreLocation) -> Vec<(i64, Option<String>)> {
    let batches = read_range(location, &schema(true), "request_time", Timestamp(T0)..Timestamp(T0 + 1_000_000)).await.unwrap();
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let notes = b.column_by_name("note").unwrap().as_string::<i32>();
        for r in 0..b.num_rows() {
            out.push((ids.value(r), notes.is_valid(r).then(|| notes.value(r).to_string())));
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_append_every_batch_once_each_at_a_version_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let location = StoreLocation::Local(dir.path().join("log"));
    let s = schema(false);
    let mut a = AppendTable::new(location.clone(), s.clone(), "serving_log");
    let mut b = AppendTable::new(location.clone(), s.clone(), "serving_log");
    let appends = CHECKPOINT_EVERY as i64 + 20;
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    for i in 0..appends {
        // Each writer in turn: every append but the first of each finds the version it
        // knows of taken by the other writer.
        let batch = rows(&s, i * 3..i * 3 + 3);
        if i % 2 == 0 {
            va.push(a.append(batch).await.unwrap());
        } else {
            vb.push(b.append(batch).await.unwrap());
        }
    }
    assert!(va.windows(2).all(|w| w[0] < w[1]) && vb.windows(2).all(|w| w[0] < w[1]), "{va:?} {vb:?}");
    let all: BTreeSet<u64> = va.iter().chain(&vb).copied().collect();
    assert_eq!(all.len() as i64, appends, "two appends took one version: {va:?} {vb:?}");
    // Version 0 creates the table; the appends are every version after it.
    assert_eq!(all, (1..=appends as u64).collect::<BTreeSet<_>>());

    let got = ids_and_notes(&location).await;
    assert_eq!(got, (0..appends * 3).map(|i| (i, None)).collect::<Vec<_>>());
    let log = dir.path().join("log/_delta_log");
    assert!(
        log.join(format!("{CHECKPOINT_EVERY:020}.checkpoint.parquet")).is_file(),
        "no checkpoint at version {CHECKPOINT_EVERY}: {:?}",
        std::fs::read_dir(&log)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.contains("checkpoint"))
            .collect::<Vec<_>>()
    );
    // deltalake reads the table as the appends left it: one file an append.
    let table = quiver_offline::delta::open_table(&location).await.unwrap().unwrap();
    assert_eq!(table.version(), Some(appends as u64));
    assert_eq!(table.get_file_uris().unwrap().count() as i64, appends);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_opens_the_table_again_after_another_changed_its_schema() {
    let dir = tempfile::tempdir().unwrap();
    let location = StoreLocation::Local(dir.path().join("log"));
    let (narrow, wide) = (schema(false), schema(true));
    let mut old = AppendTable::new(location.clone(), narrow.clone(), "serving_log");
    let mut new = AppendTable::new(location.clone(), wide.clone(), "serving_log");
    assert_eq!(old.append(rows(&narrow, 0..2)).await.unwrap(), 1);
    // A newer writer adds a column (a schema change, through deltalake's merge).
    assert_eq!(new.append(rows(&wide, 2..4)).await.unwrap(), 2);
    // The older writer's next version was taken by that change: it opens the table
    // again and writes its rows into the new schema (the column null).
    assert_eq!(old.append(rows(&narrow, 4..6)).await.unwrap(), 3);
    assert_eq!(new.append(rows(&wide, 6..8)).await.unwrap(), 4);
    let note = |i: i64| (2..4).contains(&i) || (6..8).contains(&i);
    assert_eq!(ids_and_notes(&location).await, (0..8).map(|i| (i, note(i).then(|| format!("n{i}")))).collect::<Vec<_>>());
}
