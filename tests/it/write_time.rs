//! Write-time expressions (docs/transformations.md#write-time), end to end: random raw
//! rows — nulls, zeros, negative values, extremes, mixed case, rows on both sides of the
//! filter — written through `ingest` (JSON lines, CSV, Parquet) and `quiver push` give
//! the Delta rows, the online rows and the `historical` answers (aggregations of a
//! computed column included) an independent evaluator (plain Rust, not the expression
//! engine) computes from the same raw rows; the summary lines count the rows the filter
//! dropped and the values that could not be computed; raw rows of the wrong type are
//! refused naming file, row and column, with nothing written.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{Float64Type, Int64Type, TimestampMicrosecondType};
use quiver::Repo;
use quiver::offline::schema::{ViewLayout, value_at};
use quiver::online::{EmbeddedStore, OnlineStore};
use quiver::runtime::encoding::{KeyValue, OnlineRow, Value, store_key};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::common::{fails, ok};

pub(crate) const FEATURES: &str = r#"entities:
  - {name: customer, join_keys: [{name: customer_id, dtype: string}]}
feature_views:
  - name: payments
    entities: [customer]
    source:
      timestamp_field: event_timestamp
      filter: "status = 'ok'"
      raw: [{name: amount_cents, dtype: int64}, {name: status, dtype: string}, {name: country_raw, dtype: string}]
    features:
      - {name: amount, dtype: float64, expr: "CAST(amount_cents AS DOUBLE) / 100"}
      - {name: country, dtype: string, expr: "lower(country_raw)"}
      - {name: is_big, dtype: bool, expr: "amount_cents >= 100000"}
      - {name: items, dtype: int64}
      - {name: per_item, dtype: int64, expr: "amount_cents / items"}
  - name: payment_events
    entities: [customer]
    source:
      timestamp_field: event_timestamp
      filter: "status = 'ok'"
      raw: [{name: amount_cents, dtype: int64}, {name: status, dtype: string}, {name: country_raw, dtype: string}]
    features:
      - {name: amount, dtype: float64, expr: "CAST(amount_cents AS DOUBLE) / 100"}
      - {name: items, dtype: int64}
    aggregations:
      - {name: amount_max_1d, function: max, column: amount, window: 1d}
      - {name: n_1d, function: count, column: amount, window: 1d}
"#;

const T0: i64 = 1_735_689_600_000_000; // 2025-01-01T00:00:00Z
const MINUTE: i64 = 60_000_000;
const HOUR: i64 = 60 * MINUTE;

/// One raw row as a writer receives it.
#[derive(Debug, Clone)]
pub(crate) struct Raw {
    pub(crate) customer: String,
    pub(crate) ts: i64,
    pub(crate) amount_cents: Option<i64>,
    pub(crate) status: Option<&'static str>,
    pub(crate) country: Option<&'static str>,
    pub(crate) items: Option<i64>,
}

/// One stored row of `payments`, as the independent evaluator computes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stored {
    pub(crate) customer: String,
    pub(crate) ts: i64,
    pub(crate) amount: Option<f64>,
    pub(crate) country: Option<String>,
    pub(crate) is_big: Option<bool>,
    pub(crate) items: Option<i64>,
    pub(crate) per_item: Option<i64>,
}

/// The evaluator: SQL's semantics written out by hand. `None`: the filter drops the row
/// (a null status is not 'ok', nor is 'OK').
pub(crate) fn oracle(r: &Raw) -> Option<Stored> {
    if r.status != Some("ok") {
        return None;
    }
    Some(Stored {
        customer: r.customer.clone(),
        ts: r.ts,
        amount: r.amount_cents.map(|c| c as f64 / 100.0),
        country: r.country.map(str::to_lowercase),
        is_big: r.amount_cents.map(|c| c >= 100_000),
        items: r.items,
        // Integer division truncates; a zero divisor or MIN / -1 cannot be computed.
        per_item: match (r.amount_cents, r.items) {
            (Some(a), Some(b)) => a.checked_div(b),
            _ => None,
        },
    })
}

/// Values that could not be computed: kept rows whose division fails.
pub(crate) fn uncomputable(rows: &[Raw]) -> usize {
    rows.iter()
        .filter(|r| r.status == Some("ok") && matches!((r.amount_cents, r.items), (Some(a), Some(b)) if a.checked_div(b).is_none()))
        .count()
}

pub(crate) fn raw_rows(n: usize, seed: u64) -> Vec<Raw> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Distinct times (a minute apart, shuffled), so "latest" is never a tie.
    let mut minutes: Vec<i64> = (0..n as i64).map(|i| i * 7).collect();
    minutes.shuffle(&mut rng);
    let cents = [None, Some(0), Some(-250), Some(99_999), Some(100_000), Some(123_456_789), Some(i64::MIN), Some(i64::MAX), Some(7)];
    let statuses = [Some("ok"), Some("ok"), Some("ok"), Some("failed"), Some("OK"), None];
    let countries = [Some("FR"), Some("fr"), Some("MiXeD"), Some("ÉCOLE"), Some(""), None];
    let items = [None, Some(0), Some(1), Some(-1), Some(3), Some(1000)];
    (0..n)
        .map(|i| Raw {
            customer: format!("c{}", rng.random_range(0..12)),
            ts: T0 + minutes[i] * MINUTE,
            amount_cents: cents[rng.random_range(0..cents.len())],
            status: statuses[rng.random_range(0..statuses.len())],
            country: countries[rng.random_range(0..countries.len())],
            items: items[rng.random_range(0..items.len())],
        })
        .collect()
}

pub(crate) fn rfc3339(us: i64) -> String {
    quiver::sdk::types::format_instant(us)
}

/// One raw row as a JSON object (a line of a JSON-lines file, a Kafka message).
pub(crate) fn raw_json(r: &Raw) -> serde_json::Value {
    serde_json::json!({
        "customer_id": r.customer, "event_timestamp": rfc3339(r.ts), "amount_cents": r.amount_cents,
        "status": r.status, "country_raw": r.country, "items": r.items,
    })
}

fn write_jsonl(path: &Path, rows: &[Raw]) {
    let mut f = File::create(path).unwrap();
    for r in rows {
        writeln!(f, "{}", raw_json(r)).unwrap();
    }
}

fn write_csv(path: &Path, rows: &[Raw]) {
    let mut f = File::create(path).unwrap();
    writeln!(f, "customer_id,event_timestamp,amount_cents,status,country_raw,items").unwrap();
    let opt = |v: Option<i64>| v.map_or(String::new(), |v| v.to_string());
    for r in rows {
        // An empty string and a missing value are the same in CSV: both null.
        let (status, country) = (r.status.unwrap_or(""), r.country.unwrap_or(""));
        writeln!(f, "{},{},{},{status},{country},{}", r.customer, rfc3339(r.ts), opt(r.amount_cents), opt(r.items)).unwrap();
    }
}

fn write_parquet(path: &Path, rows: &[Raw]) {
    let batch = RecordBatch::try_from_iter([
        ("customer_id", Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.customer.clone()))) as ArrayRef),
        ("event_timestamp", Arc::new(TimestampMicrosecondArray::from_iter_values(rows.iter().map(|r| r.ts)).with_timezone("UTC"))),
        ("amount_cents", Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.amount_cents)))),
        ("status", Arc::new(StringArray::from_iter(rows.iter().map(|r| r.status)))),
        ("country_raw", Arc::new(StringArray::from_iter(rows.iter().map(|r| r.country)))),
        ("items", Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.items)))),
    ])
    .unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// CSV cannot tell an empty string from a missing value: what a CSV file says.
fn as_csv_reads(rows: &[Raw]) -> Vec<Raw> {
    rows.iter()
        .map(|r| Raw { status: r.status.filter(|s| !s.is_empty()), country: r.country.filter(|c| !c.is_empty()), ..r.clone() })
        .collect()
}

fn repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("quiver.yaml"),
        "project: shaped\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n  type: embedded\n  path: online.db\n",
    )
    .unwrap();
    std::fs::write(dir.join("features.yaml"), FEATURES).unwrap();
    ok(dir, &["apply"]);
}

/// The Delta rows of `payments`, sorted by (customer, time).
pub(crate) async fn delta_rows(dir: &Path) -> Vec<Stored> {
    let repo = Repo::open(dir).unwrap();
    let defs = repo.applied().unwrap().definitions;
    let view = defs.feature_view("payments").unwrap();
    let layout = ViewLayout::scanned(&defs, view);
    let mut out = Vec::new();
    for b in quiver::offline::historical::read_view(&repo.config, &defs, view).await.unwrap() {
        // Scans may read strings as views: each column as its feature's type.
        let columns: Vec<ArrayRef> =
            (0..5).map(|k| arrow::compute::cast(b.column(layout.feature(k)), &view.features[k].dtype.arrow_type()).unwrap()).collect();
        let feature = |k: usize, r: usize| value_at(columns[k].as_ref(), r, view.features[k].dtype);
        let customers = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8).unwrap();
        for r in 0..b.num_rows() {
            out.push(stored_of(
                customers.as_string::<i32>().value(r).to_string(),
                b.column(layout.event_time()).as_primitive::<TimestampMicrosecondType>().value(r),
                &(0..5).map(|k| feature(k, r)).collect::<Vec<_>>(),
            ));
        }
    }
    out.sort_by(|a, b| (&a.customer, a.ts).cmp(&(&b.customer, b.ts)));
    out
}

pub(crate) fn stored_of(customer: String, ts: i64, values: &[Value]) -> Stored {
    let float = |v: &Value| if let Value::Float64(f) = v { Some(*f) } else { None };
    let int = |v: &Value| if let Value::Int64(i) = v { Some(*i) } else { None };
    Stored {
        customer,
        ts,
        amount: float(&values[0]),
        country: if let Value::String(s) = &values[1] { Some(s.clone()) } else { None },
        is_big: if let Value::Bool(b) = values[2] { Some(b) } else { None },
        items: int(&values[3]),
        per_item: int(&values[4]),
    }
}

/// The online row of `customer` in `payments`, as stored.
async fn online_row(dir: &Path, customer: &str) -> Option<Stored> {
    let store = EmbeddedStore::open(&dir.join("online.db")).unwrap();
    let got = store.read(&[store_key("shaped", "payments", &[KeyValue::Str(customer.into())])]).await.unwrap();
    got[0].as_ref().map(|b| {
        let row = OnlineRow::decode(b).unwrap();
        stored_of(customer.to_string(), row.event_ts, &row.values)
    })
}

/// The latest stored row per customer among `rows`.
pub(crate) fn latest(rows: &[Stored]) -> std::collections::BTreeMap<String, Stored> {
    let mut out: std::collections::BTreeMap<String, Stored> = Default::default();
    for r in rows {
        if out.get(&r.customer).is_none_or(|l| l.ts < r.ts) {
            out.insert(r.customer.clone(), r.clone());
        }
    }
    out
}

/// `ingest` (JSON lines, CSV, Parquet) and `quiver push` of random raw rows store what
/// the evaluator computes, count what the filter dropped and what could not be
/// computed, and the join answers from the computed rows — aggregations of a computed
/// column included — as a naive point-in-time evaluation of them does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_writer_stores_what_the_expressions_compute() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    repo(&dir);
    let raw = raw_rows(600, 41);
    let chunks: Vec<&[Raw]> = raw.chunks(120).collect();
    write_jsonl(&dir.join("a.jsonl"), chunks[0]);
    write_csv(&dir.join("b.csv"), chunks[1]);
    write_parquet(&dir.join("c.parquet"), chunks[2]);
    write_jsonl(&dir.join("d.jsonl"), chunks[3]);
    // What each file says (CSV's empty strings are nulls).
    let said: Vec<Vec<Raw>> = vec![chunks[0].to_vec(), as_csv_reads(chunks[1]), chunks[2].to_vec(), chunks[3].to_vec(), chunks[4].to_vec()];
    for (i, file) in ["a.jsonl", "b.csv", "c.parquet"].iter().enumerate() {
        let out = ok(&dir, &["ingest", "payments", file]);
        let kept = said[i].iter().filter_map(oracle).count();
        let dropped = said[i].len() - kept;
        assert!(out.contains(&format!("ingested {kept} rows into payments")), "{file}: {out}");
        assert!(out.contains(&format!("; {dropped} rows dropped by the source filter")), "{file}: {out}");
        let failed = uncomputable(&said[i]);
        assert!(failed > 0, "the data has divisions by zero");
        assert!(out.contains(&format!("{failed} values could not be computed (stored null)")), "{file}: {out}");
        ok(&dir, &["ingest", "payment_events", file]);
    }
    let out = ok(&dir, &["push", "payments", "d.jsonl"]);
    let pushed: Vec<Stored> = said[3].iter().filter_map(oracle).collect();
    assert!(out.contains(&format!("pushed {} rows into payments", pushed.len())), "{out}");
    assert!(out.contains(&format!("; {} rows dropped by the source filter", said[3].len() - pushed.len())), "{out}");
    ok(&dir, &["push", "payment_events", "d.jsonl"]);
    // The server's `/push` of the last rows, column-major as Feast sends them.
    let (answer, metrics) = server_push(&dir, &said[4]).await;
    let served: Vec<Stored> = said[4].iter().filter_map(oracle).collect();
    assert_eq!(answer["rows"], served.len(), "{answer}");
    assert_eq!(answer["dropped"], said[4].len() - served.len(), "{answer}");
    assert_eq!(answer["uncomputed"], uncomputable(&said[4]), "{answer}");
    assert!(metrics.contains(&format!("quiver_push_rows_dropped_total {}", said[4].len() - served.len())), "{metrics}");
    assert!(metrics.contains(&format!("quiver_push_uncomputed_total {}", uncomputable(&said[4]))), "{metrics}");
    let pushed: Vec<Stored> = pushed.into_iter().chain(served).collect();
    write_jsonl(&dir.join("e.jsonl"), chunks[4]);
    ok(&dir, &["push", "payment_events", "e.jsonl"]);

    // Delta holds exactly the computed rows of every file.
    let mut want: Vec<Stored> = said.iter().flatten().filter_map(oracle).collect();
    want.sort_by(|a, b| (&a.customer, a.ts).cmp(&(&b.customer, b.ts)));
    let got = delta_rows(&dir).await;
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w);
    }
    // Online, the pushes wrote each customer's latest pushed row that passed the filter:
    // rows failing it (some later than the ones that passed) never replaced one.
    let mut customers = 0;
    for (customer, row) in latest(&pushed) {
        assert_eq!(online_row(&dir, &customer).await.as_ref(), Some(&row), "{customer}");
        customers += 1;
    }
    assert!(customers > 5);

    // The join over the computed rows: a spine row per customer every 5 hours, and at
    // every raw event time (filtered or not).
    let mut spine: Vec<(String, i64)> = Vec::new();
    for c in 0..12 {
        for h in 0..12 {
            spine.push((format!("c{c}"), T0 + h * 5 * HOUR + 13 * MINUTE));
        }
    }
    spine.extend(raw.iter().step_by(3).map(|r| (r.customer.clone(), r.ts)));
    let mut text = String::from("customer_id,event_timestamp\n");
    for (c, t) in &spine {
        text.push_str(&format!("{c},{}\n", rfc3339(*t)));
    }
    std::fs::write(dir.join("spine.csv"), text).unwrap();
    let features = "payments:amount,payments:country,payments:per_item,payment_events:amount_max_1d,payment_events:n_1d";
    ok(&dir, &["historical", "--spine", "spine.csv", "--features", features, "--out", "out.parquet"]);
    let file = File::open(dir.join("out.parquet")).unwrap();
    let batches: Vec<RecordBatch> = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut row = 0;
    let mut windows_with_events = 0;
    for b in &batches {
        let col = |name: &str| b.column_by_name(name).unwrap_or_else(|| panic!("column {name}")).clone();
        let (amount, country, per_item) = (col("payments__amount"), col("payments__country"), col("payments__per_item"));
        let (max, n) = (col("payment_events__amount_max_1d"), col("payment_events__n_1d"));
        let country = arrow::compute::cast(&country, &arrow::datatypes::DataType::Utf8).unwrap();
        for r in 0..b.num_rows() {
            let (customer, t) = &spine[row];
            row += 1;
            // Naive as-of: the latest computed row at or before t.
            let asof = want.iter().filter(|s| &s.customer == customer && s.ts <= *t).max_by_key(|s| s.ts);
            let float = |a: &ArrayRef| (!a.is_null(r)).then(|| a.as_primitive::<Float64Type>().value(r));
            let int = |a: &ArrayRef| (!a.is_null(r)).then(|| a.as_primitive::<Int64Type>().value(r));
            assert_eq!(float(&amount), asof.and_then(|s| s.amount), "{customer} at {t}");
            assert_eq!(
                (!country.is_null(r)).then(|| country.as_string::<i32>().value(r).to_string()),
                asof.and_then(|s| s.country.clone())
            );
            assert_eq!(int(&per_item), asof.and_then(|s| s.per_item));
            // The window rule: floor(t - 1d, 1h) <= ts <= t, over the computed amounts.
            let start = (t - 24 * HOUR).div_euclid(HOUR) * HOUR;
            let amounts: Vec<f64> =
                want.iter().filter(|s| &s.customer == customer && s.ts >= start && s.ts <= *t).filter_map(|s| s.amount).collect();
            windows_with_events += usize::from(!amounts.is_empty());
            assert_eq!(int(&n), Some(amounts.len() as i64), "{customer} at {t}");
            assert_eq!(float(&max), amounts.iter().copied().reduce(f64::max), "{customer} at {t}");
        }
    }
    assert_eq!(row, spine.len());
    assert!(windows_with_events > 50, "{windows_with_events}");

    // Materialization puts every customer's latest computed row online.
    ok(&dir, &["materialize", &rfc3339(T0 - HOUR), &rfc3339(T0 + 1000 * HOUR)]);
    for (customer, row) in latest(&want) {
        assert_eq!(online_row(&dir, &customer).await.as_ref(), Some(&row), "{customer}");
    }
}

/// `/push` of `rows` to both stores through the server's router (in process); its
/// answer, and `/metrics` after it.
async fn server_push(dir: &Path, rows: &[Raw]) -> (serde_json::Value, String) {
    let (status, answer, metrics) = server_push_df(dir, raw_df(rows)).await;
    assert_eq!(status, axum::http::StatusCode::OK, "{answer}");
    (answer, metrics)
}

/// The `df` of a `/push` of `rows`, column-major as Feast sends them.
fn raw_df(rows: &[Raw]) -> serde_json::Value {
    serde_json::json!({
        "customer_id": rows.iter().map(|r| r.customer.clone()).collect::<Vec<_>>(),
        "event_timestamp": rows.iter().map(|r| rfc3339(r.ts)).collect::<Vec<_>>(),
        "amount_cents": rows.iter().map(|r| r.amount_cents).collect::<Vec<_>>(),
        "status": rows.iter().map(|r| r.status).collect::<Vec<_>>(),
        "country_raw": rows.iter().map(|r| r.country).collect::<Vec<_>>(),
        "items": rows.iter().map(|r| r.items).collect::<Vec<_>>(),
    })
}

/// `/push` of `df` to both stores through the server's router: status, answer, `/metrics`.
async fn server_push_df(dir: &Path, df: serde_json::Value) -> (axum::http::StatusCode, serde_json::Value, String) {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let repo = Repo::open(dir).unwrap();
    let store: Arc<dyn OnlineStore> = Arc::new(EmbeddedStore::open(&dir.join("online.db")).unwrap());
    let state = Arc::new(quiver::online::server::ServerState {
        store,
        registry: quiver::online::server::RegistryCache::new(repo.config.registry_path.clone(), "shaped").unwrap(),
        project: "shaped".into(),
        auth_token: None,
        metrics: quiver::online::server::Metrics::default(),
        clock: Box::new(|| T0 + 1000 * HOUR),
        offline: Some(Arc::new(quiver::streaming::write::DeltaWriter::new(repo.config.clone()))),
        serving_log: None,
        limits: quiver::online::server::Limits::default(),
        insights: None,
        pending: Default::default(),
    });
    let body = serde_json::json!({"feature_view": "payments", "to": "online_and_offline", "df": df});
    let call = |method: &str, uri: &str, body: String| {
        let request = axum::http::Request::builder().method(method).uri(uri).header("content-type", "application/json");
        quiver::online::server::router(state.clone()).oneshot(request.body(Body::from(body)).unwrap())
    };
    let response = call("POST", "/push", body.to_string()).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let answer = serde_json::from_slice(&bytes).unwrap();
    let metrics = call("GET", "/metrics", String::new()).await.unwrap().into_body().collect().await.unwrap().to_bytes();
    (status, answer, String::from_utf8(metrics.to_vec()).unwrap())
}

/// A raw value of the wrong type is refused naming the file, row and column, and
/// nothing is written; a file whose every row fails the filter writes nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_rows_are_checked_as_their_columns_say() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    repo(&dir);
    let t = rfc3339(T0);
    std::fs::write(
        dir.join("bad.csv"),
        format!("customer_id,event_timestamp,amount_cents,status,country_raw,items\nc1,{t},100,ok,FR,1\nc2,{t},12.5,ok,FR,1\n"),
    )
    .unwrap();
    fails(&dir, &["ingest", "payments", "bad.csv"], &["bad.csv", "row 2", "amount_cents", "12.5"]);
    std::fs::write(
        dir.join("bad.jsonl"),
        format!(
            "{{\"customer_id\": \"c1\", \"event_timestamp\": \"{t}\", \"amount_cents\": 5, \"status\": \"ok\", \"country_raw\": \"FR\", \"items\": 1}}\n\
             {{\"customer_id\": \"c1\", \"event_timestamp\": \"{t}\", \"amount_cents\": \"5\", \"status\": \"ok\", \"country_raw\": \"FR\", \"items\": 1}}\n"
        ),
    )
    .unwrap();
    fails(&dir, &["push", "payments", "bad.jsonl"], &["bad.jsonl", "row 2", "amount_cents"]);
    // A raw column missing from the file is named with the columns expected.
    std::fs::write(dir.join("short.csv"), format!("customer_id,event_timestamp,status,country_raw,items\nc1,{t},ok,FR,1\n")).unwrap();
    fails(&dir, &["ingest", "payments", "short.csv"], &["short.csv", "missing column `amount_cents`"]);
    std::fs::write(
        dir.join("failed.csv"),
        format!("customer_id,event_timestamp,amount_cents,status,country_raw,items\nc1,{t},1,failed,FR,1\nc2,{t},1,,FR,1\n"),
    )
    .unwrap();
    // Issue 53: a file whose every row fails the filter (a day of only failed payments)
    // is not an error: nothing is written, and the summary says what was dropped.
    let out = ok(&dir, &["ingest", "payments", "failed.csv"]);
    assert!(out.contains("ingested no rows into payments: 2 rows dropped by the source filter"), "{out}");
    assert!(out.contains("nothing appended"), "{out}");
    let out = ok(&dir, &["push", "payments", "failed.csv"]);
    assert!(out.contains("pushed no rows into payments: 2 rows dropped by the source filter"), "{out}");
    assert!(delta_rows(&dir).await.is_empty(), "nothing was written");
    // `/push`: a raw value of the wrong type is a 400 naming the row and the column;
    // a push whose every row fails the filter writes nothing and says so.
    let mut df = raw_df(&raw_rows(3, 5));
    df["amount_cents"][1] = serde_json::json!("12.5");
    let (status, answer, _) = server_push_df(&dir, df).await;
    assert_eq!(status, axum::http::StatusCode::BAD_REQUEST, "{answer}");
    let error = answer["error"].as_str().unwrap();
    assert!(error.contains("row 2") && error.contains("amount_cents"), "{error}");
    let failed: Vec<Raw> = raw_rows(3, 5).into_iter().map(|r| Raw { status: Some("failed"), ..r }).collect();
    let (status, answer, metrics) = server_push_df(&dir, raw_df(&failed)).await;
    assert_eq!(status, axum::http::StatusCode::OK, "{answer}");
    assert_eq!((answer["rows"].as_u64(), answer["dropped"].as_u64()), (Some(0), Some(3)), "{answer}");
    assert!(answer.get("offline_version").is_none() && answer.get("online_written").is_none(), "{answer}");
    assert!(metrics.contains("quiver_push_rows_dropped_total 3"), "{metrics}");
    assert!(delta_rows(&dir).await.is_empty(), "nothing was written");
    assert_eq!(online_row(&dir, "c1").await, None);
}

/// A row that fails the filter is never written, so a later one never replaces an
/// earlier row that passed: online and in the join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_row_failing_the_filter_never_replaces_one_that_passed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    repo(&dir);
    let row = |ts: i64, cents: i64, status: &'static str| Raw {
        customer: "c1".into(),
        ts,
        amount_cents: Some(cents),
        status: Some(status),
        country: Some("FR"),
        items: Some(1),
    };
    write_jsonl(&dir.join("early.jsonl"), &[row(T0, 500, "ok")]);
    write_jsonl(&dir.join("late.jsonl"), &[row(T0 + HOUR, 999_999, "failed")]);
    ok(&dir, &["push", "payments", "early.jsonl"]);
    let out = ok(&dir, &["push", "payments", "late.jsonl"]);
    assert!(out.contains("pushed no rows into payments: 1 row dropped by the source filter"), "{out}");
    let online = online_row(&dir, "c1").await.unwrap();
    assert_eq!((online.ts, online.amount), (T0, Some(5.0)));
    assert_eq!(delta_rows(&dir).await.len(), 1);
    std::fs::write(dir.join("spine.csv"), format!("customer_id,event_timestamp\nc1,{}\n", rfc3339(T0 + 2 * HOUR))).unwrap();
    ok(&dir, &["historical", "--spine", "spine.csv", "--features", "payments:amount", "--out", "out.parquet"]);
    let file = File::open(dir.join("out.parquet")).unwrap();
    let batch =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap().next().unwrap().unwrap();
    assert_eq!(batch.column_by_name("payments__amount").unwrap().as_primitive::<Float64Type>().value(0), 5.0);
}

/// Issue 53: a column normalized in place — `raw: [country]` and the feature `country:
/// lower(country)`, as `SELECT lower(country) AS country` — applies, and what `ingest`
/// and `quiver push` store under the name is the computed value: the join and the
/// online store answer it.
#[test]
fn a_raw_column_is_normalized_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("quiver.yaml"),
        "project: shaped\nregistry: registry.json\noffline_store:\n  path: data\nonline_store:\n  type: embedded\n  path: online.db\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("features.yaml"),
        r#"entities:
  - {name: customer, join_keys: [{name: customer_id, dtype: string}]}
feature_views:
  - name: customers
    entities: [customer]
    source: {timestamp_field: event_timestamp, raw: [{name: country, dtype: string}]}
    features:
      - {name: country, dtype: string, expr: "lower(country)"}
"#,
    )
    .unwrap();
    ok(&dir, &["apply"]);
    let t = rfc3339(T0);
    std::fs::write(dir.join("a.csv"), format!("customer_id,event_timestamp,country\nc1,{t},FR\nc2,{t},De\n")).unwrap();
    let out = ok(&dir, &["ingest", "customers", "a.csv"]);
    assert!(out.contains("ingested 2 rows into customers"), "{out}");
    std::fs::write(dir.join("b.jsonl"), format!("{{\"customer_id\": \"c3\", \"event_timestamp\": \"{t}\", \"country\": \"ES\"}}\n"))
        .unwrap();
    ok(&dir, &["push", "customers", "b.jsonl"]);
    let later = rfc3339(T0 + HOUR);
    std::fs::write(dir.join("spine.csv"), format!("customer_id,event_timestamp\nc1,{later}\nc2,{later}\nc3,{later}\n")).unwrap();
    ok(&dir, &["historical", "--spine", "spine.csv", "--features", "customers:country", "--out", "out.parquet"]);
    let file = File::open(dir.join("out.parquet")).unwrap();
    let batch =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap().next().unwrap().unwrap();
    let country = arrow::compute::cast(batch.column_by_name("customers__country").unwrap(), &arrow::datatypes::DataType::Utf8).unwrap();
    assert_eq!(country.as_string::<i32>().iter().collect::<Vec<_>>(), [Some("fr"), Some("de"), Some("es")]);
    let out = ok(&dir, &["online", "--features", "customers:country", "--entity", "customer_id=c3"]);
    assert!(out.lines().any(|l| l.starts_with("customers__country") && l.contains("\"es\"") && l.contains("PRESENT")), "{out}");
}
