//! On-demand computations evaluated over the inputs the join and the lookup supply.

use quiver_sdk::yaml::parse_definitions;

fn assert_has(text: String, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{text:?} lacks {part:?}");
    }
}

/// Issue 53: a request field named like an input's feature — `request: [amount]` beside
/// `customer_stats.amount`, the natural fraud setup — applies: the bare `amount` is the
/// request field, `customer_stats.amount` the stored feature, and the computation that
/// serves both paths (the join and the lookup supply its inputs by position) reads each
/// where it names it.
#[test]
fn a_request_field_may_share_its_name_with_an_inputs_feature() {
    use std::sync::Arc;

    use arrow::array::{Array, ArrayRef, Float64Array, Int64Array, StringArray, TimestampMicrosecondArray};
    use quiver_runtime::on_demand::{Computation, Input};

    let yaml = r#"
entities:
  - {name: customer, join_keys: [{name: customer_id, dtype: string}]}
feature_views:
  - {name: customer_stats, entities: [customer], features: [{name: amount, dtype: float64}, {name: n, dtype: int64}]}
on_demand_views:
  - name: od
    inputs: [customer_stats]
    request: [{name: amount, dtype: float64}]
    features:
      - {name: ratio, dtype: float64, expr: "amount / customer_stats.amount"}
      - {name: seen, dtype: float64, expr: "customer_stats.amount + n"}
"#;
    let defs = parse_definitions(yaml).unwrap_or_else(|e| panic!("{e}"));
    let view = &defs.on_demand_views[0];
    let computation = Computation::new(&defs, &[(view, "ratio"), (view, "seen")]).unwrap();
    let supplied: Vec<ArrayRef> = computation
        .inputs()
        .iter()
        .map(|input| -> ArrayRef {
            match input {
                Input::Feature { feature, .. } if feature == "amount" => Arc::new(Float64Array::from(vec![4.0, 10.0])),
                Input::Feature { .. } => Arc::new(Int64Array::from(vec![1, 2])),
                Input::Request(field) => {
                    assert_eq!(field.name, "amount");
                    Arc::new(Float64Array::from(vec![2.0, 5.0]))
                }
                Input::Key(_) => Arc::new(StringArray::from(vec!["a", "b"])),
                Input::EventTime { .. } | Input::RequestTime => {
                    Arc::new(TimestampMicrosecondArray::from(vec![0i64, 0]).with_timezone("UTC"))
                }
            }
        })
        .collect();
    let got = computation.evaluate(2, &supplied, false).unwrap();
    let floats = |a: &ArrayRef| a.as_any().downcast_ref::<Float64Array>().unwrap().iter().collect::<Vec<_>>();
    // The request's 2.0 and 5.0 over the stored 4.0 and 10.0 (swapped, it would be 2.0).
    assert_eq!(floats(&got.columns[0]), [Some(0.5), Some(0.5)]);
    assert_eq!(floats(&got.columns[1]), [Some(5.0), Some(12.0)]);
    assert_eq!(got.columns[0].len(), 2);

    // An input whose feature is called `event_timestamp` clashes with the name of its
    // rows' event time: refused naming the view and the input, not as blank names.
    let clash = yaml
        .replace("entities: [customer], features:", "entities: [customer], source: {timestamp_field: ts}, features:")
        .replace("{name: n, dtype: int64}", "{name: event_timestamp, dtype: int64}")
        .replace("+ n", "+ 1");
    assert_has(
        parse_definitions(&clash).unwrap_err().to_string(),
        &["on-demand view `od`: input `customer_stats` has a feature named `event_timestamp`"],
    );
}
