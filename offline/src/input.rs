//! Reading user files (Parquet, CSV, JSON lines) and conforming their columns to a
//! view's schema: safe widening only, UTC timestamps only, no missing keys or times.
//!
//! Every error names the file, and the column and first bad row where there is one
//! (rows count from 1, excluding a CSV header).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, TimestampMicrosecondArray, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::util::display::FormatOptions;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::error::{Error, Result};
use crate::schema::{Role, rows_to_columns, timestamp_type, view_columns};
use quiver_runtime::rows::RowReader;
use quiver_sdk::types::parse_instant;
use quiver_sdk::{Definitions, FeatureView};

/// The file formats `ingest` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    Parquet,
    Csv,
    JsonLines,
}

impl InputFormat {
    /// By extension: `.parquet`/`.pq`, `.csv`, `.jsonl`/`.ndjson`/`.json`.
    ///
    /// # Errors
    /// [`Error::Input`] for any other extension.
    pub fn from_path(path: &Path) -> Result<InputFormat> {
        let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
        match ext.as_str() {
            "parquet" | "pq" => Ok(InputFormat::Parquet),
            "csv" => Ok(InputFormat::Csv),
            "jsonl" | "ndjson" | "json" => Ok(InputFormat::JsonLines),
            _ => Err(Error::input(path.display(), format!("unknown file type `.{ext}` (expected .parquet, .csv or .jsonl)"))),
        }
    }
}

/// A column a reader should produce: the name, the type wanted, and its role.
pub type Wanted = (Field, Role);

/// Reads a whole file of `view`'s rows into batches. CSV is read as text, then its
/// numbers and booleans are typed column by column (timestamps are read by [`conform`]);
/// JSON lines go through the strict row reader; Parquet is read as it is. [`conform`]
/// checks the rest.
///
/// # Errors
/// [`Error::Input`] naming the file for unreadable or malformed input.
pub fn read_file(path: &Path, defs: &Definitions, view: &FeatureView) -> Result<Vec<RecordBatch>> {
    let wanted = view_columns(defs, view);
    let wanted = wanted.as_slice();
    let format = InputFormat::from_path(path)?;
    let file = File::open(path).map_err(|e| Error::input(path.display(), e.to_string()))?;
    let fail = |e: &dyn std::fmt::Display| Error::input(path.display(), e.to_string());
    match format {
        InputFormat::Parquet => {
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| fail(&e))?
                .with_batch_size(64 * 1024)
                .build()
                .map_err(|e| fail(&e))?;
            reader.collect::<std::result::Result<Vec<_>, _>>().map_err(|e| fail(&e))
        }
        InputFormat::Csv => {
            let mut header = String::new();
            BufReader::new(File::open(path).map_err(|e| fail(&e))?).read_line(&mut header).map_err(|e| fail(&e))?;
            let header = header.trim_start_matches('\u{feff}');
            let names: Vec<&str> = header.trim_end_matches(['\r', '\n']).split(',').collect();
            let mut fields = Vec::new();
            for name in names {
                let name = name.trim().trim_matches('"');
                // Every column read as text, then typed here, so that a value that is not
                // of its column's type is named with its row and column.
                if let Some((f, _)) = wanted.iter().find(|(f, _)| f.name() == name)
                    && (f.data_type().is_nested() || *f.data_type() == DataType::Binary)
                {
                    return Err(Error::input(
                        path.display(),
                        format!("column `{name}`: list and bytes features cannot be read from CSV (use Parquet or JSON lines)"),
                    ));
                }
                fields.push(Field::new(name, DataType::Utf8, true));
            }
            let reader = arrow::csv::ReaderBuilder::new(Arc::new(Schema::new(fields)))
                .with_header(true)
                .with_batch_size(64 * 1024)
                .build(file)
                .map_err(|e| fail(&e))?;
            let text = reader.collect::<std::result::Result<Vec<_>, _>>().map_err(|e| fail(&e))?;
            let mut row0 = 0;
            let mut typed = Vec::with_capacity(text.len());
            for batch in text {
                typed.push(type_csv_batch(&batch, wanted, row0).map_err(|m| Error::input(path.display(), m))?);
                row0 += batch.num_rows();
            }
            Ok(typed)
        }
        InputFormat::JsonLines => read_json_lines(path, BufReader::new(file), defs, view, wanted),
    }
}

/// JSON lines through the one strict row reader that Kafka messages and pushes use
/// ([`quiver_runtime::rows`]); errors name the file and line. A column no line has is an
/// error, as in CSV and Parquet (a typo would otherwise read as all nulls).
fn read_json_lines(
    path: &Path,
    reader: impl BufRead,
    defs: &Definitions,
    view: &FeatureView,
    wanted: &[Wanted],
) -> Result<Vec<RecordBatch>> {
    let rows_reader = RowReader::new(defs, view);
    let schema = Arc::new(Schema::new(wanted.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>()));
    let mut seen = vec![false; wanted.len()];
    let mut rows = Vec::new();
    let mut batches = Vec::new();
    let mut line_no = 0usize;
    for line in reader.lines() {
        line_no += 1;
        let line = line.map_err(|e| Error::input(path.display(), format!("line {line_no}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let map = match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) => return Err(Error::input(path.display(), format!("row {line_no}: not a JSON object"))),
            Err(e) => return Err(Error::input(path.display(), format!("row {line_no}: not valid JSON: {e}"))),
        };
        for (i, (f, _)) in wanted.iter().enumerate() {
            seen[i] |= map.contains_key(f.name());
        }
        rows.push(rows_reader.from_object(&map).map_err(|m| Error::input(path.display(), format!("row {line_no}: {m}")))?);
        if rows.len() == 64 * 1024 {
            batches.push(RecordBatch::try_new(schema.clone(), rows_to_columns(view, &rows))?);
            rows.clear();
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        let names: Vec<&str> = wanted.iter().map(|(f, _)| f.name().as_str()).collect();
        return Err(Error::input(
            path.display(),
            format!("missing column `{}` (expected columns: {})", wanted[i].0.name(), names.join(", ")),
        ));
    }
    if !rows.is_empty() {
        batches.push(RecordBatch::try_new(schema, rows_to_columns(view, &rows))?);
    }
    Ok(batches)
}

fn is_time(t: &DataType) -> bool {
    matches!(t, DataType::Timestamp(..))
}

/// A CSV batch read as text, its columns of numbers and booleans parsed into their
/// view's types (timestamps stay text: [`conform`] reads them; an empty field is
/// null). `row0`: the rows before this batch, for the message naming the first value
/// that does not parse, its row (from 1, after the header), column and the type wanted.
pub(crate) fn type_csv_batch(batch: &RecordBatch, wanted: &[Wanted], row0: usize) -> std::result::Result<RecordBatch, String> {
    let schema = batch.schema();
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let target = wanted
            .iter()
            .find(|(f, _)| f.name() == field.name())
            .map(|(f, _)| f.data_type())
            .filter(|t| matches!(t, DataType::Int32 | DataType::Int64 | DataType::Float32 | DataType::Float64 | DataType::Boolean));
        let Some(target) = target else {
            fields.push(field.as_ref().clone());
            columns.push(column.clone());
            continue;
        };
        let text = column.as_string::<i32>();
        // Unparsable values become nulls here, then are found by their row.
        let parsed = arrow::compute::cast(column, target).map_err(|e| format!("column `{}`: {e}", field.name()))?;
        if let Some(row) = (0..text.len()).find(|&i| text.is_valid(i) && parsed.is_null(i) && !text.value(i).trim().is_empty()) {
            let name = match target {
                DataType::Boolean => "bool (true or false)".to_string(),
                other => other.to_string().to_lowercase(),
            };
            return Err(format!("row {}: column `{}`: `{}` does not parse as {name}", row0 + row + 1, field.name(), text.value(row)));
        }
        fields.push(Field::new(field.name(), target.clone(), true));
        columns.push(parsed);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())
}

/// Conforms one input batch to the wanted columns, in their order. `row0` is the
/// number of rows before this batch in the file (for messages). With `latest_event`,
/// an event time after it (UTC microseconds: the wall clock plus `max_future_skew`) is
/// refused.
///
/// # Errors
/// [`Error::Input`]: a missing column, a type that cannot be widened safely, a naive
/// timestamp, a null key or time, or an event time from the future, naming the column
/// and the first bad row.
pub fn conform(source: &str, batch: &RecordBatch, wanted: &[Wanted], row0: usize, latest_event: Option<i64>) -> Result<Vec<ArrayRef>> {
    let mut out = Vec::with_capacity(wanted.len());
    for (field, role) in wanted {
        let name = field.name();
        let Some(array) = batch.column_by_name(name) else {
            let names: Vec<&str> = wanted.iter().map(|(f, _)| f.name().as_str()).collect();
            return Err(Error::input(source, format!("missing column `{name}` (expected columns: {})", names.join(", "))));
        };
        let converted = if is_time(field.data_type()) {
            to_utc_micros(array).map_err(|(row, msg)| match row {
                Some(r) => Error::input(source, format!("row {}: column `{name}`: {msg}", row0 + r + 1)),
                None => Error::input(source, format!("column `{name}` {msg}")),
            })?
        } else {
            widen(array, field.data_type()).map_err(|msg| Error::input(source, format!("column `{name}`: {msg}")))?
        };
        if *role == Role::Key
            && let Some(strings) = converted.as_string_opt::<i32>()
            && let Some(row) = (0..strings.len()).find(|&i| strings.is_valid(i) && strings.value(i).is_empty())
        {
            return Err(Error::input(
                source,
                format!("row {}: column `{name}` is an empty string (join keys must be set)", row0 + row + 1),
            ));
        }
        if *role != Role::Feature && converted.null_count() > 0 {
            let row = (0..converted.len()).find(|&i| converted.is_null(i)).unwrap_or(0);
            return Err(Error::input(
                source,
                format!("row {}: column `{name}` is empty (join keys and timestamps must be set)", row0 + row + 1),
            ));
        }
        if let (Role::EventTime, Some(latest)) = (role, latest_event) {
            let times = converted.as_primitive::<arrow::datatypes::TimestampMicrosecondType>();
            if let Some(row) = times.values().iter().position(|&t| t > latest) {
                let message = quiver_runtime::rows::check_event_time(name, times.value(row), latest).expect_err("checked");
                return Err(Error::input(source, format!("row {}: column {message}", row0 + row + 1)));
            }
        }
        out.push(converted);
    }
    Ok(out)
}

/// Safe widening to `target`: smaller ints to int64 (and int32), ints and float32 to
/// float64, any string or binary layout to the plain one, lists element-wise, and
/// all-null columns. Everything else is refused.
pub(crate) fn widen(array: &ArrayRef, target: &DataType) -> std::result::Result<ArrayRef, String> {
    let source = array.data_type();
    if source == target {
        return Ok(array.clone());
    }
    if *source == DataType::Null {
        return Ok(new_null_array(target, array.len()));
    }
    if !can_widen(source, target) {
        return Err(format!("type {source} cannot be stored as {} without loss", display_type(target)));
    }
    // 64-bit integers become floats exactly only up to 2^53.
    if *target == DataType::Float64 && matches!(source, DataType::Int64) {
        let ints = array.as_primitive::<arrow::datatypes::Int64Type>();
        if let Some(i) = (0..ints.len()).find(|&i| ints.is_valid(i) && ints.value(i).unsigned_abs() > 1 << 53) {
            return Err(format!("row {}: {} does not fit a float64 exactly", i + 1, ints.value(i)));
        }
    }
    let options = CastOptions { safe: false, format_options: FormatOptions::default() };
    cast_with_options(array, target, &options).map_err(|e| e.to_string())
}

pub(crate) fn display_type(t: &DataType) -> String {
    match t {
        DataType::Utf8 => "string".into(),
        DataType::Binary => "bytes".into(),
        other => other.to_string().to_lowercase(),
    }
}

pub(crate) fn can_widen(source: &DataType, target: &DataType) -> bool {
    use DataType::*;
    let int32_ok = |t: &DataType| matches!(t, Int8 | Int16 | Int32 | UInt8 | UInt16);
    let int64_ok = |t: &DataType| int32_ok(t) || matches!(t, Int64 | UInt32);
    match target {
        Int32 => int32_ok(source),
        Int64 => int64_ok(source),
        Float32 => matches!(source, Float16 | Int8 | Int16 | UInt8 | UInt16),
        Float64 => matches!(source, Float16 | Float32) || int64_ok(source),
        Utf8 => match source {
            LargeUtf8 | Utf8View => true,
            Dictionary(_, v) => matches!(v.as_ref(), Utf8 | LargeUtf8 | Utf8View),
            _ => false,
        },
        Binary => matches!(source, LargeBinary | BinaryView | FixedSizeBinary(_)),
        List(t) => match source {
            List(s) | LargeList(s) | FixedSizeList(s, _) => s.data_type() == t.data_type() || can_widen(s.data_type(), t.data_type()),
            _ => false,
        },
        _ => false,
    }
}

/// Converts a timestamp column to UTC microseconds. Zoned timestamps of any unit are
/// instants and convert exactly (nanoseconds only when whole microseconds); text must
/// be RFC 3339 with an offset. Naive timestamps are refused, never shifted.
/// Errors carry the 0-based row when one is at fault.
pub(crate) fn to_utc_micros(array: &ArrayRef) -> std::result::Result<ArrayRef, (Option<usize>, String)> {
    let naive = "has timestamps without a time zone; quiver stores UTC instants and never guesses a zone (write them zoned, e.g. `2024-01-01T00:00:00Z`, or tz_localize('UTC') in pandas)";
    match array.data_type() {
        DataType::Timestamp(_, None) => Err((None, naive.to_string())),
        DataType::Timestamp(unit, Some(_)) => {
            if *unit == TimeUnit::Nanosecond {
                let ns = array.as_primitive::<arrow::datatypes::TimestampNanosecondType>();
                if let Some(row) = (0..ns.len()).find(|&i| ns.is_valid(i) && ns.value(i) % 1000 != 0) {
                    return Err((Some(row), "has sub-microsecond precision (quiver keeps microseconds)".to_string()));
                }
            }
            let options = CastOptions { safe: false, format_options: FormatOptions::default() };
            cast_with_options(array, &timestamp_type(), &options)
                .map_err(|e| (None, format!("cannot be converted to UTC microseconds: {e}")))
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let text = cast_with_options(array, &DataType::Utf8, &CastOptions::default())
                .map_err(|e| (None, format!("cannot be read as text: {e}")))?;
            let text = text.as_string::<i32>();
            let mut values = Vec::with_capacity(text.len());
            for i in 0..text.len() {
                if text.is_null(i) || text.value(i).trim().is_empty() {
                    values.push(None);
                    continue;
                }
                values.push(Some(parse_instant(text.value(i)).map_err(|m| (Some(i), m))?));
            }
            Ok(Arc::new(TimestampMicrosecondArray::from(values).with_timezone("UTC")))
        }
        other => Err((None, format!("has type {other}, not a timestamp (expected zoned timestamps or RFC 3339 text)"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    #[test]
    fn empty_string_keys_are_refused_and_features_may_be_empty() {
        let wanted: Vec<Wanted> =
            vec![(Field::new("k", DataType::Utf8, false), Role::Key), (Field::new("f", DataType::Utf8, true), Role::Feature)];
        let batch = |k: &str, f: &str| {
            RecordBatch::try_from_iter([
                ("k", Arc::new(StringArray::from(vec!["a", k])) as ArrayRef),
                ("f", Arc::new(StringArray::from(vec!["x", f])) as ArrayRef),
            ])
            .unwrap()
        };
        let err = conform("in.parquet", &batch("", "y"), &wanted, 10, None).unwrap_err().to_string();
        assert_eq!(err, "in.parquet: row 12: column `k` is an empty string (join keys must be set)");
        assert!(conform("in.parquet", &batch("b", ""), &wanted, 0, None).is_ok());
    }

    #[test]
    fn widening_is_lossless_or_refused() {
        let ints: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![1, -2]));
        assert_eq!(widen(&ints, &DataType::Int64).unwrap().data_type(), &DataType::Int64);
        let floats: ArrayRef = Arc::new(arrow::array::Float64Array::from(vec![1.5]));
        assert!(widen(&floats, &DataType::Float32).unwrap_err().contains("without loss"));
        assert!(widen(&floats, &DataType::Int64).is_err());
        let big: ArrayRef = Arc::new(arrow::array::UInt64Array::from(vec![u64::MAX]));
        assert!(widen(&big, &DataType::Int64).is_err());
    }
}
