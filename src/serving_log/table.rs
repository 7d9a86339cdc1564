//! The serving log's Delta table: its schema, the append of a batch of rows and the
//! read back of a time range, each column by name (the Delta work is
//! [`quiver_offline::append_table`]'s).
//!
//! Columns: `request_id`, `request_time` (timestamp, UTC), `view`, `entity` (the join
//! keys as a JSON object), `event_timestamp` (of the row served; null when none was
//! found), `values` and `statuses` (JSON objects keyed by feature name), and
//! `event_timestamps` (an event log's per-aggregation times, a JSON object; null for
//! other views). JSON keeps one table for views of any keys and types, and is what the
//! server answered, byte for byte. A log written before `event_timestamps` existed
//! gains the column at its next append and reads it as null.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimestampMicrosecondType};
use quiver_offline::Result;
use quiver_offline::append_table::{AppendTable, read_range};
use quiver_offline::schema::timestamp_type;
use quiver_sdk::config::StoreLocation;

use super::rows::{LogColumns, TextColumn};

/// The table's columns, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    RequestId,
    RequestTime,
    View,
    Entity,
    EventTimestamp,
    Values,
    Statuses,
    EventTimestamps,
}

impl Col {
    const ALL: [Col; 8] =
        [Col::RequestId, Col::RequestTime, Col::View, Col::Entity, Col::EventTimestamp, Col::Values, Col::Statuses, Col::EventTimestamps];

    fn field(self) -> Field {
        match self {
            Col::RequestId => Field::new("request_id", DataType::Utf8, false),
            Col::RequestTime => Field::new("request_time", timestamp_type(), false),
            Col::View => Field::new("view", DataType::Utf8, false),
            Col::Entity => Field::new("entity", DataType::Utf8, false),
            Col::EventTimestamp => Field::new("event_timestamp", timestamp_type(), true),
            Col::Values => Field::new("values", DataType::Utf8, false),
            Col::Statuses => Field::new("statuses", DataType::Utf8, false),
            Col::EventTimestamps => Field::new("event_timestamps", DataType::Utf8, true),
        }
    }
}

/// The log table's schema.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(Col::ALL.map(Col::field).to_vec()))
}

/// Rows read back from the log table, each column by name.
#[derive(Debug, Clone)]
pub struct LogBatch(RecordBatch);

impl LogBatch {
    pub fn num_rows(&self) -> usize {
        self.0.num_rows()
    }

    fn text(&self, col: Col, r: usize) -> &str {
        self.0.column(col as usize).as_string::<i32>().value(r)
    }

    fn time(&self, col: Col, r: usize) -> Option<i64> {
        let c = self.0.column(col as usize).as_primitive::<TimestampMicrosecondType>();
        c.is_valid(r).then(|| c.value(r))
    }

    pub fn request_id(&self, r: usize) -> &str {
        self.text(Col::RequestId, r)
    }

    /// UTC microseconds.
    pub fn request_time(&self, r: usize) -> i64 {
        self.time(Col::RequestTime, r).expect("request_time is not nullable")
    }

    pub fn view(&self, r: usize) -> &str {
        self.text(Col::View, r)
    }

    /// The join keys as a JSON object.
    pub fn entity(&self, r: usize) -> &str {
        self.text(Col::Entity, r)
    }

    /// The event time of the row served; `None` when none was found.
    pub fn event_ts(&self, r: usize) -> Option<i64> {
        self.time(Col::EventTimestamp, r)
    }

    /// `{"feature": value, ...}` as served.
    pub fn values(&self, r: usize) -> &str {
        self.text(Col::Values, r)
    }

    /// `{"feature": "PRESENT", ...}`.
    pub fn statuses(&self, r: usize) -> &str {
        self.text(Col::Statuses, r)
    }

    /// An event log's `{"aggregation": "RFC 3339 time", ...}`; `None` for other views'
    /// rows (and rows logged before the column existed).
    pub fn event_timestamps(&self, r: usize) -> Option<&str> {
        let c = self.0.column(Col::EventTimestamps as usize).as_string::<i32>();
        c.is_valid(r).then(|| c.value(r))
    }
}

/// The pending rows as the log table's batch; the text columns' buffers are copied once.
fn to_batch(rows: &LogColumns) -> Result<RecordBatch> {
    let text = |c: &TextColumn| -> Result<ArrayRef> {
        let offsets = OffsetBuffer::new(ScalarBuffer::from(c.offsets.clone()));
        Ok(Arc::new(StringArray::try_new(offsets, Buffer::from(c.bytes.as_slice()), None)?))
    };
    let utc = |t: TimestampMicrosecondArray| -> ArrayRef { Arc::new(t.with_timezone("UTC")) };
    let columns: Vec<ArrayRef> = Col::ALL
        .iter()
        .map(|col| match col {
            Col::RequestId => text(&rows.request_id),
            // Not nullable: no validity bitmap to build.
            Col::RequestTime => Ok(utc(TimestampMicrosecondArray::from(rows.request_time.clone()))),
            Col::View => text(&rows.view),
            Col::Entity => text(&rows.entity),
            Col::EventTimestamp => Ok(utc(TimestampMicrosecondArray::from(rows.event_ts.clone()))),
            Col::Values => text(&rows.values),
            Col::Statuses => text(&rows.statuses),
            Col::EventTimestamps => {
                // An empty value is a null (a view whose features share the row's time).
                let c = &rows.event_timestamps;
                let valid = arrow::buffer::NullBuffer::from_iter(c.offsets.windows(2).map(|w| w[1] > w[0]));
                let offsets = OffsetBuffer::new(ScalarBuffer::from(c.offsets.clone()));
                Ok(Arc::new(StringArray::try_new(offsets, Buffer::from(c.bytes.as_slice()), Some(valid))?) as ArrayRef)
            }
        })
        .collect::<Result<_>>()?;
    Ok(RecordBatch::try_new(schema(), columns)?)
}

/// The log table, kept open between appends.
#[derive(Debug)]
pub struct LogTable(AppendTable);

impl LogTable {
    pub fn new(location: StoreLocation) -> LogTable {
        LogTable(AppendTable::new(location, schema(), "serving_log"))
    }

    /// Appends `rows` as one commit, creating the table if needed; returns the version
    /// committed. Concurrent appenders (other servers) are fine.
    ///
    /// # Errors
    /// [`quiver_offline::Error::Arrow`] for rows that cannot form a batch (they never will);
    /// [`quiver_offline::Error::Delta`] when the table cannot be created or written.
    pub async fn append(&mut self, rows: &LogColumns) -> Result<u64> {
        self.0.append(to_batch(rows)?).await
    }
}

/// The rows logged with `request_time` in `times` (`since..until`), in no
/// particular order; empty when there is no log.
///
/// # Errors
/// [`quiver_offline::Error::Delta`]/[`quiver_offline::Error::Query`] when the table cannot be read.
pub async fn read(location: &StoreLocation, times: std::ops::Range<quiver_sdk::Timestamp>) -> Result<Vec<LogBatch>> {
    let name = Col::RequestTime.field().name().clone();
    Ok(read_range(location, &schema(), &name, times).await?.into_iter().map(LogBatch).collect())
}
