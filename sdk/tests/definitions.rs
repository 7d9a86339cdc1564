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
