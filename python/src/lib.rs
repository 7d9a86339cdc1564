//! `quiver._quiver`: the Rust core behind the `quiver` Python package.
//!
//! Thin by design: definitions arrive as JSON of the same serde structures YAML
//! produces (so both go through one validation and one registry), tables cross as
//! Arrow through the PyCapsule stream interface ([`arrow_stream`]), and every long call
//! releases the GIL and checks for Ctrl-C while it runs. Errors become the Python
//! exception hierarchy declared here, with the Rust message intact.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use arrow::compute::concat_batches;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use quiver::Repo;
use quiver::ops::{Engine, Rows, Spine};
use quiver::runtime::encoding::KeyValue;
use quiver::sdk::Definitions;

mod arrow_stream;
mod gather;
use arrow_stream::{ArrowStream, read_table};

create_exception!(_quiver, QuiverError, PyException, "Every error Quiver raises.");
create_exception!(_quiver, ValidationError, QuiverError, "Definitions or data that do not fit (bad type, naive time, unknown field).");
create_exception!(_quiver, NotFoundError, QuiverError, "An unknown feature view, feature, service or repository.");
create_exception!(_quiver, StoreUnavailableError, QuiverError, "The online or offline store cannot be reached.");

/// Picks the exception class from the error's kind (`quiver::sdk::ErrorKind`, looking
/// through the chain for the first error that has one); the message is Rust's, whole.
fn py_err(e: impl Into<anyhow::Error>) -> PyErr {
    use quiver::sdk::ErrorKind;
    let e: anyhow::Error = e.into();
    let text = format!("{e:#}");
    let kind = e.chain().find_map(quiver::Error::kind_of);
    match kind {
        Some(ErrorKind::Invalid) => ValidationError::new_err(text),
        Some(ErrorKind::NotFound) => NotFoundError::new_err(text),
        Some(ErrorKind::Unavailable) => StoreUnavailableError::new_err(text),
        _ => QuiverError::new_err(text),
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime"))
}

/// Runs `work` on the runtime with the GIL released, checking every 100 ms whether
/// Python has a pending signal: Ctrl-C drops (cancels) the work and raises
/// KeyboardInterrupt.
fn run<T: Send + 'static>(py: Python<'_>, work: impl Future<Output = anyhow::Result<T>> + Send + 'static) -> PyResult<T> {
    let handle = runtime().spawn(work);
    let abort = handle.abort_handle();
    let mut handle = Some(handle);
    loop {
        let done = py.detach(|| {
            let h = handle.as_mut().expect("handle");
            runtime().block_on(async { tokio::time::timeout(Duration::from_millis(100), h).await.ok() })
        });
        match done {
            Some(Ok(result)) => return result.map_err(py_err),
            Some(Err(join)) => return Err(QuiverError::new_err(format!("internal error: {join}"))),
            None => {
                if let Err(e) = py.check_signals() {
                    abort.abort();
                    handle.take();
                    return Err(e);
                }
            }
        }
    }
}

fn open(repo: &str) -> anyhow::Result<Repo> {
    Ok(Repo::open(Path::new(repo))?)
}

/// Validates definitions given as JSON (the serde form YAML produces) and records them
/// as the registry's next version, defined from `python`; `remove` names objects to
/// remove (`kind/name` or a name) whoever defined them. Returns the registry version
/// after the apply.
#[pyfunction]
#[pyo3(signature = (repo, definitions_json, force = false, remove = Vec::new()))]
fn apply(py: Python<'_>, repo: String, definitions_json: String, force: bool, remove: Vec<String>) -> PyResult<u64> {
    let defs = Definitions::from_json(&definitions_json).map_err(|e| ValidationError::new_err(e.to_string()))?;
    run(py, async move {
        let repo = open(&repo)?;
        let now = chrono::Utc::now();
        let handle = tokio::runtime::Handle::current();
        let origin = quiver::sdk::registry::Origin::new("python").removing(remove);
        let applied = tokio::task::spawn_blocking(move || repo.apply_from(defs, &origin, force, now, handle)).await??;
        Ok(applied.outcome.version)
    })
}

/// The applied definitions as JSON.
#[pyfunction]
fn registry_json(py: Python<'_>, repo: String) -> PyResult<String> {
    run(py, async move {
        let repo = open(&repo)?;
        Ok(serde_json::to_string(&repo.applied()?)?)
    })
}

/// Every live version of the view `view` as JSON (`quiver versions VIEW --json`).
#[pyfunction]
fn versions(py: Python<'_>, repo: String, view: String) -> PyResult<String> {
    run(py, async move {
        let repo = open(&repo)?;
        let handle = tokio::runtime::Handle::current();
        let versions = tokio::task::spawn_blocking(move || repo.versions(&view, &handle)).await??;
        Ok(serde_json::to_string(&versions)?)
    })
}

/// Appends a table of `view`'s rows to its Delta table in one commit, unless the table
/// already holds the same content (and not `allow_duplicate`); returns (rows, table
/// version (`None` when the source filter dropped every row), whether it was a
/// duplicate and nothing was appended).
#[pyfunction]
#[pyo3(signature = (repo, view, table, allow_duplicate = false))]
fn ingest(
    py: Python<'_>,
    repo: String,
    view: String,
    table: &Bound<'_, PyAny>,
    allow_duplicate: bool,
) -> PyResult<(usize, Option<u64>, bool)> {
    let (_, batches) = read_table(table, "table")?;
    run(py, async move {
        let repo = open(&repo)?;
        let report = repo.ingest(&view, Rows::Batches(batches, "table".into())).allow_duplicate(allow_duplicate).await?;
        Ok((report.rows, report.version, report.duplicate))
    })
}

/// What a join or lookup asks for: references, or a registered service's name.
#[derive(Debug, FromPyObject)]
enum Asked {
    Service(String),
    Features(Vec<String>),
}

/// The point-in-time join of `entity_df` (a table with the join keys and
/// `event_timestamp`) with `asked` (references, or a service's name); returns a table.
/// `engine`: auto, cpu or gpu; `cluster`: `df://HOST:PORT` of a Ballista scheduler to
/// join on.
#[pyfunction]
#[pyo3(signature = (repo, entity_df, asked, created_cutoff = false, engine = "auto", cluster = None, made = None))]
#[allow(clippy::too_many_arguments)]
fn get_historical_features(
    py: Python<'_>,
    repo: String,
    entity_df: Option<&Bound<'_, PyAny>>,
    asked: Asked,
    created_cutoff: bool,
    engine: &str,
    cluster: Option<String>,
    made: Option<String>,
) -> PyResult<ArrowStream> {
    let engine: Engine = engine.parse().map_err(ValidationError::new_err)?;
    let spine = match (entity_df, made) {
        (Some(df), None) => {
            let (schema, batches) = read_table(df, "entity_df")?;
            Spine::Batch(
                concat_batches(&schema, &batches).map_err(|e| ValidationError::new_err(format!("entity_df: {e}")))?,
                "entity_df".into(),
            )
        }
        (None, Some(made)) => Spine::Made(made_spine(&made)?),
        _ => return Err(ValidationError::new_err("give exactly one of entity_df, entities_at= and rows_of=")),
    };
    let joined = run(py, async move {
        let repo = open(&repo)?;
        let op = repo.historical(spine).with_engine(engine).with_created_cutoff(created_cutoff).with_cluster(cluster);
        let op = match asked {
            Asked::Service(service) => op.with_service(service),
            Asked::Features(features) => op.with_features(features),
        };
        Ok(op.await?.batch)
    })?;
    Ok(ArrowStream::new(joined))
}

/// The lineage events still queued for an HTTP endpoint sent while it answers
/// (docs/lineage.md#transports); `quiver/__init__.py` calls it at the interpreter's exit.
#[pyfunction]
fn flush_lineage(py: Python<'_>) {
    py.detach(quiver::lineage::flush);
}

/// A time as the CLI takes it (RFC 3339, a date, `now`, a duration before now such as
/// `7d`), as RFC 3339 text; an error names `what`.
#[pyfunction]
fn parse_time(what: &str, text: &str) -> PyResult<String> {
    quiver::ops::parse_time(what, text, quiver::sdk::Timestamp::now())
        .map(|t| t.to_string())
        .map_err(|e| ValidationError::new_err(e.to_string()))
}

/// A made spine from its manifest JSON (`{"kind": "entities_at", "at": ...}`), as the
/// Python layer writes it.
fn made_spine(json: &str) -> PyResult<quiver::ops::MadeSpine> {
    // Read through `RowsOf::new`, which checks every rule of a made spine (from a JSON
    // value, so its errors say what is wrong, not where in the text).
    let value: serde_json::Value = serde_json::from_str(json).map_err(|e| ValidationError::new_err(format!("spine: {e}")))?;
    serde_json::from_value(value).map_err(|e| ValidationError::new_err(e.to_string()))
}

/// Loads the latest values with event time in [start, end] into the online store;
/// returns (view, entities, written, skipped as already expired) per view.
#[pyfunction]
#[pyo3(signature = (repo, start, end, views = Vec::new()))]
fn materialize(
    py: Python<'_>,
    repo: String,
    start: chrono::DateTime<chrono::Utc>,
    end: chrono::DateTime<chrono::Utc>,
    views: Vec<String>,
) -> PyResult<Vec<(String, usize, usize, usize)>> {
    run(py, async move {
        let repo = open(&repo)?;
        let reports = repo.materialize(start.into(), end.into()).with_views(views).await?;
        Ok(reports.into_iter().map(|r| (r.view, r.entities, r.written, r.expired)).collect())
    })
}

/// One applied definition as JSON: `kind` is `entity`, `feature_view` or
/// `feature_service`; an unknown name is the registry's NotFound, naming the known ones.
#[pyfunction]
fn definition(py: Python<'_>, repo: String, kind: String, name: String) -> PyResult<String> {
    run(py, async move {
        let defs = open(&repo)?.applied()?.definitions;
        Ok(match kind.as_str() {
            "feature_view" => serde_json::to_string(defs.find_view(&name).map_err(|e| quiver::Error::NotFound(e.0))?)?,
            "feature_service" => serde_json::to_string(defs.find_service(&name).map_err(|e| quiver::Error::NotFound(e.0))?)?,
            "entity" => serde_json::to_string(defs.find_entity(&name).map_err(|e| quiver::Error::NotFound(e.0))?)?,
            "on_demand_view" => serde_json::to_string(defs.on_demand_view(&name).ok_or_else(|| {
                let known = quiver::sdk::known(defs.on_demand_views.iter().map(|v| v.name.as_str()));
                quiver::Error::NotFound(format!("unknown on-demand view `{name}` (known: {known})"))
            })?)?,
            other => anyhow::bail!(quiver::Error::Invalid(format!("no definitions of kind `{other}`"))),
        })
    })
}

/// What applying `definitions_json` (defined from `python`, removing `remove`) would
/// change, without writing: the plan as `quiver plan` prints it, and (added, changed,
/// removed) counts.
#[pyfunction]
#[pyo3(signature = (repo, definitions_json, remove = Vec::new()))]
fn plan(py: Python<'_>, repo: String, definitions_json: String, remove: Vec<String>) -> PyResult<(String, (usize, usize, usize))> {
    let defs = Definitions::from_json(&definitions_json).map_err(|e| ValidationError::new_err(e.to_string()))?;
    run(py, async move {
        let repo = open(&repo)?;
        defs.validate().map_err(quiver::sdk::Error::from)?;
        let origin = quiver::sdk::registry::Origin::new("python").removing(remove);
        let handle = tokio::runtime::Handle::current();
        // As `quiver plan`: the views a breaking change gives a new version, read from
        // their tables (off the runtime's threads, which the probe blocks on).
        let plan = tokio::task::spawn_blocking(move || -> anyhow::Result<quiver::sdk::Plan> {
            let probe = quiver::offline::DeltaProbe::new(&repo.config, handle);
            Ok(repo.applied()?.plan_versions(&defs, &origin, &probe, false).map_err(quiver::Error::from)?.1)
        })
        .await??;
        Ok((plan.to_string(), plan.counts()))
    })
}

/// Exports `service`'s training set for the spine file into `out` (sharded, with its
/// manifest); returns the manifest as JSON.
#[pyfunction]
#[pyo3(signature = (repo, service, spine, out, shard_rows = None, created_cutoff = false, made = None))]
#[allow(clippy::too_many_arguments)]
fn export(
    py: Python<'_>,
    repo: String,
    service: String,
    spine: Option<String>,
    out: String,
    shard_rows: Option<u64>,
    created_cutoff: bool,
    made: Option<String>,
) -> PyResult<String> {
    let spine = match (spine, made) {
        (Some(path), None) => Spine::File(path.into()),
        (None, Some(made)) => Spine::Made(made_spine(&made)?),
        _ => return Err(ValidationError::new_err("give exactly one of spine, entities_at= and rows_of=")),
    };
    run(py, async move {
        let repo = open(&repo)?;
        let mut export = repo.export(&service, spine, out).with_created_cutoff(created_cutoff);
        if let Some(rows) = shard_rows {
            export = export.with_shard_rows(rows);
        }
        Ok(serde_json::to_string(&export.await?.manifest)?)
    })
}

/// `monitor`: `reference` against `current` (`training:DIR`, `offline:T1..T2`,
/// `serving:T1..T2`) for a service's features or references; the report as JSON (also
/// stored under `.quiver/monitor/`).
#[pyfunction]
#[pyo3(signature = (repo, reference, current, features = Vec::new(), service = None))]
fn monitor(
    py: Python<'_>,
    repo: String,
    reference: String,
    current: String,
    features: Vec<String>,
    service: Option<String>,
) -> PyResult<String> {
    run(py, async move {
        let repo = open(&repo)?;
        let now = quiver::sdk::Timestamp::now();
        let reference = quiver::Window::parse("reference", &reference, now)?;
        let current = quiver::Window::parse("current", &current, now)?;
        let op = repo.monitor(reference, current);
        let op = match service {
            Some(s) => op.with_service(s),
            None => op.with_features(features),
        };
        Ok(serde_json::to_string(&op.await?.report)?)
    })
}

/// One feature's sample check: (feature, compared, matches, mismatches, missing online,
/// examples).
type SampleReport = (String, u64, u64, u64, u64, Vec<String>);

/// `verify --sample n`: a [`SampleReport`] per feature.
#[pyfunction]
fn verify_sample(py: Python<'_>, repo: String, n: usize) -> PyResult<Vec<SampleReport>> {
    run(py, async move {
        let repo = open(&repo)?;
        let reports = repo.verify_sample(n).await?;
        Ok(reports.into_iter().map(|r| (r.feature, r.compared, r.matches, r.mismatches, r.missing_online, r.examples)).collect())
    })
}

/// Loads what arrived since the last incremental run, up to `end`.
#[pyfunction]
fn materialize_incremental(
    py: Python<'_>,
    repo: String,
    end: chrono::DateTime<chrono::Utc>,
) -> PyResult<Vec<(String, usize, usize, usize)>> {
    run(py, async move {
        let repo = open(&repo)?;
        let reports = repo.materialize_incremental(end.into()).await?;
        Ok(reports.into_iter().map(|r| (r.view, r.entities, r.written, r.expired)).collect())
    })
}

/// One column of an online answer: its name, its values as JSON text, their statuses.
type AnswerColumn = (String, String, Vec<String>);

/// Online lookup. `entities` maps each join key (and request field of the on-demand
/// features asked for) to its values (one per row). Returns
/// (name, values as JSON text, statuses) per column, join keys first, and the same
/// values as a table typed by the definitions (a feature's type even when every value
/// is missing).
#[pyfunction]
#[pyo3(signature = (repo, entities_json, features = None, feature_service = None, full_feature_names = false))]
fn get_online_features(
    py: Python<'_>,
    repo: String,
    entities_json: String,
    features: Option<Vec<String>>,
    feature_service: Option<String>,
    full_feature_names: bool,
) -> PyResult<(Vec<AnswerColumn>, ArrowStream)> {
    let entities: Vec<(String, Vec<serde_json::Value>)> =
        serde_json::from_str(&entities_json).map_err(|e| ValidationError::new_err(format!("entity_rows: {e}")))?;
    run(py, async move {
        let repo = open(&repo)?;
        // Join keys and request fields alike, told apart by the features asked for.
        let mut op = repo.lookup(Vec::new()).with_columns(entities).with_full_names(full_feature_names);
        op = match (&feature_service, &features) {
            (Some(service), _) => op.with_service(service.clone()),
            (None, Some(features)) => op.with_features(features.clone()),
            (None, None) => anyhow::bail!(quiver::Error::Invalid("give `features` or `feature_service`".into())),
        };
        let result = op.await?;
        let defs = repo.applied()?.definitions;
        let refs: Vec<quiver::sdk::FeatureRef> = match (feature_service, features) {
            (Some(service), _) => defs.find_service(&service).map_err(|e| quiver::Error::NotFound(e.0))?.features.clone(),
            (None, features) => features.unwrap_or_default().iter().filter_map(|f| f.parse().ok()).collect(),
        };
        let n_keys = result.len() - refs.len();
        let table = ArrowStream::new(typed_answer(&defs, n_keys, &refs, &result)?);
        let columns = result
            .into_iter()
            .map(|c| {
                // The server's JSON of each value (floats keep their point; NaN and the infinities
                // are the strings "NaN", "Infinity", "-Infinity", which results.py reads back).
                let values: Vec<String> = c.values.iter().map(quiver::online::lookup::wire::value_json).collect();
                (c.name, format!("[{}]", values.join(",")), c.statuses.iter().map(|s| s.as_str().to_string()).collect())
            })
            .collect();
        Ok((columns, table))
    })
}

/// A lookup's answer as one batch: each join key typed by the entity that defines it,
/// each feature by its definition (an aggregation by its output), whatever the values.
fn typed_answer(
    defs: &Definitions,
    n_keys: usize,
    refs: &[quiver::sdk::FeatureRef],
    columns: &[quiver::online::lookup::Column],
) -> anyhow::Result<arrow::array::RecordBatch> {
    use quiver::offline::schema::{key_array, values_to_array};
    use quiver::runtime::encoding::Value;
    let mut fields = Vec::with_capacity(columns.len());
    let mut arrays = Vec::with_capacity(columns.len());
    for (i, c) in columns.iter().enumerate() {
        let array = if i < n_keys {
            let key = defs.entities.iter().flat_map(|e| &e.join_keys).find(|k| k.name == c.name);
            let dtype = match (key, c.values.first()) {
                (Some(k), _) => k.dtype,
                (None, Some(Value::String(_))) => quiver::sdk::KeyType::String,
                (None, _) => quiver::sdk::KeyType::Int64,
            };
            let keys: Vec<KeyValue> = c
                .values
                .iter()
                .map(|v| match v {
                    Value::String(s) => KeyValue::Str(s.clone()),
                    Value::Int64(n) => KeyValue::Int(*n),
                    _ => KeyValue::Int(0),
                })
                .collect();
            key_array(dtype, keys.iter())
        } else {
            let r = &refs[i - n_keys];
            let dtype = defs.feature_dtype(r).ok_or_else(|| quiver::Error::NotFound(format!("feature `{r}`")))?;
            values_to_array(dtype, c.values.iter())
        };
        fields.push(arrow::datatypes::Field::new(&c.name, array.data_type().clone(), true));
        arrays.push(array);
    }
    Ok(arrow::array::RecordBatch::try_new(std::sync::Arc::new(arrow::datatypes::Schema::new(fields)), arrays)?)
}

/// What [`push`] returns: rows written, online written, offline version, rows the
/// filter dropped, values not computed.
type PushReport = (usize, Option<usize>, Option<u64>, usize, u64);

/// Writes a table of `view`'s rows through the streaming write path to `to` (online,
/// offline or online_and_offline; default both for an online view, offline for an
/// offline-only one). Returns (rows, online written or None, offline version or None,
/// rows the view's source filter dropped, values its expressions could not compute).
#[pyfunction]
#[pyo3(signature = (repo, view, table, to = None))]
fn push(py: Python<'_>, repo: String, view: String, table: &Bound<'_, PyAny>, to: Option<String>) -> PyResult<PushReport> {
    let target: Option<quiver::streaming::Target> = to.map(|t| t.parse()).transpose().map_err(ValidationError::new_err)?;
    let (_, batches) = read_table(table, "table")?;
    run(py, async move {
        let repo = open(&repo)?;
        let report = repo.push(&view, Rows::Batches(batches, "table".into())).with_target(target).await?;
        Ok((report.rows, report.online_written, report.offline_version, report.dropped, report.uncomputed))
    })
}

/// Sleeps `seconds` in Rust with the GIL released (tests Ctrl-C handling).
#[pyfunction]
fn _sleep(py: Python<'_>, seconds: f64) -> PyResult<()> {
    run(py, async move {
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        Ok(())
    })
}

#[pymodule]
fn _quiver(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("QuiverError", py.get_type::<QuiverError>())?;
    m.add("ValidationError", py.get_type::<ValidationError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("StoreUnavailableError", py.get_type::<StoreUnavailableError>())?;
    m.add_class::<ArrowStream>()?;
    m.add_function(wrap_pyfunction!(apply, m)?)?;
    m.add_function(wrap_pyfunction!(registry_json, m)?)?;
    m.add_function(wrap_pyfunction!(ingest, m)?)?;
    m.add_function(wrap_pyfunction!(get_historical_features, m)?)?;
    m.add_function(wrap_pyfunction!(materialize, m)?)?;
    m.add_function(wrap_pyfunction!(materialize_incremental, m)?)?;
    m.add_function(wrap_pyfunction!(get_online_features, m)?)?;
    m.add_function(wrap_pyfunction!(push, m)?)?;
    m.add_function(wrap_pyfunction!(definition, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(versions, m)?)?;
    m.add_function(wrap_pyfunction!(export, m)?)?;
    m.add_function(wrap_pyfunction!(verify_sample, m)?)?;
    m.add_function(wrap_pyfunction!(monitor, m)?)?;
    m.add_function(wrap_pyfunction!(parse_time, m)?)?;
    m.add_function(wrap_pyfunction!(flush_lineage, m)?)?;
    m.add_function(wrap_pyfunction!(gather::place_rows, m)?)?;
    m.add_function(wrap_pyfunction!(_sleep, m)?)?;
    Ok(())
}
