use std::collections::HashMap;

use quiver_runtime::encoding::{KeyValue, OnlineRow, Value, store_key};
use quiver_runtime::record::{AggRecord, Event, Layout};
use quiver_sdk::definitions::fingerprint;
use quiver_sdk::registry::Registered;
use quiver_sdk::{FeatureRef, yaml::parse_definitions};
use rand::{Rng, SeedableRng, rngs::StdRng};

use super::super::wire::response_json;
use super::super::{Evaluator, LookupPhases, LookupPlan, RequestFields, Status};
use super::AnswerAt;
use crate::WriteRow;
use crate::store::OnlineStore;

const DEFS: &str = r#"
entities:
  - {name: driver, join_keys: [{name: driver_id, dtype: int64}]}
  - {name: customer, join_keys: [{name: customer_id, dtype: string}]}
feature_views:
  - name: stats
    entities: [driver]
    ttl: 2h
    features:
      - {name: rate, dtype: float64}
      - {name: trips, dtype: int64}
      - {name: emb, dtype: list<float32>}
      - {name: label, dtype: string}
      - {name: flag, dtype: bool}
      - {name: seen, dtype: timestamp}
      - {name: tags, dtype: list<string>}
  - {name: pair, entities: [driver, customer], features: [{name: n, dtype: int32}, {name: w, dtype: float32}]}
  - name: rides
    entities: [driver]
    source: {timestamp_field: event_timestamp}
    features:
      - {name: fare, dtype: float64}
      - {name: city, dtype: string}
    aggregations:
      - {name: n_1h, function: count, column: fare, window: 1h}
      - {name: fare_sum_1h, function: sum, column: fare, window: 1h}
      - {name: cities, function: last_k, k: 2, column: city, window: 1d}
on_demand_views:
  - name: derived
    inputs: [stats, rides, pair]
    request: [{name: amount, dtype: float64}, {name: note, dtype: string}]
    features:
      - {name: scaled, dtype: float64, expr: "stats.rate * amount"}
      - {name: per_trip, dtype: float64, expr: "amount / stats.trips"}
      - {name: tag, dtype: string, expr: "concat(upper(note), stats.label)"}
      - {name: fares, dtype: float64, expr: "rides.fare_sum_1h + pair.w"}
      - {name: age, dtype: float64, expr: "date_part('epoch', request_time - stats.event_timestamp)"}
      - {name: inv, dtype: float64, expr: "1 / (amount - 1)"}
"#;
const NOW: i64 = 1_704_103_200_000_000;
const MINUTE: i64 = 60_000_000;

#[test]
fn the_epoch_is_what_write_rfc3339_writes() {
    let mut out = vec![b'"'];
    quiver_sdk::types::write_rfc3339(&mut out, 0);
    out.push(b'"');
    assert_eq!(out, super::EPOCH);
}

/// A store that is a map: what was written is what is read.
#[derive(Debug, Default)]
struct Map(std::sync::Mutex<HashMap<String, Vec<u8>>>);

#[async_trait::async_trait]
impl OnlineStore for Map {
    fn name(&self) -> String {
        "map".into()
    }
    async fn write(&self, rows: &[WriteRow]) -> crate::Result<usize> {
        let mut map = self.0.lock().unwrap();
        rows.iter().for_each(|r| drop(map.insert(r.key.clone(), r.row.clone())));
        Ok(rows.len())
    }
    async fn read(&self, keys: &[String]) -> crate::Result<Vec<Option<Vec<u8>>>> {
        let map = self.0.lock().unwrap();
        Ok(keys.iter().map(|k| map.get(k).cloned()).collect())
    }
}

fn text(rng: &mut StdRng) -> String {
    ["plain", "quote\" and \\", "line\nbreak", "caf\u{e9} \u{1f600}", "\u{1}", ""][rng.random_range(0..6)].to_string()
}

/// The direct answer against the columns' answer (`response_json` of
/// `LookupPlan::lookup`, the server's writer before it, itself tested against serde):
/// byte-identical over random rows of every kind of value — nulls, TTL-expired rows,
/// rows under an unknown layout, missing keys, aggregations, on-demand features
/// (with values that cannot be computed), NaN and infinities — for feature lists with views
/// interleaved, a feature asked twice, and 0 to 30 entity rows, each list answered
/// after others on the same thread (the reused buffers); on-demand features by the
/// row evaluator, and the same answer by DataFusion's (the reference).
#[tokio::test]
async fn the_direct_answer_is_the_columns_answer() {
    let defs = Registered::new(parse_definitions(DEFS).unwrap());
    let mut rng = StdRng::seed_from_u64(19);
    let store = Map::default();
    let (stats, pair, rides) =
        (defs.feature_view("stats").unwrap(), defs.feature_view("pair").unwrap(), defs.feature_view("rides").unwrap());
    let layout = Layout::of(rides);
    let mut rows = Vec::new();
    for d in 0..40i64 {
        // About one value in seven null.
        let nulls = |rng: &mut StdRng, mut values: Vec<Value>| {
            values.iter_mut().filter(|_| rng.random_bool(0.15)).for_each(|v| *v = Value::Null);
            values
        };
        if rng.random_bool(0.8) {
            // Now and then a NaN or an infinity: `"NaN"`, `"Infinity"`, `"-Infinity"` in
            // both answers, stored and computed from (`derived:scaled`).
            let rate = if rng.random_bool(0.2) {
                [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][rng.random_range(0..3)]
            } else {
                rng.random_range(-1e6..1e6)
            };
            let values = vec![
                Value::Float64(rate),
                Value::Int64(rng.random()),
                Value::ListFloat32(vec![rng.random(), f32::NAN, 1.0]),
                Value::String(text(&mut rng)),
                Value::Bool(rng.random()),
                Value::Timestamp(NOW - rng.random_range(0..1_000_000_000_000)),
                Value::ListString(vec![text(&mut rng), text(&mut rng)]),
            ];
            let values = nulls(&mut rng, values);
            // One in ten written under a layout the registry does not know: NOT_FOUND.
            let print = if rng.random_bool(0.1) { 7 } else { fingerprint(stats) };
            let event_ts = NOW - rng.random_range(0..180) * MINUTE;
            let row = OnlineRow { event_ts, created_ts: event_ts, fingerprint: print, values }.encode();
            rows.push(WriteRow { key: store_key("p", "stats", &[KeyValue::Int(d)]), row, expire_at_ms: None });
        }
        if rng.random_bool(0.5) {
            let values = vec![Value::Int32(rng.random()), Value::Float32(rng.random())];
            let values = nulls(&mut rng, values);
            let row = OnlineRow { event_ts: NOW, created_ts: NOW, fingerprint: fingerprint(pair), values }.encode();
            let key = store_key("p", "pair", &[KeyValue::Int(d), KeyValue::Str(format!("c{}", d % 3))]);
            rows.push(WriteRow { key, row, expire_at_ms: None });
        }
        if rng.random_bool(0.6) {
            let events: Vec<Event> = (0..rng.random_range(0..6))
                .map(|i| {
                    let fare = if rng.random_bool(0.15) { Value::Null } else { Value::Float64(rng.random_range(0.0..90.0)) };
                    Event { order: (NOW - rng.random_range(0..1_500) * MINUTE, 0, i), values: vec![fare, Value::String(text(&mut rng))] }
                })
                .collect();
            let row = AggRecord::build(&layout, &events, quiver_sdk::Timestamp(NOW), 1).encode(&layout);
            rows.push(WriteRow { key: store_key("p", "rides", &[KeyValue::Int(d)]), row, expire_at_ms: None });
        }
    }
    store.write(&rows).await.unwrap();
    let lists: [&[&str]; 7] = [
        &[
            "stats:rate",
            "pair:n",
            "rides:n_1h",
            "stats:label",
            "stats:emb",
            "rides:cities",
            "pair:w",
            "stats:flag",
            "stats:seen",
            "stats:tags",
            "stats:trips",
            "rides:fare_sum_1h",
        ],
        &["stats:rate"],
        &["stats:label", "pair:w", "stats:seen"],
        &["rides:cities", "rides:n_1h"],
        &[],
        &[
            "derived:tag",
            "stats:rate",
            "derived:scaled",
            "rides:n_1h",
            "derived:fares",
            "derived:per_trip",
            "derived:age",
            "pair:n",
            "derived:inv",
        ],
        &["derived:age", "derived:fares"],
    ];
    let mut compared = 0;
    let (mut computed, mut uncomputed_total, mut non_finite) = (0, 0, 0);
    for round in 0..3 {
        for (l, list) in lists.iter().enumerate() {
            let refs: Vec<FeatureRef> = list.iter().map(|f| f.parse().unwrap()).collect();
            let mut plan = LookupPlan::new(&defs, refs, (round + l) % 2 == 0).unwrap();
            // The row evaluator at every size (by default it stops at 8 rows).
            plan.set_evaluator(Evaluator::Row);
            let n = [0, 1, 7, 30][(round + l) % 4];
            let drivers: Vec<KeyValue> = (0..n).map(|_| KeyValue::Int(rng.random_range(0..45))).collect();
            let customers: Vec<KeyValue> = (0..n).map(|i| KeyValue::Str(format!("c{}", i % 4))).collect();
            let entities = vec![("customer_id".to_string(), customers), ("driver_id".to_string(), drivers)];
            // Request fields: amounts with zeros and nulls, notes with every kind of text.
            let amounts =
                (0..n).map(|_| if rng.random_bool(0.2) { Value::Null } else { Value::Float64(rng.random_range(-3..3) as f64) }).collect();
            let notes = (0..n).map(|_| Value::String(text(&mut rng))).collect();
            let fields: RequestFields = vec![("amount".to_string(), amounts), ("note".to_string(), notes)];
            let mut phases = LookupPhases::default();
            // The views' versions in the metadata in every other answer, both writers alike.
            let versions = (round + l) % 3 == 1;
            let direct =
                plan.answer_json(&store, "p", &defs, (&entities, &fields), AnswerAt { now: NOW, versions }, &mut phases).await.unwrap();
            let uncomputed = phases.uncomputed;
            uncomputed_total += uncomputed;
            let columns = plan.lookup(&store, "p", &defs, (&entities, &fields), NOW, &mut phases).await.unwrap();
            assert_eq!(phases.uncomputed, 2 * uncomputed, "list {l}: both paths count the same values uncomputed");
            let want = crate::lookup::wire::response_json_with(&columns, if versions { plan.versions_json() } else { &[] });
            let direct = String::from_utf8(direct).unwrap();
            non_finite += direct.matches(r#""NaN""#).count() + direct.matches(r#"Infinity""#).count();
            assert_eq!(direct, String::from_utf8(want).unwrap(), "list {l}, {n} rows");
            // The reference evaluator (DataFusion over the request's rows) answers the same.
            plan.set_evaluator(Evaluator::Vectorized);
            let mut reference = LookupPhases::default();
            let vectorized =
                plan.answer_json(&store, "p", &defs, (&entities, &fields), AnswerAt { now: NOW, versions }, &mut reference).await.unwrap();
            assert_eq!(direct, String::from_utf8(vectorized).unwrap(), "list {l}, {n} rows: the row evaluator against DataFusion");
            assert_eq!(reference.uncomputed, uncomputed, "list {l}: both evaluators count the same values uncomputed");
            plan.set_evaluator(Evaluator::Row);
            compared += columns.iter().map(|c| c.values.len()).sum::<usize>();
            computed += columns
                .iter()
                .filter(|c| c.name.contains("derived") || ["tag", "scaled", "fares", "per_trip", "age", "inv"].contains(&c.name.as_str()))
                .map(|c| c.statuses.iter().filter(|s| **s == Status::Present).count())
                .sum::<usize>();
        }
    }
    assert!(compared > 500, "{compared} values compared");
    assert!(computed > 50, "{computed} on-demand values computed");
    assert!(uncomputed_total > 0, "some amounts of 1 divide by zero");
    assert!(non_finite > 5, "{non_finite} NaN and infinities answered");
}

/// Records written before `apply` added an aggregation (and changed another) answer
/// the aggregations still defined the same way — what the record itself answers by
/// name — and NOT_FOUND for the new and the changed one; both answer paths agree.
/// Without the registry's earlier layouts, every aggregation is NOT_FOUND.
#[tokio::test]
async fn records_of_earlier_aggregations_answer_the_ones_they_hold() {
    use quiver_sdk::registry::RegistryDoc;
    let old_defs = parse_definitions(DEFS).unwrap();
    let changed = DEFS
            .replace(
                "      - {name: n_1h, function: count, column: fare, window: 1h}\n",
                "      - {name: fare_max_1d, function: max, column: fare, window: 1d}\n      - {name: n_1h, function: count, column: fare, window: 1h}\n",
            )
            .replace("{name: fare_sum_1h, function: sum, column: fare, window: 1h}", "{name: fare_sum_1h, function: sum, column: fare, window: 2h}");
    let new_defs = parse_definitions(&changed).unwrap();
    let now = chrono::Utc::now();
    let first = RegistryDoc::empty("p");
    let first = first.applied(&old_defs, &first.plan(&old_defs), now, false);
    let second = first.applied(&new_defs, &first.plan(&new_defs), now, false);
    let defs = second.registered();
    let old_view = old_defs.feature_view("rides").unwrap();
    let old_layout = Layout::of(old_view);
    let mut rng = StdRng::seed_from_u64(7);
    let store = Map::default();
    let mut expected = Vec::new();
    for d in 0..12i64 {
        let events: Vec<Event> = (0..rng.random_range(0..5))
            .map(|i| Event {
                order: (NOW - rng.random_range(0..1_500) * MINUTE, 0, i),
                values: vec![Value::Float64(rng.random_range(0.0..90.0)), Value::String(text(&mut rng))],
            })
            .collect();
        let record = AggRecord::build(&old_layout, &events, quiver_sdk::Timestamp(NOW), 1);
        // The old record's own answers, by name: n_1h, fare_sum_1h, cities.
        expected.push(record.answer(&old_layout, NOW));
        let row = record.encode(&old_layout);
        store.write(&[WriteRow { key: store_key("p", "rides", &[KeyValue::Int(d)]), row, expire_at_ms: None }]).await.unwrap();
    }
    let entities = vec![("driver_id".to_string(), (0..12).map(KeyValue::Int).collect::<Vec<_>>())];
    let refs: Vec<FeatureRef> =
        ["rides:cities", "rides:fare_max_1d", "rides:n_1h", "rides:fare_sum_1h"].iter().map(|f| f.parse().unwrap()).collect();
    let plan = LookupPlan::new(&defs, refs.clone(), false).unwrap();
    let mut phases = LookupPhases::default();
    let columns = plan.lookup(&store, "p", &defs, (&entities, &RequestFields::new()), NOW, &mut phases).await.unwrap();
    for (d, want) in expected.iter().enumerate() {
        let cell = |c: usize| (columns[c].values[d].clone(), columns[c].statuses[d]);
        let status = |v: &Value| if matches!(v, Value::Null) { Status::NullValue } else { Status::Present };
        assert_eq!(cell(1), (want[2].value.clone(), status(&want[2].value)), "driver {d}: cities");
        assert_eq!(cell(3), (want[0].value.clone(), status(&want[0].value)), "driver {d}: n_1h");
        assert_eq!(columns[3].event_ts[d], Some(want[0].latest_event.unwrap_or(0)), "driver {d}: n_1h's latest event");
        assert_eq!(cell(2), (Value::Null, Status::NotFound), "driver {d}: the new aggregation");
        assert_eq!(cell(4), (Value::Null, Status::NotFound), "driver {d}: a changed window is another aggregation");
    }
    let direct = plan
        .answer_json(&store, "p", &defs, (&entities, &RequestFields::new()), AnswerAt { now: NOW, versions: false }, &mut phases)
        .await
        .unwrap();
    assert_eq!(String::from_utf8(direct).unwrap(), String::from_utf8(response_json(&columns)).unwrap());
    // The registry's earlier layouts are what make the old records readable.
    let plan = LookupPlan::new(&new_defs, refs, false).unwrap();
    let blank = plan.lookup(&store, "p", &Registered::new(new_defs), (&entities, &RequestFields::new()), NOW, &mut phases).await.unwrap();
    assert!(blank[1..].iter().all(|c| c.statuses.iter().all(|s| *s == Status::NotFound)));
}
