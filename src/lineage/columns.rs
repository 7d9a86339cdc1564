//! Which columns each column comes from (docs/lineage.md#column-lineage): a view's stored
//! features from the rows its writers take, an on-demand feature from its inputs, and a
//! joined output's columns (a training set's, a historical join's) from the tables and
//! the spine they were read from.

use std::collections::BTreeMap;

use quiver_sdk::definitions::Found;
use quiver_sdk::on_demand::ColumnOrigin;
use quiver_sdk::{Definitions, FeatureRef, FeatureView, OnDemandView};

use super::{ColumnFrom, Dataset};

/// How each of `view`'s stored features is made from the rows its writers take: its
/// name, the source columns it reads, and the write-time expression (empty: stored as
/// it comes). An event log's aggregations are not here (they are computed when read).
pub fn feature_columns(defs: &Definitions, view: &FeatureView) -> Vec<(String, Vec<String>, String)> {
    let compiled = quiver_sdk::write_time::compile(defs, view).ok().flatten();
    let mut out = Vec::new();
    let mut computed = 0;
    for feature in &view.features {
        if feature.expr.is_empty() {
            out.push((feature.name.clone(), vec![feature.name.clone()], String::new()));
            continue;
        }
        let Some(program) = compiled.as_ref().and_then(|c| c.program.as_ref()) else { continue };
        let schema = program.input_schema();
        let reads = program.reads(computed).into_iter().map(|i| schema.field(i).name().clone()).collect();
        out.push((feature.name.clone(), reads, feature.expr.clone()));
        computed += 1;
    }
    out
}

/// Where an on-demand feature's value comes from, one input column: a stored feature
/// (`view@N`, feature), an earlier on-demand feature, or a value the request carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnDemandInput {
    Stored { view: String, feature: String },
    EventTime { view: String },
    Computed { view: String, feature: String },
    Request(String),
}

/// What each feature of `view` reads, by feature name (the inputs' views by their
/// versioned names).
pub fn on_demand_inputs(defs: &Definitions, view: &OnDemandView) -> Vec<(String, Vec<OnDemandInput>, String)> {
    let described = quiver_sdk::on_demand::described(defs, view);
    let Ok(program) = quiver_sdk::on_demand::program(defs, view) else { return Vec::new() };
    let versioned = |name: &str| {
        defs.feature_view(name)
            .map(FeatureView::versioned_name)
            .or_else(|| defs.on_demand_view(name).map(OnDemandView::versioned_name))
            .unwrap_or_else(|| name.to_string())
    };
    view.features
        .iter()
        .enumerate()
        .map(|(k, f)| {
            let inputs = program
                .reads(k)
                .into_iter()
                .filter_map(|i| described.get(i))
                .map(|(column, origin)| match origin {
                    ColumnOrigin::Stored { view, feature, .. } => OnDemandInput::Stored { view: versioned(view), feature: feature.clone() },
                    ColumnOrigin::EventTime { view } => OnDemandInput::EventTime { view: versioned(view) },
                    ColumnOrigin::Computed { view, feature } => OnDemandInput::Computed { view: versioned(view), feature: feature.clone() },
                    ColumnOrigin::Key(_) | ColumnOrigin::Request(_) | ColumnOrigin::RequestTime => {
                        OnDemandInput::Request(column.name.to_string())
                    }
                })
                .collect();
            (f.name.clone(), inputs, f.expr.clone())
        })
        .collect()
}

/// The lineage of a join's output columns: each feature's column (`view__feature`) from
/// its table (`tables`, by the versioned name of the view read) — a stored feature as
/// it is stored, an aggregation from its event column, an on-demand feature from the
/// stored columns and spine columns its expression reads — and every other column of
/// `output` from the spine's column of its name. `defs` are the definitions as read
/// (pinned).
pub fn joined_columns(
    defs: &Definitions,
    refs: &[FeatureRef],
    tables: &BTreeMap<String, Dataset>,
    spine: Option<&Dataset>,
    output: &[String],
) -> Vec<ColumnFrom> {
    let field = |d: &Dataset, column: &str| (d.namespace.clone(), d.name.clone(), column.to_string());
    let stored = |view: &FeatureView, feature: &str| -> (Vec<super::InputField>, String) {
        let Some(table) = tables.get(&view.versioned_name()) else { return (Vec::new(), String::new()) };
        match view.aggregation(feature) {
            Some(agg) => (vec![field(table, &agg.column)], format!("{} of {} over {}", agg.function, agg.column, agg.window)),
            None => (vec![field(table, feature)], String::new()),
        }
    };
    let mut out = Vec::new();
    let mut features = Vec::new();
    for r in refs {
        let column = r.column_name();
        features.push(column.clone());
        let (inputs, how) = match defs.find(r) {
            Ok(Found::Stored(view, f)) => stored(view, &f.name),
            Ok(Found::OnDemand(view, f)) => {
                let mut inputs = Vec::new();
                for input in reads_of(defs, view, &f.name) {
                    match input {
                        OnDemandInput::Stored { view, feature } => {
                            if let Some(v) = defs.feature_view(&view) {
                                inputs.extend(stored(v, &feature).0);
                            }
                        }
                        OnDemandInput::EventTime { view } => {
                            if let (Some(v), Some(table)) = (defs.feature_view(&view), tables.get(&view)) {
                                inputs.push(field(table, &v.source.timestamp_field));
                            }
                        }
                        OnDemandInput::Request(name) => inputs.extend(spine.map(|s| field(s, &name))),
                        OnDemandInput::Computed { .. } => {}
                    }
                }
                inputs.dedup();
                (inputs, f.expr.clone())
            }
            Err(_) => continue,
        };
        out.push(ColumnFrom { output: column, inputs, how });
    }
    if let Some(spine) = spine {
        for column in output.iter().filter(|c| !features.contains(c)) {
            out.push(ColumnFrom { output: column.clone(), inputs: vec![field(spine, column)], how: String::new() });
        }
    }
    out.retain(|c| output.contains(&c.output) && !c.inputs.is_empty());
    out
}

/// What on-demand feature `feature` of `view` reads, an earlier on-demand feature's
/// inputs in its place (transitively).
fn reads_of(defs: &Definitions, view: &OnDemandView, feature: &str) -> Vec<OnDemandInput> {
    let mut out = Vec::new();
    let Some((_, inputs, _)) = on_demand_inputs(defs, view).into_iter().find(|(f, _, _)| f == feature) else { return out };
    for input in inputs {
        match input {
            OnDemandInput::Computed { view: earlier, feature } => {
                if let Some(o) = defs.on_demand_view(&earlier) {
                    out.extend(reads_of(defs, o, &feature));
                }
            }
            other => out.push(other),
        }
    }
    out
}
