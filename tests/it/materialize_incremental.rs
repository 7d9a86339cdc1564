//! Incremental materialization: late rows (old event times, new Delta versions) are
//! picked up, rows past END wait for a later END, reruns load nothing new, and a failed
//! run leaves the recorded progress unchanged.

use std::path::Path;
use std::sync::Arc;

use quiver::Repo;
use quiver::online::lookup::{Status, get_online_features};
use quiver::online::{EmbeddedStore, OnlineStore, RedisStore, WriteRow};
use quiver::runtime::encoding::{KeyValue, Value};
use quiver::sdk::{FeatureRef, Timestamp};

const FEATURES: &str = "entities: [{name: user, join_keys: [{name: user_id, dtype: int64}]}]
feature_views:
  - {name: score, entities: [user], source: {created_timestamp_field: created_timestamp}, features: [{name: score, dtype: float64}]}
  - {name: other, entities: [user], features: [{name: x, dtype: int64}]}
";

fn t(hhmm: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(&format!("2024-01-01T{hhmm}:00Z")).unwrap().timestamp_micros()
}

async fn ingest(repo: &Repo, view: &str, name: &str, csv: &str) {
    let path = repo.config.repo.join(name);
    std::fs::write(&path, csv).unwrap();
    let defs = repo.applied().unwrap().registered();
    let v = defs.feature_view(view).unwrap();
    quiver::offline::ingest::ingest(
        &repo.config.view_table(v),
        &defs,
        v,
        &path,
        repo.config.event_horizon(chrono::Utc::now().timestamp_micros()),
        &|_, _| {},
    )
    .await
    .unwrap();
}

async fn scores(repo: &Repo, store: &dyn OnlineStore, users: &[i64]) -> Vec<Option<f64>> {
    let defs = repo.applied().unwrap().registered();
    let entities = vec![("user_id".to_string(), users.iter().map(|&u| KeyValue::Int(u)).collect())];
    let cols = get_online_features(
        store,
        &repo.config.project,
        &defs,
        &[FeatureRef::new("score", "score")],
        (&entities, &Vec::new()),
        t("23:00"),
        true,
    )
    .await
    .unwrap();
    cols[1]
        .values
        .iter()
        .zip(&cols[1].statuses)
        .map(|(v, s)| match (v, s) {
            (Value::Float64(x), Status::Present) => Some(*x),
            _ => None,
        })
        .collect()
}

async fn run(repo: &Repo, store: &Arc<dyn OnlineStore>, end: &str) -> Vec<(String, usize)> {
    repo.materialize_incremental(Timestamp(t(end)))
        .with_store(store.clone())
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.view, r.entities))
        .collect()
}

fn setup(dir: &Path) -> Repo {
    quiver::init(dir, false, chrono::Utc::now()).unwrap();
    std::fs::write(dir.join("features.yaml"), FEATURES).unwrap();
    let repo = Repo::open(dir).unwrap();
    let r = repo.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        r.apply(false, chrono::Utc::now(), rt.handle().clone()).unwrap();
    })
    .join()
    .unwrap();
    repo
}

const HEADER: &str = "user_id,event_timestamp,created_timestamp,score\n";

async fn late_rows_are_picked_up(store: Arc<dyn OnlineStore>) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = setup(&tmp.path().join(format!("inc{}", std::process::id())));
    ingest(
        &repo,
        "score",
        "a.csv",
        &format!("{HEADER}1,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,1.0\n2,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,2.0\n"),
    )
    .await;
    assert_eq!(run(&repo, &store, "12:00").await, [("score".into(), 2), ("other".into(), 0)]);
    assert_eq!(scores(&repo, store.as_ref(), &[1, 2, 3, 4]).await, [Some(1.0), Some(2.0), None, None]);

    // Late data: an older row for 1 (must not win), a newer one for 2, a new user 3
    // with an old event time, and user 4 after END.
    ingest(
        &repo,
        "score",
        "b.csv",
        &format!(
            "{HEADER}1,2024-01-01T09:00:00Z,2024-01-01T11:00:00Z,9.0\n2,2024-01-01T11:00:00Z,2024-01-01T11:00:00Z,22.0\n3,2024-01-01T08:00:00Z,2024-01-01T11:00:00Z,3.0\n4,2024-01-01T13:30:00Z,2024-01-01T13:30:00Z,4.0\n"
        ),
    )
    .await;
    assert_eq!(run(&repo, &store, "12:00").await, [("score".into(), 3), ("other".into(), 0)]);
    assert_eq!(scores(&repo, store.as_ref(), &[1, 2, 3, 4]).await, [Some(1.0), Some(22.0), Some(3.0), None]);
    // Nothing new: nothing loaded.
    assert_eq!(run(&repo, &store, "12:00").await, [("score".into(), 0), ("other".into(), 0)]);
    // A later END takes user 4's row, ingested earlier but beyond the old END.
    assert_eq!(run(&repo, &store, "14:00").await, [("score".into(), 1), ("other".into(), 0)]);
    assert_eq!(scores(&repo, store.as_ref(), &[4]).await, [Some(4.0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_on_the_embedded_store() {
    let tmp = tempfile::tempdir().unwrap();
    late_rows_are_picked_up(Arc::new(EmbeddedStore::open(&tmp.path().join("o.db")).unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_on_redis() {
    let Ok(url) = std::env::var("QUIVER_TEST_REDIS_URL") else {
        assert!(std::env::var("QUIVER_REQUIRE_REDIS").is_err(), "QUIVER_REQUIRE_REDIS is set but QUIVER_TEST_REDIS_URL is not");
        eprintln!("SKIPPED incremental_on_redis: no Redis (set QUIVER_TEST_REDIS_URL, or use ./run test)");
        return;
    };
    late_rows_are_picked_up(Arc::new(RedisStore::connect(&url).await.unwrap())).await;
}

/// Fails every write of the view `other`: a run that dies between two views.
#[derive(Debug)]
struct FailsOnOther(EmbeddedStore);

#[async_trait::async_trait]
impl OnlineStore for FailsOnOther {
    fn name(&self) -> String {
        self.0.name()
    }
    async fn write(&self, rows: &[WriteRow]) -> quiver::online::Result<usize> {
        if rows.iter().any(|r| r.key.contains(":other:")) {
            return Err(quiver::online::Error::Unavailable { store: self.name(), message: "injected failure".into() });
        }
        self.0.write(rows).await
    }
    async fn read(&self, keys: &[String]) -> quiver::online::Result<Vec<Option<Vec<u8>>>> {
        self.0.read(keys).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_leaves_the_progress_unchanged_and_a_rerun_completes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = setup(&tmp.path().join("crash"));
    let inner = EmbeddedStore::open(&tmp.path().join("o.db")).unwrap();
    ingest(&repo, "score", "a.csv", &format!("{HEADER}1,2024-01-01T10:00:00Z,2024-01-01T10:00:00Z,1.0\n")).await;
    ingest(&repo, "other", "o.csv", "user_id,event_timestamp,x\n1,2024-01-01T10:00:00Z,5\n").await;
    // Where docs/online.md says the progress is recorded.
    let state = repo.config.repo.join(".quiver/materialized.json");
    let failing: Arc<dyn OnlineStore> = Arc::new(FailsOnOther(inner.clone()));
    let err = repo.materialize_incremental(Timestamp(t("12:00"))).with_store(failing).await.unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    assert!(!state.exists(), "progress recorded by a failed run");
    // The rerun loads both views (the first one again, harmlessly) and records both.
    let inner: Arc<dyn OnlineStore> = Arc::new(inner);
    assert_eq!(run(&repo, &inner, "12:00").await, [("score".into(), 1), ("other".into(), 1)]);
    let recorded: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    let views = &recorded[inner.name()];
    assert_eq!(views["score"]["version"], 1);
    assert_eq!(views["other"]["version"], 1);
    assert_eq!(views["score"]["end"], t("12:00"));
}
