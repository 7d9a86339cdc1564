//! Append-only Delta tables read back by a time range: the storage of the serving log
//! (whose schema and rows are `quiver::serving_log`'s; this module knows neither).

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::prelude::{SessionConfig, SessionContext, ident, lit};
use datafusion::scalar::ScalarValue;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use quiver_sdk::config::StoreLocation;

use crate::delta::{ensure_table, open_table};
use crate::error::{Error, Result};

/// An append-only table, kept open between appends (opening reads the Delta log, which
/// grows by a commit per batch).
#[derive(Debug)]
pub struct AppendTable {
    location: StoreLocation,
    schema: SchemaRef,
    /// What the table is, for messages and the table's name.
    name: &'static str,
    table: Option<deltalake::DeltaTable>,
}

impl AppendTable {
    pub fn new(location: StoreLocation, schema: SchemaRef, name: &'static str) -> AppendTable {
        AppendTable { location, schema, name, table: None }
    }

    /// Appends `batch` (in the table's schema) as one commit, creating the table if
    /// needed; returns the version committed. Concurrent appenders (other servers) are
    /// fine: blind appends retry at the next version.
    ///
    /// # Errors
    /// [`Error::Delta`] when the table cannot be created or written.
    pub async fn append(&mut self, batch: RecordBatch) -> Result<u64> {
        let location = &self.location;
        let table = match self.table.take() {
            Some(t) => t,
            None => {
                ensure_table(location, &self.schema, self.name).await?;
                open_table(location)
                    .await?
                    .ok_or_else(|| Error::Request(format!("{} {location} vanished while writing", self.name.replace('_', " "))))?
            }
        };
        // On failure the handle is dropped: the next append opens the table afresh. A
        // table written before a nullable column was added gains it (merge).
        let table = table
            .write(vec![batch])
            .with_save_mode(SaveMode::Append)
            .with_schema_mode(SchemaMode::Merge)
            .await
            .map_err(|e| Error::delta(location, e))?;
        let version = table.version().unwrap_or(0) as u64;
        self.table = Some(table);
        Ok(version)
    }
}

/// The rows with `time_column` in `times` (`since..until`), in `schema`'s
/// columns and types, in no particular order; empty when there is no table. A nullable
/// column the table does not have yet (written before it was added) reads as nulls.
///
/// # Errors
/// [`Error::Delta`]/[`Error::Query`] when the table cannot be read.
pub async fn read_range(
    location: &StoreLocation,
    schema: &SchemaRef,
    time_column: &str,
    times: std::ops::Range<quiver_sdk::Timestamp>,
) -> Result<Vec<RecordBatch>> {
    let (since, until) = (times.start.0, times.end.0);
    let Some(table) = open_table(location).await? else {
        return Ok(Vec::new());
    };
    let query = |source| Error::query(location, source);
    let mut session = SessionConfig::new();
    // Plain Utf8 columns, as written (not DataFusion's default string views).
    session.options_mut().execution.parquet.schema_force_view_types = false;
    let ctx = SessionContext::new_with_config(session);
    table.update_datafusion_session(&ctx.state()).map_err(|e| Error::delta(location, e))?;
    let provider = table.table_provider().await.map_err(query)?;
    let at = |v: i64| lit(ScalarValue::TimestampMicrosecond(Some(v), Some("UTC".into())));
    let has = provider.schema();
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            if has.field_with_name(f.name()).is_ok() || !f.is_nullable() {
                return Ok(ident(f.name()));
            }
            Ok(lit(ScalarValue::try_from(f.data_type()).map_err(query)?).alias(f.name()))
        })
        .collect::<Result<Vec<_>>>()?;
    let batches = ctx
        .read_table(provider)
        .map_err(query)?
        .filter(ident(time_column).gt_eq(at(since)).and(ident(time_column).lt(at(until))))
        .map_err(query)?
        .select(columns)
        .map_err(query)?
        .collect()
        .await
        .map_err(query)?;
    // Back to the written types (a reader may hand strings over as views).
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
