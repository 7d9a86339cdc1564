//! The serving log's Delta table: one row per entity row, feature view and answered
//! request (see `quiver_online::serving_log`), appended in batches by the server and
//! read back by `quiver verify --since`.
//!
//! Columns: `request_id`, `request_time` (timestamp, UTC), `view`, `entity` (the join
//! keys as a JSON object), `event_timestamp` (of the row served; null when none was
//! found), `values` and `statuses` (JSON objects keyed by feature name). JSON keeps one
//! table for views of any keys and types, and is what the server answered, byte for
//! byte.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::prelude::{SessionConfig, SessionContext, ident, lit};
use datafusion::scalar::ScalarValue;
use deltalake::protocol::SaveMode;
use quiver_sdk::config::StoreLocation;

use crate::delta::{ensure_table, open_table};
use crate::error::{Error, Result};
use crate::schema::timestamp_type;

/// The log table's schema.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("request_id", DataType::Utf8, false),
        Field::new("request_time", timestamp_type(), false),
        Field::new("view", DataType::Utf8, false),
        Field::new("entity", DataType::Utf8, false),
        Field::new("event_timestamp", timestamp_type(), true),
        Field::new("values", DataType::Utf8, false),
        Field::new("statuses", DataType::Utf8, false),
    ]))
}

/// The log table, kept open between appends (opening reads the Delta log, which grows
/// by a commit per batch).
#[derive(Debug)]
pub struct LogTable {
    location: StoreLocation,
    table: Option<deltalake::DeltaTable>,
}

impl LogTable {
    pub fn new(location: StoreLocation) -> LogTable {
        LogTable { location, table: None }
    }

    /// Appends `batch` (in [`schema`]) as one commit, creating the table if needed;
    /// returns the version committed. Concurrent appenders (other servers) are fine:
    /// blind appends retry at the next version.
    ///
    /// # Errors
    /// [`Error::Delta`] when the table cannot be created or written.
    pub async fn append(&mut self, batch: RecordBatch) -> Result<u64> {
        let location = &self.location;
        let table = match self.table.take() {
            Some(t) => t,
            None => {
                ensure_table(location, &schema(), "serving_log").await?;
                open_table(location).await?.ok_or_else(|| Error::Request(format!("serving log {location} vanished while writing")))?
            }
        };
        // On failure the handle is dropped: the next append opens the table afresh.
        let table = table.write(vec![batch]).with_save_mode(SaveMode::Append).await.map_err(|e| Error::delta(location, e))?;
        let version = table.version().unwrap_or(0) as u64;
        self.table = Some(table);
        Ok(version)
    }
}

/// The rows logged with `since <= request_time < until` (UTC microseconds), in no
/// particular order; empty when there is no log.
///
/// # Errors
/// [`Error::Delta`]/[`Error::Query`] when the table cannot be read.
pub async fn read(location: &StoreLocation, since: i64, until: i64) -> Result<Vec<RecordBatch>> {
    let Some(table) = open_table(location).await? else {
        return Ok(Vec::new());
    };
    let name = location.to_string();
    let query = |source| Error::query(&name, source);
    let mut session = SessionConfig::new();
    // Plain Utf8 columns, as written (not DataFusion's default string views).
    session.options_mut().execution.parquet.schema_force_view_types = false;
    let ctx = SessionContext::new_with_config(session);
    table.update_datafusion_session(&ctx.state()).map_err(|e| Error::delta(location, e))?;
    let provider = table.table_provider().await.map_err(query)?;
    let at = |v: i64| lit(ScalarValue::TimestampMicrosecond(Some(v), Some("UTC".into())));
    let columns: Vec<_> = schema().fields().iter().map(|f| ident(f.name())).collect();
    let batches = ctx
        .read_table(provider)
        .map_err(query)?
        .filter(ident("request_time").gt_eq(at(since)).and(ident("request_time").lt(at(until))))
        .map_err(query)?
        .select(columns)
        .map_err(query)?
        .collect()
        .await
        .map_err(query)?;
    // Back to the written types (a reader may hand strings over as views).
    let schema = schema();
    batches
        .into_iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| {
            let columns = b
                .columns()
                .iter()
                .zip(schema.fields())
                .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok(RecordBatch::try_new(schema.clone(), columns)?)
        })
        .collect()
}
