//! The events' JSON: OpenLineage 2-0-2 run events and the standard facets Quiver fills.

use serde_json::{Value, json};

/// The producer every event and facet names.
pub const PRODUCER: &str = concat!("https://github.com/quiver-feature-store/quiver/tree/v", env!("CARGO_PKG_VERSION"));
pub const RUN_EVENT_SCHEMA: &str = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent";
const FACETS: &str = "https://openlineage.io/spec/facets";

/// A dataset a run reads or writes, named by OpenLineage's conventions: a local file
/// or table `file` + its absolute path, an object store `s3://bucket` + its key, the
/// online store its URL + the key space.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub namespace: String,
    pub name: String,
    pub facets: serde_json::Map<String, Value>,
}

impl Dataset {
    /// A Delta table or file at `location` (a folder, or an object-store URI).
    pub fn at(location: &str) -> Dataset {
        let (namespace, name) = match location.split_once("://") {
            Some((scheme, rest)) => {
                let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                (format!("{scheme}://{bucket}"), format!("/{key}"))
            }
            None => ("file".to_string(), absolute(location)),
        };
        Dataset { namespace, name, facets: serde_json::Map::new() }
    }

    /// With the Delta version read or written (the dataset-version facet).
    pub fn version(mut self, version: Option<u64>) -> Dataset {
        if let Some(v) = version {
            self.facets.insert("version".into(), facet("1-0-1/DatasetVersionDatasetFacet.json", json!({"datasetVersion": v.to_string()})));
        }
        self
    }

    pub fn facet(mut self, name: &str, value: Value) -> Dataset {
        self.facets.insert(name.into(), value);
        self
    }

    pub(super) fn json(&self) -> Value {
        json!({"namespace": self.namespace, "name": self.name, "facets": self.facets})
    }
}

/// `path` absolute, its `.` and `..` resolved lexically (one name per file).
fn absolute(path: &str) -> String {
    use std::path::Component;
    let p = std::path::Path::new(path);
    let p = if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf()) };
    let mut out = std::path::PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out.display().to_string()
}

/// `fields` with the facet's `_producer` and `_schemaURL` (`file` under the facets'
/// folder, e.g. `1-2-0/SchemaDatasetFacet.json`).
fn facet(file: &str, fields: Value) -> Value {
    let mut out = fields;
    let map = out.as_object_mut().expect("an object");
    map.insert("_producer".into(), PRODUCER.into());
    let name = file.rsplit('/').next().unwrap_or(file).trim_end_matches(".json");
    map.insert("_schemaURL".into(), format!("{FACETS}/{file}#/$defs/{name}").into());
    out
}

/// The schema facet: `(column, type)` in order.
pub fn schema_facet<'a>(columns: impl IntoIterator<Item = (&'a str, String)>) -> Value {
    let fields: Vec<Value> = columns.into_iter().map(|(name, dtype)| json!({"name": name, "type": dtype})).collect();
    facet("1-2-0/SchemaDatasetFacet.json", json!({"fields": fields}))
}

/// An input column of a computed one: its dataset's namespace and name, and the field.
pub type InputField = (String, String, String);

/// One output column's lineage: its name, the input columns it is computed from, and
/// the expression computing it (empty: the input's value as it is, an IDENTITY).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnFrom {
    pub output: String,
    pub inputs: Vec<InputField>,
    pub how: String,
}

/// The column-lineage facet of `columns`.
pub fn column_lineage(columns: &[ColumnFrom]) -> Value {
    let mut fields = serde_json::Map::new();
    for ColumnFrom { output, inputs, how } in columns {
        let inputs: Vec<Value> = inputs
            .iter()
            .map(|(ns, name, field)| {
                let how = if how.is_empty() {
                    json!({"type": "DIRECT", "subtype": "IDENTITY"})
                } else {
                    json!({"type": "DIRECT", "subtype": "TRANSFORMATION", "description": how})
                };
                json!({"namespace": ns, "name": name, "field": field, "transformations": [how]})
            })
            .collect();
        fields.insert(output.clone(), json!({"inputFields": inputs}));
    }
    facet("1-2-0/ColumnLineageDatasetFacet.json", json!({"fields": fields}))
}

pub(super) fn error_facet(message: &str) -> Value {
    facet("1-0-1/ErrorMessageRunFacet.json", json!({"message": message, "programmingLanguage": "rust"}))
}

pub(super) fn job_type_facet(job: &str) -> Value {
    let processing = if job == "stream" { "STREAMING" } else { "BATCH" };
    facet("2-0-4/JobTypeJobFacet.json", json!({"processingType": processing, "integration": "QUIVER", "jobType": "JOB"}))
}

/// Quiver's own job facet: the registry version the job read and the repository's
/// code version.
pub(super) fn quiver_facet(registry: u64, code: Option<super::CodeVersion>) -> Value {
    let mut fields = json!({"registryVersion": registry});
    if let Some(code) = code {
        fields["gitCommit"] = code.commit.into();
        fields["gitDirty"] = code.dirty.into();
    }
    let map = fields.as_object_mut().expect("an object");
    map.insert("_producer".into(), PRODUCER.into());
    map.insert(
        "_schemaURL".into(),
        concat!("https://github.com/quiver-feature-store/quiver/tree/v", env!("CARGO_PKG_VERSION"), "/docs/lineage.md#the-quiver-facet")
            .into(),
    );
    fields
}

/// A fresh random (version 4) UUID.
pub(super) fn run_id() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

pub(super) fn now() -> String {
    quiver_sdk::types::format_instant(chrono::Utc::now().timestamp_micros())
}
