//! Spines made from the offline store instead of a file (docs/export.md#without-a-spine):
//! every entity as of a time (`--entities-at`), or every row of a view (`--rows-of`).
//! Both are ordinary spines afterwards, rebuilt exactly from the same Delta versions.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, TimestampMicrosecondArray, UInt32Array};
use arrow::compute::{SortColumn, concat_batches, filter_record_batch, lexsort_to_indices, take_record_batch};
use arrow::datatypes::{Field, Schema};
use arrow::row::{RowConverter, SortField};
use quiver_sdk::{Config, Definitions, FeatureView};
use serde::{Deserialize, Serialize};

use super::SPINE_TIMESTAMP;
use super::scan::{ScanRange, scan_view_at};
use crate::error::{Error, Result};
use crate::schema::key_type;

/// How a spine is made from the offline store; recorded in a training set's manifest so
/// `--reproduce` makes the same rows again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MadeSpine {
    /// Every entity with a row at or before `at` in any of the joined views (which must
    /// share one entity), each at `at`; in key order.
    EntitiesAt {
        #[serde(with = "rfc3339")]
        at: i64,
    },
    /// Every row of a view ([`RowsOf`]).
    RowsOf(RowsOf),
}

/// Every row of `view` (with an event time in `[between.0, between.1)` when given), its
/// keys, its event time as `event_timestamp` and its columns kept; in event-time order.
/// With `sample`, each row is kept with that probability, decided by a hash of the row
/// and `seed`: the same rows every time. Made only by [`RowsOf::new`], which checks
/// every rule (a manifest's too: it is read through it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RowsOfDoc", into = "RowsOfDoc")]
pub struct RowsOf {
    view: String,
    between: Option<(i64, i64)>,
    sample: Option<f64>,
    seed: u64,
}

/// [`RowsOf`] as the manifest writes it.
#[derive(Serialize, Deserialize)]
struct RowsOfDoc {
    view: String,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_pair")]
    between: Option<(i64, i64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sample: Option<f64>,
    #[serde(default)]
    seed: u64,
}

impl TryFrom<RowsOfDoc> for RowsOf {
    type Error = Error;

    fn try_from(doc: RowsOfDoc) -> Result<RowsOf> {
        let seed = (doc.sample.is_some() || doc.seed != 0).then_some(doc.seed);
        RowsOf::new(doc.view, doc.between, doc.sample, seed)
    }
}

impl From<RowsOf> for RowsOfDoc {
    fn from(rows: RowsOf) -> RowsOfDoc {
        RowsOfDoc { view: rows.view, between: rows.between, sample: rows.sample, seed: rows.seed }
    }
}

impl RowsOf {
    /// The rows of `view`, in `between` (start, end: UTC microseconds) when given,
    /// sampled at rate `sample` with `seed` (default 0) when given.
    ///
    /// # Errors
    /// [`Error::Request`]: an empty window, a sample rate outside (0, 1], a seed
    /// without a sample.
    pub fn new(view: impl Into<String>, between: Option<(i64, i64)>, sample: Option<f64>, seed: Option<u64>) -> Result<RowsOf> {
        let rows = RowsOf { view: view.into(), between, sample, seed: seed.unwrap_or(0) };
        let refuse = |why: &str| Err(Error::Request(format!("{}: {why}", rows.describe())));
        if let Some((a, b)) = between
            && a >= b
        {
            return refuse("the window is empty (its start is not before its end)");
        }
        if let Some(r) = sample
            && !(r > 0.0 && r <= 1.0)
        {
            return refuse("--sample must be a rate above 0 and at most 1");
        }
        if seed.is_some() && sample.is_none() {
            return refuse("--seed goes with --sample R");
        }
        Ok(rows)
    }

    /// The view whose rows the spine is.
    pub fn view(&self) -> &str {
        &self.view
    }

    fn describe(&self) -> String {
        let mut out = format!("--rows-of {}", self.view);
        if let Some((a, b)) = self.between {
            out += &format!(" --between {} {}", quiver_sdk::Timestamp(a), quiver_sdk::Timestamp(b));
        }
        if let Some(r) = self.sample {
            out += &format!(" --sample {r} --seed {}", self.seed);
        }
        out
    }
}

impl MadeSpine {
    /// What errors and the manifest call the spine: `--entities-at 2026-01-01T00:00:00Z`.
    pub fn describe(&self) -> String {
        match self {
            MadeSpine::EntitiesAt { at } => format!("--entities-at {}", quiver_sdk::Timestamp(*at)),
            MadeSpine::RowsOf(rows) => rows.describe(),
        }
    }

    /// The views whose tables the spine is made from, besides the joined ones.
    pub fn source_view(&self) -> Option<&str> {
        match self {
            MadeSpine::EntitiesAt { .. } => None,
            MadeSpine::RowsOf(rows) => Some(rows.view()),
        }
    }

    /// The spine's rows, from the tables at `versions` (the latest for views it does
    /// not name). `joined`: the views the join reads (the entities of `--entities-at`).
    ///
    /// # Errors
    /// [`Error::Request`] for views of different entities, an unknown view, or no rows;
    /// store errors.
    pub async fn make(
        &self,
        config: &Config,
        defs: &Definitions,
        joined: &[&FeatureView],
        versions: &BTreeMap<String, u64>,
    ) -> Result<RecordBatch> {
        match self {
            MadeSpine::EntitiesAt { at } => self.entities_at(config, defs, joined, *at, versions).await,
            MadeSpine::RowsOf(rows) => {
                let view = defs.find_view(&rows.view).map_err(|e| Error::NotFound(format!("--rows-of: {}", e.0)))?;
                self.rows_of(config, defs, view, rows, versions).await
            }
        }
    }

    async fn entities_at(
        &self,
        config: &Config,
        defs: &Definitions,
        joined: &[&FeatureView],
        at: i64,
        versions: &BTreeMap<String, u64>,
    ) -> Result<RecordBatch> {
        let Some(first) = joined.first() else {
            return Err(Error::Request(format!("{}: no stored feature view is joined", self.describe())));
        };
        if let Some(other) = joined.iter().find(|v| v.entities != first.entities) {
            return Err(Error::Request(format!(
                "{}: the views must share one entity: `{}` is of {}, `{}` of {}",
                self.describe(),
                first.name,
                first.entities.join(", "),
                other.name,
                other.entities.join(", ")
            )));
        }
        let keys = defs.join_keys(first);
        let fields: Vec<SortField> = keys.iter().map(|k| SortField::new(key_type(k.dtype))).collect();
        let converter = RowConverter::new(fields)?;
        let mut rows = converter.empty_rows(0, 0);
        for view in joined {
            let range = ScanRange { lo: None, hi: at, extra: None, version: versions.get(&*view.storage_name()).copied() };
            let scan = scan_view_at(&config.view_table(view), defs, view, &[], range).await?;
            for batch in &scan.batches {
                let columns: Vec<ArrayRef> = batch.columns()[..keys.len()]
                    .iter()
                    .zip(&keys)
                    .map(|(c, k)| conform(&k.name, c, &key_type(k.dtype)))
                    .collect::<Result<_>>()?;
                converter.append(&mut rows, &columns)?;
            }
        }
        let mut order: Vec<usize> = (0..rows.num_rows()).collect();
        order.sort_unstable_by(|&a, &b| rows.row(a).cmp(&rows.row(b)));
        order.dedup_by(|a, b| rows.row(*a) == rows.row(*b));
        if order.is_empty() {
            return Err(Error::Request(format!(
                "{}: no entity has a row at or before then in {}",
                self.describe(),
                joined.iter().map(|v| format!("`{}`", v.name)).collect::<Vec<_>>().join(", ")
            )));
        }
        let columns = converter.convert_rows(order.iter().map(|&i| rows.row(i)))?;
        let n = order.len();
        let mut schema: Vec<Field> = keys.iter().map(|k| Field::new(&k.name, key_type(k.dtype), false)).collect();
        schema.push(Field::new(SPINE_TIMESTAMP, crate::schema::timestamp_type(), false));
        let mut columns = columns;
        columns.push(Arc::new(TimestampMicrosecondArray::from(vec![at; n]).with_timezone("UTC")));
        Ok(RecordBatch::try_new(Arc::new(Schema::new(schema)), columns)?)
    }

    async fn rows_of(
        &self,
        config: &Config,
        defs: &Definitions,
        view: &FeatureView,
        rows: &RowsOf,
        versions: &BTreeMap<String, u64>,
    ) -> Result<RecordBatch> {
        let (lo, hi) = match rows.between {
            Some((a, b)) => (Some(a), b - 1),
            None => (None, i64::MAX),
        };
        let features: Vec<&str> = view.features.iter().map(|f| f.name.as_str()).collect();
        let range = ScanRange { lo, hi, extra: None, version: versions.get(&*view.storage_name()).copied() };
        let scan = scan_view_at(&config.view_table(view), defs, view, &features, range).await?;
        let keys = defs.join_keys(view);
        let (ts_at, seq_at) = (keys.len(), keys.len() + 1 + usize::from(view.source.created_timestamp_field.is_some()));
        let Some(first) = scan.batches.first() else {
            return Err(self.no_rows(view));
        };
        let all = concat_batches(&first.schema(), &scan.batches)?;
        drop(scan.batches);
        let all = match rows.sample {
            Some(rate) => {
                let keep = sampled(&all, &(0..keys.len()).chain([ts_at, seq_at]).collect::<Vec<_>>(), rate, rows.seed)?;
                filter_record_batch(&all, &keep)?
            }
            None => all,
        };
        if all.num_rows() == 0 {
            return Err(self.no_rows(view));
        }
        // Event time, then keys, then ingestion order: one order whatever the files' layout.
        let sort: Vec<SortColumn> = [ts_at]
            .into_iter()
            .chain(0..keys.len())
            .chain([seq_at])
            .map(|i| SortColumn { values: all.column(i).clone(), options: None })
            .collect();
        let order: UInt32Array = lexsort_to_indices(&sort, None)?;
        let all = take_record_batch(&all, &order)?;
        // Keys, the event time as `event_timestamp`, then the view's columns the table has.
        let mut fields: Vec<Field> = Vec::new();
        let mut columns: Vec<ArrayRef> = Vec::new();
        let mut push = |name: &str, column: &ArrayRef| {
            if !fields.iter().any(|f| f.name() == name) {
                fields.push(Field::new(name, column.data_type().clone(), true));
                columns.push(column.clone());
            }
        };
        for (k, key) in keys.iter().enumerate() {
            push(&key.name, &conform(&key.name, all.column(k), &key_type(key.dtype))?);
        }
        push(SPINE_TIMESTAMP, all.column(ts_at));
        for (feature, at) in view.features.iter().zip(&scan.feature_columns) {
            if let Some(i) = at {
                push(&feature.name, &conform(&feature.name, all.column(*i), &crate::schema::arrow_type(feature.dtype))?);
            }
        }
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
    }

    fn no_rows(&self, view: &FeatureView) -> Error {
        Error::Request(format!(
            "{}: feature view `{}` has no rows {}",
            self.describe(),
            view.name,
            match self {
                MadeSpine::RowsOf(RowsOf { between: Some(_), .. } | RowsOf { sample: Some(_), .. }) => "in that window or sample",
                _ => "yet",
            }
        ))
    }
}

/// The stored column `name` as its declared type, as ingest widens a column: a scan may
/// give a string column as a view type, an older file a narrower integer; a value the
/// declared type cannot hold is refused, never read as null.
fn conform(name: &str, column: &ArrayRef, to: &arrow::datatypes::DataType) -> Result<ArrayRef> {
    crate::input::widen(column, to).map_err(|e| Error::Request(format!("stored column `{name}`: {e}")))
}

/// Which rows a sample of `rate` keeps: a row is kept when a hash of `seed` and its
/// `columns` (keys, event time, ingestion order: what makes it that row) falls under
/// the rate, so the same rows are kept whichever files or order they come in.
fn sampled(batch: &RecordBatch, columns: &[usize], rate: f64, seed: u64) -> Result<BooleanArray> {
    let encoded = columns.iter().map(|&i| Encoded::new(batch.column(i))).collect::<Result<Vec<_>>>()?;
    // `rate` of the hashes' range; 1 keeps every row.
    let limit = if rate >= 1.0 { u64::MAX } else { (rate * 2f64.powi(64)) as u64 };
    let mut bytes = Vec::new();
    Ok((0..batch.num_rows())
        .map(|row| {
            bytes.clear();
            for column in &encoded {
                column.write(row, &mut bytes);
            }
            Some(row_hash(seed, &bytes) <= limit)
        })
        .collect())
}

/// A column as the sample hashes it, in an encoding this crate fixes (not Arrow's row
/// format, which may change between releases): a null is the byte 0; an integer, a time
/// (microseconds) or a date is 1 and the value as a little-endian i64; anything else is 2,
/// the length of its text as a little-endian u64, and the text's UTF-8 bytes.
enum Encoded {
    Int(arrow::array::Int64Array),
    Text(arrow::array::StringArray),
}

impl Encoded {
    fn new(column: &ArrayRef) -> Result<Encoded> {
        use arrow::datatypes::{DataType, TimeUnit};
        let t = column.data_type();
        let as_int = |c: &ArrayRef| -> Result<Encoded> {
            let ints = arrow::compute::cast(c, &DataType::Int64)?;
            Ok(Encoded::Int(ints.as_any().downcast_ref::<arrow::array::Int64Array>().expect("cast to Int64").clone()))
        };
        if t.is_integer() || matches!(t, DataType::Date32 | DataType::Date64) {
            as_int(column)
        } else if let DataType::Timestamp(_, tz) = t {
            as_int(&arrow::compute::cast(column, &DataType::Timestamp(TimeUnit::Microsecond, tz.clone()))?)
        } else {
            let text = arrow::compute::cast(column, &DataType::Utf8)?;
            Ok(Encoded::Text(text.as_any().downcast_ref::<arrow::array::StringArray>().expect("cast to Utf8").clone()))
        }
    }

    fn write(&self, row: usize, out: &mut Vec<u8>) {
        match self {
            Encoded::Int(a) if a.is_valid(row) => {
                out.push(1);
                out.extend_from_slice(&a.value(row).to_le_bytes());
            }
            Encoded::Text(a) if a.is_valid(row) => {
                let text = a.value(row).as_bytes();
                out.push(2);
                out.extend_from_slice(&(text.len() as u64).to_le_bytes());
                out.extend_from_slice(text);
            }
            _ => out.push(0),
        }
    }
}

/// FNV-1a over the bytes, seeded, then SplitMix64's finalizer: stable across builds and
/// platforms (unlike the standard library's hashers), so a manifest's sample is made
/// again months later.
fn row_hash(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// A time as RFC 3339 text in the manifest.
mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(at: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&quiver_sdk::Timestamp(*at).to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        quiver_sdk::types::parse_instant(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A window's two times as RFC 3339 text.
mod rfc3339_pair {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(pair: &Option<(i64, i64)>, s: S) -> Result<S::Ok, S::Error> {
        pair.map(|(a, b)| [quiver_sdk::Timestamp(a).to_string(), quiver_sdk::Timestamp(b).to_string()]).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<(i64, i64)>, D::Error> {
        let Some([a, b]) = Option::<[String; 2]>::deserialize(d)? else {
            return Ok(None);
        };
        let parse = |t: &str| quiver_sdk::types::parse_instant(t).map_err(serde::de::Error::custom);
        Ok(Some((parse(&a)?, parse(&b)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_made_spine_round_trips_through_the_manifest() {
        for made in [
            MadeSpine::EntitiesAt { at: 1_767_225_600_000_000 },
            MadeSpine::RowsOf(RowsOf::new("trips", Some((1_767_225_600_000_000, 1_767_312_000_123_456)), Some(0.25), Some(7)).unwrap()),
            MadeSpine::RowsOf(RowsOf::new("trips", None, None, None).unwrap()),
        ] {
            let text = serde_json::to_string(&made).unwrap();
            assert_eq!(serde_json::from_str::<MadeSpine>(&text).unwrap(), made, "{text}");
        }
        let text = serde_json::to_string(&MadeSpine::EntitiesAt { at: 1_767_225_600_000_000 }).unwrap();
        assert_eq!(text, r#"{"kind":"entities_at","at":"2026-01-01T00:00:00Z"}"#);
    }

    #[test]
    fn a_sample_keeps_about_its_rate_and_the_same_rows_for_a_seed() {
        let ids: ArrayRef = Arc::new(arrow::array::Int64Array::from((0..20_000).collect::<Vec<i64>>()));
        let batch = RecordBatch::try_from_iter([("id", ids)]).unwrap();
        let kept = |rate, seed| sampled(&batch, &[0], rate, seed).unwrap();
        let a = kept(0.1, 1);
        let share = a.true_count() as f64 / 20_000.0;
        assert!((share - 0.1).abs() < 0.01, "{share}");
        assert_eq!(a, kept(0.1, 1), "the same seed keeps the same rows");
        assert_ne!(a, kept(0.1, 2), "another seed, other rows");
        assert_eq!(kept(1.0, 3).true_count(), 20_000);
        // A smaller rate keeps a subset of a larger one's rows (one hash per row).
        let b = kept(0.05, 1);
        assert!((0..20_000).all(|i| !b.value(i) || a.value(i)));
    }

    /// The sample's hash is pinned: these values were computed by a separate Python
    /// implementation of the documented encoding, FNV-1a and SplitMix64's finalizer, so a
    /// change to either (which would draw other rows than a manifest recorded) fails here.
    #[test]
    fn the_sample_hash_is_pinned_to_its_documented_encoding() {
        use arrow::array::{Int64Array, StringArray};
        let t = 1_700_000_000_000_000i64;
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(1001), None]));
        let texts: ArrayRef = Arc::new(StringArray::from(vec!["driver-7", "x"]));
        let times: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![t, -1]).with_timezone("UTC"));
        let seqs: ArrayRef = Arc::new(Int64Array::from(vec![0, 42]));
        let hash = |columns: &[&ArrayRef], row: usize, seed: u64| {
            let mut bytes = Vec::new();
            for c in columns {
                Encoded::new(c).unwrap().write(row, &mut bytes);
            }
            row_hash(seed, &bytes)
        };
        assert_eq!(hash(&[&ints, &times, &seqs], 0, 3), 0xdeff_6282_1dd4_725f);
        assert_eq!(hash(&[&texts, &times, &seqs], 0, 3), 0x5615_c546_b3e1_4cb8);
        assert_eq!(hash(&[&ints, &times, &seqs], 1, 0), 0x5938_0139_cacc_159d);
        // A key of another integer width or a string view hashes as the same value.
        let narrow: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![Some(1001), None]));
        assert_eq!(hash(&[&narrow, &times, &seqs], 0, 3), 0xdeff_6282_1dd4_725f);
        let view: ArrayRef = Arc::new(arrow::array::StringViewArray::from(vec!["driver-7", "x"]));
        assert_eq!(hash(&[&view, &times, &seqs], 0, 3), 0x5615_c546_b3e1_4cb8);
    }

    /// Issue 54: the made spine conformed stored columns with a cast that read what it
    /// could not convert as null; it widens as ingest does, refusing a loss.
    #[test]
    fn stored_columns_are_widened_never_nulled() {
        let wide: ArrayRef = Arc::new(arrow::array::Int64Array::from(vec![1, i64::from(i32::MAX) + 1]));
        let err = conform("n", &wide, &arrow::datatypes::DataType::Int32).unwrap_err().to_string();
        assert!(err.contains("stored column `n`") && err.contains("without loss"), "{err}");
        let narrow: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![1, -2]));
        let widened = conform("n", &narrow, &arrow::datatypes::DataType::Int64).unwrap();
        assert_eq!(widened.as_any().downcast_ref::<arrow::array::Int64Array>().unwrap().values(), &[1, -2]);
        let view: ArrayRef = Arc::new(arrow::array::StringViewArray::from(vec!["a"]));
        assert_eq!(conform("s", &view, &arrow::datatypes::DataType::Utf8).unwrap().data_type(), &arrow::datatypes::DataType::Utf8);
    }

    #[test]
    fn bad_windows_and_rates_are_refused() {
        let rows = |between, sample| RowsOf::new("v", between, sample, None);
        assert!(rows(Some((5, 5)), None).unwrap_err().to_string().contains("the window is empty"));
        for r in [0.0, -0.5, 1.5, f64::NAN] {
            assert!(rows(None, Some(r)).unwrap_err().to_string().contains("--sample must be"), "{r}");
        }
        assert!(rows(Some((1, 2)), Some(1.0)).is_ok());
        assert!(RowsOf::new("v", None, None, Some(3)).unwrap_err().to_string().contains("--seed goes with --sample R"));
        // A manifest is read through the same rules.
        let doc = r#"{"kind": "rows_of", "view": "v", "sample": 3.0}"#;
        assert!(serde_json::from_str::<MadeSpine>(doc).unwrap_err().to_string().contains("--sample must be"));
    }
}
