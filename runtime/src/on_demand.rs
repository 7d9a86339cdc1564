//! Computing on-demand features (docs/transformations.md#computing): one
//! [`Computation`] per list of requested on-demand features, built once, then evaluated
//! on columns its caller supplies — the offline join from the spine and the joined
//! rows, the online lookup from the request and the stored rows. Both ask for the same
//! [`Input`]s in the same order and get the same program, so the values are the same.

use std::sync::Arc;

use crate::encoding::Value;
use arrow::array::{ArrayRef, AsArray, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, TimestampMicrosecondType};
pub use quiver_transform::InputError;
/// A value of one input or output of the row evaluator ([`Computation::evaluate_rows`]).
pub use quiver_transform::ScalarValue;
use quiver_transform::{ExprError, Output, Program};

use quiver_sdk::definitions::{Definitions, Feature, JoinKey};
use quiver_sdk::on_demand::{ColumnOrigin, OnDemandView, described};
use quiver_sdk::types::{DType, timestamp_arrow_type};

/// A column a computation reads, whoever supplies it. Stored values are null where
/// their view's row is missing or expired, as in the lookup's statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A served feature (an event log's aggregation) of a feature view.
    Feature { view: String, feature: String, dtype: DType },
    /// The event time of the row a feature view answered with, null when no live row;
    /// for an event log, the latest event among its aggregations read (online only:
    /// offline it is null, docs/transformations.md#event-times).
    EventTime { view: String },
    /// A join key of the entity row.
    Key(JoinKey),
    /// A value the request (or the spine row) carries.
    Request(Feature),
    /// The request's time: the spine row's time offline, the lookup's online.
    RequestTime,
}

impl Input {
    /// The Arrow type of the column supplied for it.
    pub fn arrow_type(&self) -> DataType {
        match self {
            Input::Feature { dtype, .. } => dtype.arrow_type(),
            Input::EventTime { .. } | Input::RequestTime => timestamp_arrow_type(),
            Input::Key(key) => key.dtype.dtype().arrow_type(),
            Input::Request(field) => field.dtype.arrow_type(),
        }
    }
}

/// Requested on-demand features, compiled: what they read ([`Computation::inputs`]) and
/// the programs that compute them, each on-demand view read through another computed
/// first.
#[derive(Debug, Clone)]
pub struct Computation {
    inputs: Vec<Input>,
    steps: Vec<Step>,
    /// Per requested feature: its step and output.
    wanted: Vec<(usize, usize)>,
    /// Per requested feature: its view, name and type.
    outputs: Vec<(String, String, DType)>,
}

/// One on-demand view's program, computing only the outputs needed.
#[derive(Debug, Clone)]
struct Step {
    program: Program,
    /// Per column of the program's input (only those its outputs read): where its
    /// values come from.
    sources: Vec<Source>,
    /// Per output: the `EventTime` inputs whose latest is its event time.
    times: Vec<Vec<usize>>,
}

/// One view's program and, per column of its input, where that column comes from.
type Compiled = (Program, Vec<(usize, ColumnOrigin)>);

#[derive(Debug, Clone, Copy)]
enum Source {
    Input(usize),
    /// Output `.1` of step `.0`.
    Output(usize, usize),
}

/// What [`Computation::evaluate`] computed, per requested feature in order.
#[derive(Debug, Clone)]
pub struct Computed {
    pub columns: Vec<ArrayRef>,
    /// Each row's event time (UTC microseconds): the latest among the stored rows its
    /// expression read, 0 when none; empty unless asked for.
    pub event_times: Vec<Vec<i64>>,
    /// Values that could not be computed (null), over every step.
    pub failed: u64,
}

/// What [`Computation::evaluate_rows`] computed, per requested feature in order.
#[derive(Debug, Clone)]
pub struct RowsComputed {
    /// Each row's value, as the online encoding holds a value of the feature's type.
    pub values: Vec<Vec<Value>>,
    /// As [`Computed::event_times`].
    pub event_times: Vec<Vec<i64>>,
    /// Values that could not be computed (null), over every step.
    pub failed: u64,
}

impl Computation {
    /// Compiles what computing `wanted` (on-demand view, feature) takes: each view's
    /// program with only the outputs needed, the requested ones and those a later view
    /// reads. A request field is an input only when an expression needed reads it
    /// (docs/transformations.md#online): a request (or spine) need not carry the others.
    ///
    /// # Errors
    /// An expression refused ([`Program::compile`], validation's check: only for
    /// definitions that did not pass it), naming the view.
    pub fn new(defs: &Definitions, wanted: &[(&OnDemandView, &str)]) -> Result<Computation, ExprError> {
        let views = &defs.on_demand_views;
        let index = |name: &str| views.iter().position(|v| v.name == name);
        // Per view, the outputs needed; compiled from the last defined to the first, as
        // a view reads only views defined before it.
        let mut needed: Vec<Vec<String>> = vec![Vec::new(); views.len()];
        for (view, feature) in wanted {
            let i = index(&view.name).expect("a defined on-demand view");
            if !needed[i].iter().any(|f| f.as_str() == *feature) {
                needed[i].push((*feature).to_string());
            }
        }
        let mut compiled: Vec<Option<Compiled>> = vec![None; views.len()];
        for i in (0..views.len()).rev() {
            if needed[i].is_empty() {
                continue;
            }
            let view = &views[i];
            let columns = described(defs, view);
            let outputs: Vec<Output> = view
                .features
                .iter()
                .filter(|f| needed[i].contains(&f.name))
                .map(|f| Output { name: f.name.clone(), dtype: f.dtype.arrow_type(), expr: f.expr.clone() })
                .collect();
            let refuse = |e: ExprError| ExprError { reason: format!("on-demand view `{}`: {}", view.name, e.reason), ..e };
            // Compiled against every column to learn which it reads, then against those
            // alone: the batch it is given holds nothing else.
            let plain: Vec<_> = columns.iter().map(|(c, _)| c.clone()).collect();
            let everything = Program::compile(&plain, &outputs).map_err(refuse)?;
            let mut reads: Vec<usize> = (0..outputs.len()).flat_map(|k| everything.reads(k)).collect();
            reads.sort_unstable();
            reads.dedup();
            let narrow: Vec<_> = reads.iter().map(|&c| plain[c].clone()).collect();
            let program = Program::compile(&narrow, &outputs).map_err(refuse)?;
            let read: Vec<(usize, ColumnOrigin)> = reads.iter().enumerate().map(|(at, &c)| (at, columns[c].1.clone())).collect();
            for (_, origin) in &read {
                if let ColumnOrigin::Computed { view: input, feature } = origin {
                    let j = index(input).expect("validated: defined before");
                    if !needed[j].contains(feature) {
                        needed[j].push(feature.clone());
                    }
                }
            }
            compiled[i] = Some((program, read));
        }
        let mut out = Computation { inputs: Vec::new(), steps: Vec::new(), wanted: Vec::new(), outputs: Vec::new() };
        let mut step_of: Vec<Option<usize>> = vec![None; views.len()];
        for (i, entry) in compiled.into_iter().enumerate() {
            let Some((program, read)) = entry else { continue };
            let mut sources = Vec::with_capacity(read.len());
            for (_, origin) in &read {
                sources.push(match origin {
                    ColumnOrigin::Stored { view, feature, dtype } => {
                        Source::Input(out.input(Input::Feature { view: view.clone(), feature: feature.clone(), dtype: *dtype }))
                    }
                    ColumnOrigin::EventTime { view } => Source::Input(out.input(Input::EventTime { view: view.clone() })),
                    ColumnOrigin::Computed { view, feature } => {
                        let s = step_of[index(view).expect("defined")].expect("computed before");
                        let o = out.steps[s].program.names().position(|n| n == feature).expect("needed");
                        Source::Output(s, o)
                    }
                    ColumnOrigin::Key(key) => Source::Input(out.input(Input::Key(key.clone()))),
                    ColumnOrigin::Request(field) => Source::Input(out.input(Input::Request(field.clone()))),
                    ColumnOrigin::RequestTime => Source::Input(out.input(Input::RequestTime)),
                });
            }
            // Each output's event time: the stored views it reads, directly or through
            // the on-demand features it reads.
            let mut times = Vec::new();
            for k in 0..program.names().count() {
                let mut of: Vec<usize> = Vec::new();
                for c in program.reads(k) {
                    let more = match &read.iter().find(|(r, _)| *r == c).expect("read").1 {
                        ColumnOrigin::Stored { view, .. } | ColumnOrigin::EventTime { view } => {
                            vec![out.input(Input::EventTime { view: view.clone() })]
                        }
                        ColumnOrigin::Computed { .. } => match sources[c] {
                            Source::Output(s, o) => out.steps[s].times[o].clone(),
                            Source::Input(_) => unreachable!("a computed column comes from a step"),
                        },
                        _ => Vec::new(),
                    };
                    for t in more {
                        if !of.contains(&t) {
                            of.push(t);
                        }
                    }
                }
                times.push(of);
            }
            step_of[i] = Some(out.steps.len());
            out.steps.push(Step { program, sources, times });
        }
        for (view, feature) in wanted {
            let s = step_of[index(&view.name).expect("defined")].expect("needed");
            let o = out.steps[s].program.names().position(|n| n == *feature).expect("needed");
            out.wanted.push((s, o));
            let dtype = view.feature(feature).expect("a feature of the view").dtype;
            out.outputs.push((view.name.clone(), (*feature).to_string(), dtype));
        }
        Ok(out)
    }

    /// The input `input`'s position, added when new.
    fn input(&mut self, input: Input) -> usize {
        match self.inputs.iter().position(|i| *i == input) {
            Some(i) => i,
            None => {
                self.inputs.push(input);
                self.inputs.len() - 1
            }
        }
    }

    /// What to supply to [`Computation::evaluate`], one column each, in this order.
    pub fn inputs(&self) -> &[Input] {
        &self.inputs
    }

    /// The inputs requested feature `k` reads (positions in [`Computation::inputs`]),
    /// directly or through the on-demand features it reads, ascending, each once.
    pub fn reads(&self, k: usize) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        let mut seen: Vec<(usize, usize)> = Vec::new();
        let mut stack = vec![self.wanted[k]];
        while let Some((s, o)) = stack.pop() {
            if seen.contains(&(s, o)) {
                continue;
            }
            seen.push((s, o));
            let step = &self.steps[s];
            for c in step.program.reads(o) {
                match step.sources[c] {
                    Source::Input(i) => out.push(i),
                    Source::Output(s, o) => stack.push((s, o)),
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The requested features: view, name and type each, in order.
    pub fn outputs(&self) -> impl Iterator<Item = (&str, &str, DType)> {
        self.outputs.iter().map(|(v, f, t)| (v.as_str(), f.as_str(), *t))
    }

    /// The feature views whose values or event times it reads, each once, in order of
    /// first reading.
    pub fn views(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for input in &self.inputs {
            if let Input::Feature { view, .. } | Input::EventTime { view } = input
                && !out.contains(&view.as_str())
            {
                out.push(view);
            }
        }
        out
    }

    /// The requested features for `rows` rows, from `supplied` (one column per
    /// [`Computation::inputs`], of its type and `rows` long); with `times`, each
    /// feature's event times too.
    ///
    /// # Errors
    /// [`InputError`] when a supplied column does not have its input's type.
    pub fn evaluate(&self, rows: usize, supplied: &[ArrayRef], times: bool) -> Result<Computed, InputError> {
        if supplied.len() != self.inputs.len() {
            return Err(InputError(format!("{} input columns, expected {}", supplied.len(), self.inputs.len())));
        }
        let mut results: Vec<Vec<ArrayRef>> = Vec::with_capacity(self.steps.len());
        let mut failed = 0;
        for step in &self.steps {
            let schema = step.program.input_schema();
            let columns: Vec<ArrayRef> = step
                .sources
                .iter()
                .map(|source| match *source {
                    Source::Input(i) => supplied[i].clone(),
                    Source::Output(s, o) => results[s][o].clone(),
                })
                .collect();
            let options = RecordBatchOptions::new().with_row_count(Some(rows));
            let batch = RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options).map_err(|e| InputError(e.to_string()))?;
            let evaluated = step.program.evaluate(&batch)?;
            failed += evaluated.failed.iter().sum::<u64>();
            results.push(evaluated.columns);
        }
        let columns = self.wanted.iter().map(|&(s, o)| results[s][o].clone()).collect();
        let event_times =
            if times { self.wanted.iter().map(|&(s, o)| latest(rows, &self.steps[s].times[o], supplied)).collect() } else { Vec::new() };
        Ok(Computed { columns, event_times, failed })
    }
}

impl Computation {
    /// [`Computation::evaluate`] by the row evaluator, each row alone (the same values,
    /// docs/transformations.md#which-evaluator-runs-where): `value(i, row, slot)` makes
    /// `slot` input `i`'s value at `row`, of its type ([`Input::arrow_type`]) — the slot
    /// holds that input's value at the row before, for reuse; with `times`, each row's
    /// event times too, `times(i, row)` being an [`Input::EventTime`]'s time.
    ///
    /// # Errors
    /// [`InputError`] when the values given do not fit a program's input.
    pub fn evaluate_rows(
        &self,
        rows: usize,
        value: &dyn Fn(usize, usize, &mut ScalarValue),
        times: Option<&dyn Fn(usize, usize) -> Option<i64>>,
    ) -> Result<RowsComputed, InputError> {
        let mut values: Vec<Vec<Value>> = self.wanted.iter().map(|_| Vec::with_capacity(rows)).collect();
        let mut event_times: Vec<Vec<i64>> =
            if times.is_some() { self.wanted.iter().map(|_| Vec::with_capacity(rows)).collect() } else { Vec::new() };
        let mut failed = 0;
        let mut outputs: Vec<Vec<ScalarValue>> = self.steps.iter().map(|s| Vec::with_capacity(s.program.names().count())).collect();
        // Per step, its input row, refilled for each row in place.
        let mut inputs: Vec<Vec<ScalarValue>> = self.steps.iter().map(|s| vec![ScalarValue::Null; s.sources.len()]).collect();
        // A value asked for once is moved into the answer (every step has read it by
        // then); one asked for twice is copied until its last.
        let last: Vec<bool> = self.wanted.iter().enumerate().map(|(k, w)| !self.wanted[k + 1..].contains(w)).collect();
        for row in 0..rows {
            for (s, step) in self.steps.iter().enumerate() {
                let input = &mut inputs[s];
                for (slot, source) in input.iter_mut().zip(&step.sources) {
                    match *source {
                        Source::Input(i) => value(i, row, slot),
                        Source::Output(t, o) => *slot = outputs[t][o].clone(),
                    }
                }
                outputs[s].clear();
                failed += step.program.evaluate_row(input, &mut outputs[s])?;
            }
            let mut same: Option<(&[usize], i64)> = None;
            for (k, &(s, o)) in self.wanted.iter().enumerate() {
                if let Some(time) = times {
                    // Features reading the same views have the same time: found once.
                    let of = self.steps[s].times[o].as_slice();
                    let latest = match same {
                        Some((before, t)) if before == of => t,
                        _ => of.iter().filter_map(|&i| time(i, row)).max().unwrap_or(0),
                    };
                    same = Some((of, latest));
                    event_times[k].push(latest);
                }
                let v = &mut outputs[s][o];
                let v = if last[k] { std::mem::replace(v, ScalarValue::Null) } else { v.clone() };
                values[k].push(crate::arrays::value_of(self.outputs[k].2, v));
            }
        }
        Ok(RowsComputed { values, event_times, failed })
    }
}

/// Per row, the latest non-null time among the `of` columns of `supplied`; 0 when none.
fn latest(rows: usize, of: &[usize], supplied: &[ArrayRef]) -> Vec<i64> {
    let mut out = vec![0i64; rows];
    let mut seen = vec![false; rows];
    for &i in of {
        let Some(times) = supplied[i].as_primitive_opt::<TimestampMicrosecondType>() else { continue };
        for (r, t) in times.iter().enumerate() {
            if let Some(t) = t
                && (!seen[r] || t > out[r])
            {
                out[r] = t;
                seen[r] = true;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, TimestampMicrosecondArray};
    use quiver_sdk::yaml::parse_definitions;

    const DEFS: &str = "entities:
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
feature_views:
  - {name: stats, entities: [driver], features: [{name: rate, dtype: float64}, {name: trips, dtype: int64}, {name: city, dtype: string}]}
on_demand_views:
  - name: first
    inputs: [stats]
    request: [{name: amount, dtype: float64}, {name: unused, dtype: string}]
    features:
      - {name: scaled, dtype: float64, expr: \"stats.rate * amount\"}
      - {name: per_trip, dtype: float64, expr: \"amount / stats.trips\"}
      - {name: never, dtype: string, expr: \"upper(stats.city)\"}
  - name: second
    inputs: [first]
    features:
      - {name: twice, dtype: float64, expr: \"first.scaled * 2\"}
";

    #[test]
    fn only_what_is_read_is_an_input_and_views_read_views() {
        let defs = parse_definitions(DEFS).unwrap();
        let (first, second) = (&defs.on_demand_views[0], &defs.on_demand_views[1]);
        let c = Computation::new(&defs, &[(second, "twice"), (first, "per_trip")]).unwrap();
        let stored = |f: &str, dtype| Input::Feature { view: "stats".into(), feature: f.into(), dtype };
        let request = |n: &str, dtype| Input::Request(Feature { name: n.into(), dtype, description: String::new(), expr: String::new() });
        // `city` is read by no needed output, nor is the declared request field `unused`.
        assert_eq!(
            c.inputs(),
            [
                stored("rate", DType::Float64),
                stored("trips", DType::Int64),
                request("amount", DType::Float64),
                Input::EventTime { view: "stats".into() },
            ]
        );
        assert_eq!(c.views(), ["stats"]);
        // `twice` reads `first.scaled`, so `stats.rate` and `amount`; `per_trip` reads `amount` and `stats.trips`.
        assert_eq!((c.reads(0), c.reads(1)), (vec![0, 2], vec![1, 2]));
        let n = 3;
        let supplied: Vec<ArrayRef> = vec![
            Arc::new(Float64Array::from(vec![Some(0.5), None, Some(2.0)])),
            Arc::new(Int64Array::from(vec![Some(4), Some(0), Some(0)])),
            Arc::new(Float64Array::from(vec![Some(10.0), Some(1.0), Some(3.0)])),
            Arc::new(TimestampMicrosecondArray::from(vec![Some(7), None, Some(9)]).with_timezone("UTC")),
        ];
        let got = c.evaluate(n, &supplied, true).unwrap();
        let f64s = |a: &ArrayRef| a.as_primitive::<arrow::datatypes::Float64Type>().iter().collect::<Vec<_>>();
        assert_eq!(f64s(&got.columns[0]), [Some(10.0), None, Some(12.0)]);
        // 1 / 0 and 3 / 0 (integer divisor, float dividend) cannot be computed: null, counted.
        assert_eq!(f64s(&got.columns[1]), [Some(2.5), None, None]);
        assert_eq!(got.failed, 2);
        assert_eq!(got.event_times, [vec![7, 0, 9], vec![7, 0, 9]]);
    }
}
