//! On-demand features in a lookup (docs/transformations.md#online): their inputs read
//! with the stored features in the one store round trip, then computed by the same
//! [`Computation`] the offline join runs, on the same input types.

use std::sync::Arc;

use arrow::array::{ArrayRef, TimestampMicrosecondArray};
use quiver_runtime::arrays::{key_array, set_key, set_scalar, set_timestamp, value_at, values_to_array};
use quiver_runtime::encoding::{KeyValue, Value};
use quiver_runtime::on_demand::{Computation, Input, ScalarValue};
use quiver_sdk::{DType, Definitions, Feature, JoinKey, KeyType, OnDemandView};

use super::{Column, Entities, EntityColumns, Status, ViewPlan, read, view_plan};
use crate::error::{Error, Result};

/// The values requests carry for on-demand views' request fields: each field and its
/// values, one per entity row, typed ([`request_values`]).
pub type RequestFields = Vec<(String, Vec<Value>)>;

/// A request field's values as given in JSON (`entities`, Feast's convention), typed.
///
/// # Errors
/// [`Error::Request`] naming the field, the row and the type it needs.
pub fn request_values(field: &Feature, given: &[serde_json::Value]) -> Result<Vec<Value>> {
    given
        .iter()
        .enumerate()
        .map(|(row, v)| {
            quiver_runtime::rows::from_json(v, field.dtype).ok_or_else(|| {
                Error::Request(format!("request field `{}` must be {}, got {v} (entity row {})", field.name, field.dtype, row + 1))
            })
        })
        .collect()
}

/// Which evaluator computes on-demand features online
/// (docs/transformations.md#which-evaluator-runs-where).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evaluator {
    /// The row evaluator for a request of fewer than [`ROW_EVALUATOR_BELOW`] entity
    /// rows, DataFusion for a larger one: the default.
    Auto,
    /// Each entity row alone, without Arrow arrays.
    Row,
    /// DataFusion over a batch of the request's rows, as offline: the reference.
    Vectorized,
}

/// The request size from which DataFusion over the request's rows costs fewer
/// instructions than the row evaluator (bench/RESULTS.md, the row evaluator at 10
/// entities: ~210,000 instructions per request and ~15,000 more per row, DataFusion
/// ~218,000 and ~11,500).
pub const ROW_EVALUATOR_BELOW: usize = 16;

impl Evaluator {
    /// The evaluator `QUIVER_ON_DEMAND_EVALUATOR` names (`auto`, the default, `row` or
    /// `vectorized`), read once per process.
    pub fn configured() -> Evaluator {
        static CONFIGURED: std::sync::LazyLock<Evaluator> =
            std::sync::LazyLock::new(|| match std::env::var("QUIVER_ON_DEMAND_EVALUATOR").as_deref() {
                Ok("vectorized" | "datafusion") => Evaluator::Vectorized,
                Ok("row") => Evaluator::Row,
                Ok("auto" | "") | Err(_) => Evaluator::Auto,
                Ok(other) => {
                    tracing::warn!(value = other, "QUIVER_ON_DEMAND_EVALUATOR is `auto`, `row` or `vectorized`; using `auto`");
                    Evaluator::Auto
                }
            });
        *CONFIGURED
    }

    /// Whether `n` entity rows are computed by the row evaluator.
    fn by_rows(self, n: usize) -> bool {
        match self {
            Evaluator::Auto => n < ROW_EVALUATOR_BELOW,
            Evaluator::Row => true,
            Evaluator::Vectorized => false,
        }
    }
}

/// What the on-demand features asked for computed, per feature in answer order.
pub(super) struct OnDemandValues {
    pub(super) values: Vec<Vec<Value>>,
    /// Each row's event time: the latest among the stored rows its expression read.
    pub(super) event_times: Vec<Vec<i64>>,
    /// Values that could not be computed (null).
    pub(super) failed: u64,
}

/// The on-demand features of a lookup plan.
#[derive(Debug)]
pub(super) struct OnDemandPlan {
    computation: Computation,
    /// Which evaluator computes them.
    pub(super) evaluator: Evaluator,
    /// Per input of the computation: where the lookup finds it.
    sources: Vec<Supply>,
    /// Per on-demand feature asked for: its answer position.
    positions: Vec<usize>,
    /// The request fields every request must carry: those the features asked for read.
    fields: Vec<Feature>,
    /// Per request field: the features asked for that read it, for messages.
    needed_by: Vec<String>,
    /// Names of the features asked for, for messages.
    asked: Vec<String>,
}

/// A [`Supply`]'s values in one request.
enum Found<'v> {
    Values(&'v [Value], DType),
    Times(&'v [Option<i64>]),
    Keys(&'v [KeyValue], KeyType),
    Now,
}

#[derive(Debug)]
enum Supply {
    /// The answer column at this position (asked for, or read for on-demand features only).
    Column(usize, DType),
    /// The live rows' event times of the plan's view at this position.
    Time(usize),
    Key(JoinKey),
    /// The request field at this position of `fields`.
    Request(usize),
    Now,
}

impl OnDemandPlan {
    /// Plans `wanted` (view, feature, answer position): their inputs read among `views`,
    /// those not asked for at answer positions after `names`'s (added to it).
    pub(super) fn new(
        defs: &Definitions,
        wanted: &[(&OnDemandView, &str, usize)],
        views: &mut Vec<ViewPlan>,
        names: &mut Vec<String>,
    ) -> Result<OnDemandPlan> {
        let pairs: Vec<(&OnDemandView, &str)> = wanted.iter().map(|&(v, f, _)| (v, f)).collect();
        let computation = Computation::new(defs, &pairs).map_err(|e| Error::Request(e.to_string()))?;
        let asked: Vec<String> = wanted.iter().map(|(v, f, _)| format!("{}:{f}", v.name)).collect();
        let mut sources = Vec::with_capacity(computation.inputs().len());
        let (mut fields, mut needed_by) = (Vec::new(), Vec::new());
        for (i, input) in computation.inputs().iter().enumerate() {
            sources.push(match input {
                Input::Feature { view, feature, dtype } => {
                    let v = defs.feature_view(view).expect("validated");
                    if !v.online {
                        return Err(Error::Request(format!(
                            "on-demand feature `{}` reads feature view `{view}`, which is offline only (`online: false`)",
                            asked.join("`, `")
                        )));
                    }
                    Supply::Column(column_of(views, defs, v, feature, names), *dtype)
                }
                Input::EventTime { view } => {
                    let v = defs.feature_view(view).expect("validated");
                    let index = defs.feature_views.iter().position(|f| f.name == v.name).expect("found");
                    let at = view_plan(views, defs, v, index);
                    views[at].times = true;
                    Supply::Time(at)
                }
                Input::Key(key) => Supply::Key(key.clone()),
                Input::Request(field) => {
                    let by: Vec<&str> =
                        (0..asked.len()).filter(|&k| computation.reads(k).contains(&i)).map(|k| asked[k].as_str()).collect();
                    needed_by.push(by.join("`, `"));
                    fields.push(field.clone());
                    Supply::Request(fields.len() - 1)
                }
                Input::RequestTime => Supply::Now,
            });
        }
        let evaluator = Evaluator::configured();
        tracing::debug!(features = %asked.join(", "), ?evaluator, "on-demand features planned");
        Ok(OnDemandPlan { computation, evaluator, sources, positions: wanted.iter().map(|w| w.2).collect(), fields, needed_by, asked })
    }

    pub(super) fn request_fields(&self) -> &[Feature] {
        &self.fields
    }

    /// Every request field and join key the computation reads is given, one value per
    /// entity row.
    pub(super) fn check(&self, entities: &EntityColumns, fields: &super::RequestFields) -> Result<()> {
        let n = entities.first().map_or(0, |(_, v)| v.len());
        for (field, by) in self.fields.iter().zip(&self.needed_by) {
            let Some((_, values)) = fields.iter().find(|(name, _)| *name == field.name) else {
                return Err(Error::Request(format!(
                    "missing request field `{}` ({}, needed by `{by}`, goes beside the join keys in `entities`)",
                    field.name, field.dtype
                )));
            };
            if values.len() != n {
                return Err(Error::Request(format!(
                    "request field `{}` has {}, the join keys {n} (one per entity row)",
                    field.name,
                    quiver_sdk::error::count(values.len(), "value")
                )));
            }
        }
        for source in &self.sources {
            let Supply::Key(key) = source else { continue };
            let Some((_, values)) = entities.iter().find(|(name, _)| *name == key.name) else {
                return Err(Error::Request(format!("missing join key `{}` for on-demand feature `{}`", key.name, self.asked.join("`, `"))));
            };
            if let Some(v) =
                values.iter().find(|v| !matches!((v, key.dtype), (KeyValue::Int(_), KeyType::Int64) | (KeyValue::Str(_), KeyType::String)))
            {
                return Err(Error::Request(format!("join key `{}` is {}, got `{v}`", key.name, key.dtype)));
            }
        }
        Ok(())
    }

    /// The answer positions whose values the computation reads.
    pub(super) fn columns_read(&self) -> impl Iterator<Item = usize> + '_ {
        self.sources.iter().filter_map(|s| if let Supply::Column(j, _) = s { Some(*j) } else { None })
    }

    /// The on-demand features asked for: answer position and type each, in the order of
    /// [`Computed::columns`].
    pub(super) fn answered(&self) -> impl Iterator<Item = (usize, DType)> + '_ {
        self.positions.iter().copied().zip(self.computation.outputs().map(|(_, _, dtype)| dtype))
    }

    /// Computes the on-demand features for `n` entity rows from the values read
    /// (`column(j)`: answer position `j`'s values; `times(i)`: view `i` of the plan's
    /// live rows' event times, for the views whose times are read), the request and
    /// `now`.
    pub(super) fn evaluate<'v>(
        &self,
        column: &dyn Fn(usize) -> &'v [Value],
        times: &dyn Fn(usize) -> &'v [Option<i64>],
        (entities, fields): Entities<'_>,
        now: i64,
        n: usize,
    ) -> Result<OnDemandValues> {
        let keys = |key: &JoinKey| &entities.iter().find(|(name, _)| *name == key.name).expect("checked").1;
        let request = |i: usize| {
            let field = &self.fields[i];
            &fields.iter().find(|(name, _)| *name == field.name).expect("checked").1
        };
        let failed = |e: quiver_runtime::on_demand::InputError| Error::Request(format!("on-demand features: {}", e.0));
        if self.evaluator.by_rows(n) {
            // Each input's values found once per request, not per row.
            let found: Vec<Found<'_>> = self
                .sources
                .iter()
                .map(|source| match source {
                    Supply::Column(j, dtype) => Found::Values(column(*j), *dtype),
                    Supply::Time(v) => Found::Times(times(*v)),
                    Supply::Key(key) => Found::Keys(keys(key), key.dtype),
                    Supply::Request(f) => Found::Values(request(*f), self.fields[*f].dtype),
                    Supply::Now => Found::Now,
                })
                .collect();
            let value = |i: usize, row: usize, slot: &mut ScalarValue| match &found[i] {
                Found::Values(values, dtype) => set_scalar(*dtype, &values[row], slot),
                Found::Times(t) => set_timestamp(t[row], slot),
                Found::Keys(keys, dtype) => set_key(*dtype, &keys[row], slot),
                Found::Now => set_timestamp(Some(now), slot),
            };
            let time = |i: usize, row: usize| match &found[i] {
                Found::Times(t) => t[row],
                _ => None,
            };
            let computed = self.computation.evaluate_rows(n, &value, Some(&time)).map_err(failed)?;
            return Ok(OnDemandValues { values: computed.values, event_times: computed.event_times, failed: computed.failed });
        }
        let stamps = |t: Vec<Option<i64>>| -> ArrayRef { Arc::new(TimestampMicrosecondArray::from(t).with_timezone("UTC")) };
        let mut supplied: Vec<ArrayRef> = Vec::with_capacity(self.sources.len());
        for source in &self.sources {
            supplied.push(match source {
                Supply::Column(j, dtype) => values_to_array(*dtype, column(*j).iter()),
                Supply::Time(i) => stamps(times(*i).to_vec()),
                Supply::Key(key) => key_array(key.dtype, keys(key).iter()),
                Supply::Request(i) => values_to_array(self.fields[*i].dtype, request(*i).iter()),
                Supply::Now => stamps(vec![Some(now); n]),
            });
        }
        let computed = self.computation.evaluate(n, &supplied, true).map_err(failed)?;
        let values = computed
            .columns
            .iter()
            .zip(self.computation.outputs())
            .map(|(array, (_, _, dtype))| (0..n).map(|row| value_at(array.as_ref(), row, dtype)).collect())
            .collect();
        Ok(OnDemandValues { values, event_times: computed.event_times, failed: computed.failed })
    }

    /// [`OnDemandPlan::evaluate`] into the features' answer columns, from the columns
    /// read (`times`: per view of the plan, its live rows' event times when read); how
    /// many values could not be computed.
    pub(super) fn compute(
        &self,
        columns: &mut [Option<Column>],
        names: &[String],
        times: &[Option<Vec<Option<i64>>>],
        asked: Entities<'_>,
        now: i64,
        n: usize,
    ) -> Result<u64> {
        let computed = {
            let column = |j: usize| -> &[Value] { &columns[j].as_ref().expect("read").values };
            let times = |i: usize| -> &[Option<i64>] { times[i].as_deref().expect("read with its times") };
            self.evaluate(&column, &times, asked, now, n)?
        };
        for (((j, _), values), times) in self.answered().zip(computed.values).zip(computed.event_times) {
            let mut column = Column::empty(&names[j], n);
            for (value, ts) in values.into_iter().zip(times) {
                column.statuses.push(if matches!(value, Value::Null) { Status::NullValue } else { Status::Present });
                column.values.push(value);
                column.event_ts.push(Some(ts));
            }
            columns[j] = Some(column);
        }
        Ok(computed.failed)
    }
}

/// The answer position of `feature` of `view`: the one already read, else a new one
/// after `names` (named `view__feature`, never answered).
fn column_of(
    views: &mut Vec<ViewPlan>,
    defs: &Definitions,
    view: &quiver_sdk::FeatureView,
    feature: &str,
    names: &mut Vec<String>,
) -> usize {
    let index = defs.feature_views.iter().position(|v| v.name == view.name).expect("found");
    let k = if view.is_event_log() {
        view.aggregations.iter().position(|a| a.name == feature)
    } else {
        view.features.iter().position(|f| f.name == feature)
    }
    .expect("found");
    if let Some(planned) = views.iter().find(|v| v.index == index)
        && let Some(&(j, _)) = planned.wanted.iter().find(|&&(_, l)| l == k)
    {
        return j;
    }
    let j = names.len();
    names.push(format!("{}__{feature}", view.name));
    read(views, defs, view, j, feature);
    j
}
