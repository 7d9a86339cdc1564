//! On-demand views' programs (docs/transformations.md#names): the columns an on-demand
//! view's expressions may read, in the one order every path (the join, the server,
//! `verify`) builds their input batch in, and the view's compiled program.

use quiver_transform::{Column, ExprError, Output, Program};

use super::{EVENT_TIMESTAMP, REQUEST_TIME};
use crate::definitions::{Definitions, Feature, JoinKey, OnDemandView};
use crate::types::{DType, timestamp_arrow_type};

/// Where a column an on-demand view's expressions may read comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnOrigin {
    /// A served feature (an event log's aggregation) of a feature view.
    Stored {
        view: String,
        feature: String,
        dtype: DType,
    },
    /// The event time of a feature view's row.
    EventTime {
        view: String,
    },
    /// A feature of an on-demand view defined before.
    Computed {
        view: String,
        feature: String,
    },
    Key(JoinKey),
    Request(Feature),
    RequestTime,
}

/// The columns `view`'s expressions read, in order: per input, its served features then
/// (a plain feature view's) `event_timestamp`, qualified by the input's name; then the
/// join keys the inputs need ([`keys`]); then the request fields ([`request_fields`]);
/// then `request_time`. Unknown inputs are skipped (validation refuses them).
pub fn columns(defs: &Definitions, view: &OnDemandView) -> Vec<Column> {
    described(defs, view).into_iter().map(|(c, _)| c).collect()
}

/// [`columns`], each with where it comes from.
pub fn described(defs: &Definitions, view: &OnDemandView) -> Vec<(Column, ColumnOrigin)> {
    let mut out = Vec::new();
    for input in &view.inputs {
        // An expression names an input by its view's name, whatever version it reads.
        let name = crate::definitions::split_version(input).map_or(input.as_str(), |(name, _)| name);
        if let Some(v) = defs.feature_view(input) {
            for f in v.served_features() {
                let origin = ColumnOrigin::Stored { view: input.clone(), feature: f.name.clone(), dtype: f.dtype };
                out.push((Column::qualified(name, &f.name, f.dtype.arrow_type()), origin));
            }
            if !v.is_event_log() {
                out.push((
                    Column::qualified(name, EVENT_TIMESTAMP, timestamp_arrow_type()),
                    ColumnOrigin::EventTime { view: input.clone() },
                ));
            }
        } else if let Some(o) = defs.on_demand_view(input) {
            for f in &o.features {
                let origin = ColumnOrigin::Computed { view: input.clone(), feature: f.name.clone() };
                out.push((Column::qualified(name, &f.name, f.dtype.arrow_type()), origin));
            }
        }
    }
    for key in keys(defs, view) {
        out.push((Column::bare(&key.name, key.dtype.dtype().arrow_type()), ColumnOrigin::Key(key)));
    }
    for field in request_fields(defs, view) {
        out.push((Column::bare(&field.name, field.dtype.arrow_type()), ColumnOrigin::Request(field)));
    }
    out.push((Column::bare(REQUEST_TIME, timestamp_arrow_type()), ColumnOrigin::RequestTime));
    out
}

/// The join keys of the views `view` reads, directly or through the on-demand views
/// it reads, each once, in order of first appearance.
pub fn keys(defs: &Definitions, view: &OnDemandView) -> Vec<JoinKey> {
    let mut out: Vec<JoinKey> = Vec::new();
    walk(defs, view, &mut |defs, o| {
        for input in &o.inputs {
            let Some(v) = defs.feature_view(input) else { continue };
            for key in defs.join_keys(v) {
                if !out.iter().any(|k| k.name == key.name) {
                    out.push(key);
                }
            }
        }
    });
    out
}

/// The request fields `view` needs: its own, then those of the on-demand views it reads
/// (directly or not), each name once (the first definition's type).
pub fn request_fields(defs: &Definitions, view: &OnDemandView) -> Vec<Feature> {
    let mut out: Vec<Feature> = Vec::new();
    walk(defs, view, &mut |_, o| {
        for field in &o.request {
            if !out.iter().any(|f| f.name == field.name) {
                out.push(field.clone());
            }
        }
    });
    out
}

/// `view`, then every on-demand view it reads, depth first, each once; only those
/// defined before the one reading them (validation refuses the rest, so no cycle is
/// followed).
fn walk<'d>(defs: &'d Definitions, view: &'d OnDemandView, f: &mut dyn FnMut(&'d Definitions, &'d OnDemandView)) {
    let mut seen: Vec<&str> = Vec::new();
    let mut stack = vec![view];
    while let Some(o) = stack.pop() {
        if seen.contains(&o.name.as_str()) {
            continue;
        }
        seen.push(&o.name);
        f(defs, o);
        let position = |name: &str| defs.on_demand_views.iter().position(|v| v.name == name);
        let here = position(&o.name).unwrap_or(usize::MAX);
        for input in o.inputs.iter().rev() {
            let input = crate::definitions::split_version(input).map_or(input.as_str(), |(name, _)| name);
            if let Some(i) = position(input).filter(|&i| i < here) {
                stack.push(&defs.on_demand_views[i]);
            }
        }
    }
}

/// `view`'s features compiled against [`columns`].
///
/// # Errors
/// The first feature whose expression is refused ([`Program::compile`]).
pub fn program(defs: &Definitions, view: &OnDemandView) -> Result<Program, ExprError> {
    let outputs: Vec<Output> =
        view.features.iter().map(|f| Output { name: f.name.clone(), dtype: f.dtype.arrow_type(), expr: f.expr.clone() }).collect();
    Program::compile(&columns(defs, view), &outputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::RegistryDoc;
    use crate::yaml::parse_definitions;

    const BASE: &str = "entities:
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
  - {name: customer, join_keys: [{name: customer_id, dtype: string}]}
feature_views:
  - {name: driver_hourly, entities: [driver], ttl: 2h,
     features: [{name: conv_rate, dtype: float64}, {name: acc_rate, dtype: float32}]}
  - {name: customer_profile, entities: [customer], features: [{name: city, dtype: string}]}
  - name: customer_rides
    entities: [customer]
    features: [{name: fare, dtype: float64}]
    aggregations: [{name: fare_avg_1d, function: avg, column: fare, window: 1d}]
";

    fn with(on_demand: &str) -> Result<Definitions, String> {
        parse_definitions(&format!("{BASE}on_demand_views:\n{on_demand}")).map_err(|e| e.to_string())
    }

    const SCORING: &str = "  - name: trip_scoring
    inputs: [driver_hourly, customer_profile, customer_rides]
    request: [{name: amount, dtype: float64}, {name: pickup_city, dtype: string}]
    features:
      - {name: conv_x_acc, dtype: float64, expr: \"driver_hourly.conv_rate * driver_hourly.acc_rate\"}
      - {name: fare_ratio, dtype: float64, expr: \"amount / NULLIF(customer_rides.fare_avg_1d, 0)\"}
      - {name: home_city, dtype: bool, expr: \"customer_profile.city = lower(pickup_city)\"}
      - {name: profile_age_h, dtype: float64,
         expr: \"date_part('epoch', request_time - customer_profile.event_timestamp) / 3600\"}
";

    #[test]
    fn the_guides_example_applies_and_reads_in_one_order() {
        let defs = with(SCORING).unwrap();
        let view = &defs.on_demand_views[0];
        let names: Vec<String> = columns(&defs, view).iter().map(|c| c.reference()).collect();
        assert_eq!(
            names,
            [
                "driver_hourly.conv_rate",
                "driver_hourly.acc_rate",
                "driver_hourly.event_timestamp",
                "customer_profile.city",
                "customer_profile.event_timestamp",
                "customer_rides.fare_avg_1d",
                "driver_id",
                "customer_id",
                "amount",
                "pickup_city",
                "request_time",
            ]
        );
        let program = program(&defs, view).unwrap();
        assert_eq!(program.names().collect::<Vec<_>>(), ["conv_x_acc", "fare_ratio", "home_city", "profile_age_h"]);
        // The same definitions through JSON (Python's way) are the same.
        let json = serde_json::to_string(&defs).unwrap();
        assert_eq!(Definitions::from_json(&json).unwrap(), defs);
    }

    #[test]
    fn an_on_demand_view_reads_one_defined_before_it() {
        let later = "  - name: second
    inputs: [trip_scoring]
    request: [{name: tip, dtype: float64}]
    features: [{name: x, dtype: float64, expr: \"trip_scoring.fare_ratio * tip + amount\"}]
";
        let defs = with(&format!("{SCORING}{later}")).unwrap();
        let second = &defs.on_demand_views[1];
        let fields: Vec<String> = request_fields(&defs, second).into_iter().map(|f| f.name).collect();
        assert_eq!(fields, ["tip", "amount", "pickup_city"]);
        let keys: Vec<String> = keys(&defs, second).into_iter().map(|k| k.name).collect();
        assert_eq!(keys, ["driver_id", "customer_id"]);
        // The other way round is refused: it reads a view defined after it.
        let err = with(&format!("{later}{SCORING}")).unwrap_err();
        assert!(err.contains("on-demand view `second`: input `trip_scoring` is an on-demand view defined after it"), "{err}");
    }

    #[test]
    fn bad_on_demand_views_are_refused_naming_view_feature_and_expression() {
        let one = |inputs: &str, request: &str, feature: &str| {
            with(&format!("  - name: od\n    inputs: [{inputs}]\n    request: [{request}]\n    features: [{feature}]\n")).unwrap_err()
        };
        let cases = [
            (
                one("nope", "", "{name: f, dtype: int64, expr: '1'}"),
                "on-demand view `od`: unknown input `nope` (known: driver_hourly, customer_profile, customer_rides)",
            ),
            (
                one("driver_hourly", "", "{name: f, dtype: float64, expr: 'driver_hourly.nope * 2'}"),
                "on-demand view `od`, feature `f`: `driver_hourly.nope * 2`: unknown name",
            ),
            (one("driver_hourly", "", "{name: f, dtype: float64, expr: 'sum(driver_hourly.conv_rate)'}"), "aggregate"),
            (one("driver_hourly", "", "{name: f, dtype: float64, expr: 'random()'}"), "the function `random`"),
            (
                one("driver_hourly", "", "{name: f, dtype: int64, expr: 'driver_hourly.conv_rate'}"),
                "computes float64, which an int64 feature cannot hold",
            ),
            (
                one("driver_hourly", "{name: request_time, dtype: int64}", "{name: f, dtype: int64, expr: '1'}"),
                "cannot be called `request_time`",
            ),
            (one("driver_hourly", "{name: driver_id, dtype: int64}", "{name: f, dtype: int64, expr: '1'}"), "is a join key of its inputs"),
            (one("driver_hourly", "", "{name: f, dtype: decimal, expr: '1'}"), "feature `f`: unknown dtype `decimal`"),
            (with("  - {name: od, inputs: [driver_hourly], features: []}\n").unwrap_err(), "no features"),
            (
                with("  - {name: driver_hourly, inputs: [], features: [{name: f, dtype: int64, expr: '1'}]}\n").unwrap_err(),
                "a feature view has the same name",
            ),
            (with("  - {name: od, inputs: [], features: [{name: f, dtype: int64}]}\n").unwrap_err(), "missing field `expr`"),
        ];
        for (err, want) in cases {
            assert!(err.contains(want), "{err}\n  should contain: {want}");
        }
    }

    #[test]
    fn services_name_on_demand_features_and_a_changed_expression_breaks() {
        let service = "feature_services:\n  - {name: ranker, features: [\"trip_scoring:fare_ratio\", \"driver_hourly:conv_rate\"]}\n";
        let defs = parse_definitions(&format!("{BASE}{service}on_demand_views:\n{SCORING}")).unwrap();
        assert_eq!(defs.feature_services[0].features.len(), 2);
        let bad = service.replace("fare_ratio", "nope");
        let err = parse_definitions(&format!("{BASE}{bad}on_demand_views:\n{SCORING}")).unwrap_err().to_string();
        assert!(err.contains("unknown feature `trip_scoring:nope`"), "{err}");

        let probe = NoData;
        let doc = RegistryDoc::empty("p").applied(&defs, &RegistryDoc::empty("p").plan(&defs), chrono::Utc::now(), false);
        assert!(doc.breaking_changes(&defs, &probe).unwrap().is_empty());
        let changed = parse_definitions(&format!("{BASE}{service}on_demand_views:\n{}", SCORING.replace("NULLIF", "nullif"))).unwrap();
        let plan = doc.plan(&changed);
        assert!(plan.to_string().contains("~ on_demand_view trip_scoring"), "{plan}");
        let breaking = doc.breaking_changes(&changed, &probe).unwrap();
        assert_eq!(breaking.len(), 1);
        assert!(
            breaking[0].to_string().starts_with("on-demand view `trip_scoring`: feature `fare_ratio` would change its expression"),
            "{}",
            breaking[0]
        );
    }

    struct NoData;

    impl crate::DataProbe for NoData {
        fn holds_data(&self, _view: &crate::FeatureView) -> crate::Result<bool> {
            Ok(false)
        }
    }
}
