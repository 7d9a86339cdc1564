//! Definitions from YAML and from the builder API, and one test per validation error.

use quiver_sdk::yaml::{load_definitions, parse_definitions};
use quiver_sdk::{DType, Definitions, Entity, FeatureService, FeatureView, KeyType, ListElement, Source, StreamFormat, Ttl};

const GOOD: &str = r#"
entities:
  - name: driver
    join_keys: [{name: driver_id, dtype: int64}]
    description: a person who drives
  - name: customer
    join_keys: [{name: customer_id, dtype: string}]
feature_views:
  - name: driver_hourly
    entities: [driver]
    ttl: 2h
    online: true
    tags: {team: ranking}
    source:
      timestamp_field: event_timestamp
      created_timestamp_field: created_timestamp
      stream: {topic: driver_events, format: json}
    features:
      - {name: conv_rate, dtype: float64}
      - {name: trips, dtype: int64}
  - name: customer_profile
    entities: [customer]
    online: false
    source: {path: tables/customers}
    features:
      - {name: embedding, dtype: list<float32>}
      - {name: city, dtype: string}
  - name: pair
    entities: [driver, customer]
    ttl: 1h30m
    features:
      - {name: rides_together, dtype: int32}
feature_services:
  - name: ranker_v1
    description: ranking model
    features: ["driver_hourly:conv_rate", "customer_profile:embedding", "pair:rides_together"]
"#;

fn built() -> Definitions {
    Definitions::default()
        .with_entity(Entity::new("driver").with_join_key("driver_id", KeyType::Int64).with_description("a person who drives"))
        .with_entity(Entity::new("customer").with_join_key("customer_id", KeyType::String))
        .with_feature_view(
            FeatureView::new("driver_hourly")
                .with_entity("driver")
                .with_ttl(Ttl::from_secs(7200))
                .with_online(true)
                .with_tag("team", "ranking")
                .with_source(
                    Source::new()
                        .with_timestamp_field("event_timestamp")
                        .with_created_timestamp_field("created_timestamp")
                        .with_stream("driver_events", StreamFormat::Json),
                )
                .with_feature("conv_rate", DType::Float64)
                .with_feature("trips", DType::Int64),
        )
        .with_feature_view(
            FeatureView::new("customer_profile")
                .with_entity("customer")
                .with_online(false)
                .with_source(Source::new().with_path("tables/customers"))
                .with_feature("embedding", DType::List(ListElement::Float32))
                .with_feature("city", DType::String),
        )
        .with_feature_view(
            FeatureView::new("pair")
                .with_entity("driver")
                .with_entity("customer")
                .with_ttl(Ttl::from_secs(5400))
                .with_feature("rides_together", DType::Int32),
        )
        .with_feature_service(
            FeatureService::new("ranker_v1")
                .with_description("ranking model")
                .with_feature("driver_hourly", "conv_rate")
                .with_feature("customer_profile", "embedding")
                .with_feature("pair", "rides_together"),
        )
}

#[test]
fn yaml_and_builder_produce_equal_definitions() {
    let from_yaml = parse_definitions(GOOD).unwrap();
    let from_builder = built();
    from_builder.validate().unwrap();
    assert_eq!(from_yaml, from_builder);
    // And both serialise to the same registry JSON, which reads back equal.
    let json = serde_json::to_string(&from_yaml).unwrap();
    assert_eq!(json, serde_json::to_string(&from_builder).unwrap());
    let back: Definitions = serde_json::from_str(&json).unwrap();
    assert_eq!(back, from_builder);
}

#[test]
fn an_empty_skeleton_is_no_definitions() {
    let skeleton = "# entities:\n#   - name: driver\n\n";
    assert_eq!(parse_definitions(skeleton).unwrap(), Definitions::default());
    assert_eq!(parse_definitions("entities: []\nfeature_views: []\nfeature_services: []\n").unwrap(), Definitions::default());
}

/// Validation error for GOOD with `from` replaced by `to`.
fn error_after(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "fixture lacks {from:?}");
    let text = GOOD.replacen(from, to, 1);
    parse_definitions(&text).unwrap_err().to_string()
}

fn assert_has(message: String, parts: &[&str]) {
    for p in parts {
        assert!(message.contains(p), "message {message:?} lacks {p:?}");
    }
    assert!(!message.contains('\n'), "one line: {message:?}");
}

#[test]
fn unknown_entity_is_named_with_the_known_ones() {
    assert_has(
        error_after("entities: [driver]\n    ttl: 2h", "entities: [drivr]\n    ttl: 2h"),
        &["feature view `driver_hourly`", "unknown entity `drivr`", "known: driver, customer"],
    );
}

#[test]
fn unknown_view_in_a_service_is_named() {
    assert_has(
        error_after("\"driver_hourly:conv_rate\"", "\"driver_hourly_v2:conv_rate\""),
        &["feature service `ranker_v1`", "unknown feature view `driver_hourly_v2`", "known: driver_hourly, customer_profile, pair"],
    );
}

#[test]
fn missing_feature_in_a_service_is_named() {
    assert_has(
        error_after("\"driver_hourly:conv_rate\"", "\"driver_hourly:acc_rate\""),
        &["feature service `ranker_v1`", "unknown feature `driver_hourly:acc_rate`", "has: conv_rate, trips"],
    );
}

#[test]
fn bad_feature_reference_is_named() {
    assert_has(
        error_after("\"driver_hourly:conv_rate\"", "\"conv_rate\""),
        &["feature service `ranker_v1`", "bad feature reference `conv_rate`", "view:feature"],
    );
}

#[test]
fn duplicate_names_are_refused() {
    assert_has(error_after("name: customer\n", "name: driver\n"), &["duplicate entity `driver`"]);
    assert_has(error_after("name: pair", "name: driver_hourly"), &["duplicate feature view `driver_hourly`"]);
    assert_has(
        error_after("{name: trips, dtype: int64}", "{name: conv_rate, dtype: int64}"),
        &["duplicate feature `conv_rate` in feature view `driver_hourly`"],
    );
    assert_has(
        error_after("\"pair:rides_together\"", "\"driver_hourly:conv_rate\""),
        &["duplicate feature reference `driver_hourly:conv_rate` in feature service `ranker_v1`"],
    );
}

#[test]
fn bad_dtype_names_view_feature_and_choices() {
    assert_has(
        error_after("{name: trips, dtype: int64}", "{name: trips, dtype: integer64}"),
        &["feature view `driver_hourly`, feature `trips`", "unknown dtype `integer64`", "expected one of int32, int64", "list<float32>"],
    );
    assert_has(error_after("dtype: list<float32>", "dtype: list<bool>"), &["feature `embedding`", "unknown dtype `list<bool>`"]);
}

#[test]
fn bad_join_key_type_is_named() {
    assert_has(
        error_after("{name: driver_id, dtype: int64}", "{name: driver_id, dtype: float64}"),
        &["entity `driver`, join key `driver_id`", "unknown dtype `float64`", "int64 or string"],
    );
}

#[test]
fn bad_ttl_is_named() {
    assert_has(error_after("ttl: 2h", "ttl: 2 weeks"), &["feature view `driver_hourly`", "bad ttl `2 weeks`", "e.g. 30s, 15m, 2h"]);
    assert_has(error_after("ttl: 2h", "ttl: -5"), &["bad ttl `-5`"]);
}

#[test]
fn key_type_clash_names_both_entities() {
    let text = GOOD.replacen(
        "  - name: customer\n    join_keys: [{name: customer_id, dtype: string}]",
        "  - name: customer\n    join_keys: [{name: customer_id, dtype: string}]\n  - name: fleet\n    join_keys: [{name: driver_id, dtype: string}]",
        1,
    );
    assert_has(
        parse_definitions(&text).unwrap_err().to_string(),
        &["join key `driver_id` is int64 in entity `driver` but string in entity `fleet`"],
    );
}

#[test]
fn column_clash_is_refused() {
    assert_has(
        error_after("{name: trips, dtype: int64}", "{name: driver_id, dtype: int64}"),
        &["feature view `driver_hourly`", "column `driver_id` is both a join key and a feature"],
    );
    assert_has(
        error_after("created_timestamp_field: created_timestamp", "created_timestamp_field: event_timestamp"),
        &["column `event_timestamp` is both the timestamp and the created timestamp field"],
    );
}

#[test]
fn empty_definitions_are_refused() {
    assert_has(error_after("join_keys: [{name: customer_id, dtype: string}]", "join_keys: []"), &["entity `customer`: no join keys"]);
    assert_has(
        error_after("features:\n      - {name: rides_together, dtype: int32}", "features: []"),
        &["feature view `pair`: no features"],
    );
    assert_has(error_after("entities: [driver, customer]", "entities: []"), &["feature view `pair`: no entities"]);
}

#[test]
fn bad_names_are_refused() {
    assert_has(error_after("name: pair", "name: pair-view"), &["feature view `pair-view`: bad name", "letters, digits and `_`"]);
    assert_has(error_after("name: pair", "name: pair__x"), &["feature view `pair__x`: bad name", "`__`"]);
}

#[test]
fn quiver_column_names_are_reserved() {
    assert_has(
        error_after("{name: trips, dtype: int64}", "{name: _quiver_seq, dtype: int64}"),
        &["feature `_quiver_seq`: bad name", "reserved"],
    );
}

#[test]
fn yaml_shape_errors_carry_the_position() {
    assert_has(error_after("    ttl: 2h", "    ttll: 2h"), &["unknown field `ttll`", "line"]);
}

#[test]
fn errors_from_a_file_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("features.yaml");
    std::fs::write(&path, GOOD.replacen("entities: [driver]\n    ttl", "entities: [nobody]\n    ttl", 1)).unwrap();
    let msg = load_definitions(&path).unwrap_err().to_string();
    assert!(msg.starts_with(&format!("{}: ", path.display())), "{msg}");
    assert!(msg.contains("unknown entity `nobody`"), "{msg}");
}

#[test]
fn builder_definitions_pass_the_same_validation() {
    let defs = built().with_feature_service(FeatureService::new("broken").with_feature("ghost", "x"));
    let msg = defs.validate().unwrap_err().to_string();
    assert!(msg.contains("feature service `broken`: unknown feature view `ghost`"), "{msg}");
}

const RIDES: &str = r#"
entities: [{name: rider, join_keys: [{name: rider_id, dtype: int64}]}]
feature_views:
  - name: rides
    entities: [rider]
    source: {timestamp_field: event_timestamp, created_timestamp_field: created_timestamp}
    features:
      - {name: fare, dtype: float64}
      - {name: minutes, dtype: int64}
      - {name: city, dtype: string}
    aggregations:
      - {name: fare_sum_1h, function: sum, column: fare, window: 1h}
      - {name: rides_7d, function: count, column: fare, time_window: 7d}
      - {name: minutes_min_30m, function: min, column: minutes, window: 30m, hop: 10m}
      - {name: last_cities, function: last_k, k: 3, column: city, window: 7d}
feature_services:
  - {name: rider_model, features: ["rides:fare_sum_1h", "rides:last_cities"]}
"#;

#[test]
fn aggregations_parse_and_are_the_views_served_features() {
    let defs = parse_definitions(RIDES).unwrap();
    let view = defs.feature_view("rides").unwrap();
    assert!(view.is_event_log());
    let served: Vec<(String, String)> = view.served_features().into_iter().map(|f| (f.name, f.dtype.to_string())).collect();
    let expected = [("fare_sum_1h", "float64"), ("rides_7d", "int64"), ("minutes_min_30m", "int64"), ("last_cities", "list<string>")];
    assert_eq!(served, expected.map(|(a, b)| (a.to_string(), b.to_string())));
    assert_eq!(view.aggregations[1].window.to_string(), "7d", "Feast's time_window is the window");
    assert_eq!(view.aggregations[1].hop().to_string(), "1h");
    assert_eq!(view.aggregations[2].hop().to_string(), "10m");
    // An event column is not a served feature of an event log.
    let err = defs.find_feature(&"rides:fare".parse().unwrap()).unwrap_err().to_string();
    assert!(err.contains("unknown feature `rides:fare`") && err.contains("fare_sum_1h, rides_7d"), "{err}");
    // The registry's JSON round-trips them.
    let json = serde_json::to_string(&defs).unwrap();
    assert_eq!(serde_json::from_str::<Definitions>(&json).unwrap(), defs);
}

#[test]
fn bad_aggregations_are_refused_naming_view_and_aggregation() {
    let cases = [
        ("{name: a, function: sum, column: nope, window: 1h}", "unknown column `nope`"),
        ("{name: a, function: avg, column: city, window: 1h}", "avg needs a numeric column"),
        ("{name: a, function: sum, column: fare, window: 1h, hop: 7m}", "window 1h is not a multiple of its hop 7m"),
        ("{name: a, function: sum, column: fare, window: 1d5m}", "not a multiple of its hop 1h (the default hop"),
        ("{name: a, function: last_k, column: city, window: 1h, k: 0}", "k must be 1 to 1000, got 0"),
        ("{name: a, function: last_k, column: city, window: 1h, k: 1001}", "k must be 1 to 1000, got 1001"),
        ("{name: a, function: last_k, column: city, window: 1h}", "last_k needs k"),
        ("{name: a, function: count, column: city, window: 1h, k: 2}", "k applies only to last_k"),
        ("{name: fare, function: count, column: city, window: 1h}", "clashes with a column"),
        ("{name: rider_id, function: count, column: city, window: 1h}", "clashes with a column"),
        ("{name: a, function: median, column: fare, window: 1h}", "unknown function `median`"),
        ("{name: a, function: count, column: fare, window: 0}", "window must be positive"),
        ("{name: a, function: count, column: fare, window: 2 weeks}", "bad window `2 weeks`"),
        ("{name: a, function: count, column: fare}", "no window"),
    ];
    for (agg, expected) in cases {
        let yaml = format!(
            "entities: [{{name: rider, join_keys: [{{name: rider_id, dtype: int64}}]}}]\nfeature_views:\n  - name: rides\n    entities: [rider]\n    features: [{{name: fare, dtype: float64}}, {{name: city, dtype: string}}, {{name: flag, dtype: bool}}]\n    aggregations: [{agg}]\n"
        );
        let err = parse_definitions(&yaml).unwrap_err().to_string();
        assert!(err.contains(expected), "{agg}: {err}");
        if !expected.contains("clashes") {
            assert!(err.contains("feature view `rides`, aggregation `a`"), "{agg}: {err}");
        }
    }
    let last_k_of_bool = RIDES
        .replace("column: city, window: 7d", "column: flag, window: 7d")
        .replace("{name: city, dtype: string}", "{name: city, dtype: string}\n      - {name: flag, dtype: bool}");
    let err = parse_definitions(&last_k_of_bool).unwrap_err().to_string();
    assert!(err.contains("last_k needs an int, float or string column; `flag` is bool"), "{err}");
    let with_ttl = RIDES.replace("    entities: [rider]\n", "    entities: [rider]\n    ttl: 2h\n");
    let err = parse_definitions(&with_ttl).unwrap_err().to_string();
    assert!(err.contains("ttl does not apply to a view with aggregations"), "{err}");
    let service_on_event_column = RIDES.replace("\"rides:last_cities\"", "\"rides:city\"");
    let err = parse_definitions(&service_on_event_column).unwrap_err().to_string();
    assert!(err.contains("unknown feature `rides:city`"), "{err}");
}

#[test]
fn the_builder_api_writes_aggregations_too() {
    use quiver_sdk::{AggFunction, Aggregation};
    let defs = Definitions::default().with_entity(Entity::new("rider").with_join_key("rider_id", KeyType::Int64)).with_feature_view(
        FeatureView::new("rides").with_entity("rider").with_feature("fare", DType::Float64).with_aggregation(Aggregation::new(
            "fare_sum_1h",
            AggFunction::Sum,
            "fare",
            Ttl::parse("1h").unwrap(),
        )),
    );
    defs.validate().unwrap();
    let from_yaml = parse_definitions(
        "entities: [{name: rider, join_keys: [{name: rider_id, dtype: int64}]}]\nfeature_views:\n  - {name: rides, entities: [rider], features: [{name: fare, dtype: float64}], aggregations: [{name: fare_sum_1h, function: sum, column: fare, window: 1h}]}\n",
    )
    .unwrap();
    assert_eq!(defs, from_yaml);
}

/// Definitions as JSON (the Python SDK's) with a wrong shape: the error names the view
/// and aggregation (or feature, entity, service), never a position in the JSON text.
#[test]
fn json_definitions_name_what_is_wrong() {
    let good = serde_json::json!({
        "entities": [{"name": "user", "join_keys": [{"name": "user_id", "dtype": "int64"}]}],
        "feature_views": [{"name": "activity", "entities": ["user"], "features": [{"name": "amount", "dtype": "float64"}],
            "aggregations": [{"name": "amount_sum_7d", "function": "sum", "column": "amount", "window": "7d"}]}],
    });
    assert!(Definitions::from_json(&good.to_string()).is_ok());
    let mut bad = good.clone();
    bad["feature_views"][0]["aggregations"][0]["function"] = "summ".into();
    let err = Definitions::from_json(&bad.to_string()).unwrap_err().to_string();
    assert!(err.starts_with("feature view `activity`, aggregation `amount_sum_7d`: unknown function `summ`"), "{err}");
    assert!(!err.contains("line") && !err.contains("column 3"), "{err}");
    let mut bad = good.clone();
    bad["feature_views"][0]["features"][0]["dtype"] = 7.into();
    let err = Definitions::from_json(&bad.to_string()).unwrap_err().to_string();
    assert!(err.starts_with("feature view `activity`, feature `amount`: "), "{err}");
    let mut bad = good.clone();
    bad["entities"][0]["join_keys"] = "user_id".into();
    let err = Definitions::from_json(&bad.to_string()).unwrap_err().to_string();
    assert!(err.starts_with("entity `user`: "), "{err}");
    assert!(!err.contains(" at line "), "{err}");
}

#[test]
fn monitoring_thresholds_read_from_features_views_and_services() {
    use quiver_sdk::FeatureRef;
    use quiver_sdk::monitoring::{Limits, Thresholds};
    let yaml = r#"
entities:
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
feature_views:
  - name: stats
    entities: [driver]
    monitoring: {psi: 0.3}
    features:
      - {name: a, dtype: float64, monitoring: {ks: 0.05, null_rate: 0.01}}
      - {name: b, dtype: string}
  - name: trips
    entities: [driver]
    features: [{name: fare, dtype: float64}]
    aggregations:
      - {name: fare_sum_1d, function: sum, column: fare, window: 1d, monitoring: {psi: 0.5}}
feature_services:
  - {name: ranker, features: ["stats:a", "stats:b", "trips:fare_sum_1d"], monitoring: {not_found_rate: 0.2, psi: 0.9}}
"#;
    let defs = parse_definitions(yaml).unwrap();
    let view = FeatureView::new("stats")
        .with_entity("driver")
        .with_feature("a", DType::Float64)
        .with_feature("b", DType::String)
        .with_monitoring(Thresholds { psi: Some(0.3), ..Default::default() })
        .with_feature_monitoring("a", Thresholds { ks: Some(0.05), null_rate: Some(0.01), ..Default::default() });
    assert_eq!(defs.feature_views[0], view);
    let ranker = defs.feature_service("ranker");
    let limits = |r: &str| defs.limits(ranker, &r.parse::<FeatureRef>().unwrap());
    assert_eq!(limits("stats:a"), Limits { psi: 0.3, ks: 0.05, null_rate: 0.01, not_found_rate: Some(0.2) });
    assert_eq!(limits("stats:b"), Limits { psi: 0.3, ks: 0.1, null_rate: 0.05, not_found_rate: Some(0.2) });
    assert_eq!(limits("trips:fare_sum_1d"), Limits { psi: 0.5, ks: 0.1, null_rate: 0.05, not_found_rate: Some(0.2) });

    // An event column is not served: thresholds on it are refused, as are unknown keys.
    let on_column =
        yaml.replace("features: [{name: fare, dtype: float64}]", "features: [{name: fare, dtype: float64, monitoring: {psi: 1}}]");
    assert_has(
        parse_definitions(&on_column).unwrap_err().to_string(),
        &["feature view `trips`: monitoring of unknown feature `fare` (served: fare_sum_1d)"],
    );
    let typo = yaml.replace("monitoring: {psi: 0.3}", "monitoring: {psl: 0.3}");
    assert_has(parse_definitions(&typo).unwrap_err().to_string(), &["unknown field `psl`"]);
}
