//! The record's encoding against its in-memory answer.

use super::*;
use quiver_sdk::aggregation::AggFunction;
use quiver_sdk::{DType, FeatureView, Timestamp, Ttl};

fn view() -> FeatureView {
    let mut v = FeatureView::new("rides").with_entity("rider").with_feature("fare", DType::Float64).with_feature("city", DType::String);
    v.aggregations = vec![
        Aggregation::new("fare_sum", AggFunction::Sum, "fare", Ttl::from_secs(3600)),
        Aggregation::new("cities", AggFunction::LastK, "city", Ttl::from_secs(7 * 86_400)).with_k(2),
        Aggregation::new("n", AggFunction::Count, "fare", Ttl::from_secs(1800)).with_hop(Ttl::from_secs(600)),
    ];
    // Aggregations sharing cells with those above: the sums of fare, the latest
    // cities (a shorter k), and an extreme beside them.
    let (h1, h2) = (v.aggregations[0].hop(), v.aggregations[1].hop());
    v.aggregations.extend([
        Aggregation::new("fare_avg", AggFunction::Avg, "fare", Ttl::from_secs(7200)).with_hop(h1),
        Aggregation::new("fare_std", AggFunction::Stddev, "fare", Ttl::from_secs(3600)).with_hop(h1),
        Aggregation::new("n_h", AggFunction::Count, "fare", Ttl::from_secs(3 * 3600)).with_hop(h1),
        Aggregation::new("last_city", AggFunction::Last, "city", Ttl::from_secs(3600)).with_hop(h2),
        Aggregation::new("fare_max", AggFunction::Max, "fare", Ttl::from_secs(86_400)).with_hop(h1),
    ]);
    v
}

#[test]
fn aggregations_reading_a_column_alike_share_a_cell() {
    let v = view();
    let layout = Layout::of(&v);
    let cell = |name: &str| layout.cells[v.aggregations.iter().position(|a| a.name == name).unwrap()];
    assert_eq!(cell("fare_sum"), cell("fare_avg"));
    assert_eq!(cell("fare_sum"), cell("fare_std"));
    assert_eq!(cell("fare_sum"), cell("n_h"));
    assert_eq!(cell("cities"), cell("last_city"));
    assert_ne!(cell("fare_max"), cell("fare_sum"));
    let (s, c) = cell("fare_sum");
    assert!(matches!(layout.series[s].1[c].1, CellKind::Sums { numeric: true, integer: false, squares: true }));
    let (s, c) = cell("cities");
    assert_eq!(layout.series[s].1[c].1, CellKind::Latest { k: 2 });
}

/// Equal answers, floats to 1e-12 relative (a stored sum is rounded once).
fn assert_close(got: &[WindowAnswer], want: &[WindowAnswer], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let what = &format!("{what}, aggregation {k}");
        match (&g.value, &w.value) {
            (Value::Float64(a), Value::Float64(b)) => {
                assert!(a == b || (a - b).abs() <= 1e-12 * b.abs().max(1e-300) || (a.is_nan() && b.is_nan()), "{what}: {a} vs {b}")
            }
            // Lists and the rest exactly (NaN equal to NaN: compared as written).
            _ => assert_eq!(format!("{:?}", g.value), format!("{:?}", w.value), "{what}"),
        }
        assert_eq!(g.latest_event, w.latest_event, "{what}: the latest event's time");
    }
}

#[test]
fn records_round_trip_and_answer_like_a_scan() {
    let v = view();
    let layout = Layout::of(&v);
    let m = 60_000_000i64;
    let events: Vec<Event> = (0..50)
        .map(|i| Event {
            order: (i * 7 * m, 0, i),
            values: vec![if i % 4 == 0 { Value::Null } else { Value::Float64(i as f64 / 2.0) }, Value::String(format!("c{}", i % 3))],
        })
        .collect();
    let now = 200 * m;
    let record = AggRecord::build(&layout, &events, Timestamp(now), 3);
    assert!(!record.pending.is_empty(), "events after now stay pending");
    let bytes = record.encode(&layout);
    for at in [now, now + 3 * m, now + 61 * m, now + 3 * 86_400 * m / 1440, now + 8 * 86_400 * 1_000_000] {
        let answer = record.answer(&layout, at);
        assert_close(&AggRecord::answer_stored(&layout, &bytes, at).unwrap(), &answer, &format!("the stored answer at {at}"));
        assert_close(&AggRecord::answer_from_tiles(&layout, &bytes, at).unwrap(), &answer, &format!("the tiles' answer at {at}"));
        for (i, agg) in v.aggregations.iter().enumerate() {
            let mut p = Partial::default();
            let mut last = None;
            for e in events.iter().filter(|e| e.order.0 >= agg.tail(at) && e.order.0 <= at) {
                p.push(agg, e.order, &e.values[layout.columns[i].0]);
                last = last.max(Some(e.order.0));
            }
            assert_eq!(answer[i].value, p.finish(agg, layout.columns[i].1), "{} at {at}", agg.name);
            assert_eq!(answer[i].latest_event, last, "{} at {at}: the latest event's time", agg.name);
        }
    }
    // Before the writer's clock: answered as of the clock, by both.
    let early = now - 90 * m;
    assert_close(&AggRecord::answer_stored(&layout, &bytes, early).unwrap(), &record.answer(&layout, now), "a lookup before the clock");
    assert_eq!(record.answer(&layout, early), record.answer(&layout, now));
    for cut in [0, 10, 17, bytes.len() / 2, bytes.len() - 1] {
        assert!(AggRecord::answer_stored(&layout, &bytes[..cut], now).is_err(), "truncated at {cut}");
        assert!(AggRecord::answer_from_tiles(&layout, &bytes[..cut], now).is_err(), "truncated at {cut}");
    }
}

#[test]
fn overflowing_sums_and_negative_integers_survive_the_compact_cells() {
    let mut v = FeatureView::new("t").with_entity("e").with_feature("x", DType::Float64).with_feature("i", DType::Int64);
    let w = Ttl::from_secs(3600);
    v.aggregations = vec![
        Aggregation::new("x_sum", AggFunction::Sum, "x", w),
        Aggregation::new("x_std", AggFunction::Stddev, "x", w),
        Aggregation::new("i_sum", AggFunction::Sum, "i", w),
        Aggregation::new("i_avg", AggFunction::Avg, "i", w),
        Aggregation::new("i_min", AggFunction::Min, "i", w),
    ];
    let layout = Layout::of(&v);
    let m = 60_000_000i64;
    for big in [1e308, 3.5] {
        // (1e308: the sums overflow, and the record keeps them as they are.)
        let events: Vec<Event> = (0..20)
            .map(|j| Event {
                order: (j * 3 * m, 0, j),
                values: vec![Value::Float64(big * (j % 3) as f64), Value::Int64(-(1 << 60) + j * 977)],
            })
            .collect();
        let record = AggRecord::build(&layout, &events, Timestamp(61 * m), 1);
        let bytes = record.encode(&layout);
        for at in [61 * m, 70 * m, 100 * m] {
            let want = record.answer(&layout, at);
            if big > 1e300 {
                assert_eq!(want[0].value, Value::Float64(f64::INFINITY), "the fare sum overflows");
            }
            assert!(matches!(want[4].value, Value::Int64(x) if x < -(1 << 59)), "{:?}", want[4]);
            assert_close(&AggRecord::answer_stored(&layout, &bytes, at).unwrap(), &want, &format!("{big} at {at}"));
            assert_close(&AggRecord::answer_from_tiles(&layout, &bytes, at).unwrap(), &want, &format!("{big} at {at}, tiles"));
        }
    }
}

#[test]
fn stored_answers_equal_the_records_on_awkward_numbers() {
    // Every function over a float and an integer column whose values are short
    // decimals, arbitrary bits (NaN, infinities, -0.0, subnormals), ties and int64
    // extremes; events on tile edges, several to a tile, nulls, pending ones.
    let mut v = FeatureView::new("t").with_entity("e").with_feature("x", DType::Float64).with_feature("i", DType::Int64);
    let (w1, w2, h) = (Ttl::from_secs(3600), Ttl::from_secs(6 * 3600), Ttl::from_secs(600));
    for (col, tag) in [("x", "x"), ("i", "i")] {
        for (f, w) in [
            (AggFunction::Count, w1),
            (AggFunction::Sum, w1),
            (AggFunction::Sum, w2),
            (AggFunction::Avg, w2),
            (AggFunction::Stddev, w1),
            (AggFunction::Stddev, w2),
            (AggFunction::Min, w1),
            (AggFunction::Min, w2),
            (AggFunction::Max, w2),
            (AggFunction::Last, w1),
            (AggFunction::LastK, w2),
        ] {
            let name = format!("{tag}_{f:?}_{}", w.secs());
            v.aggregations.push(Aggregation::new(name, f, col, w).with_hop(h).with_k(4));
        }
    }
    let layout = Layout::of(&v);
    let m = 60_000_000i64;
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..300 {
        let count = (next() % 40) as i64;
        let events: Vec<Event> = (0..count)
            .map(|j| {
                let r = next();
                let x = match r % 7 {
                    0 => Value::Null,
                    1 => Value::Float64(f64::from_bits(next())),
                    2 => Value::Float64([-0.0, 0.0, 0.1 + 0.2, 1e300, -1e300, 5e-324][(next() % 6) as usize]),
                    _ => Value::Float64((next() % 20_000) as f64 / 100.0 - 50.0),
                };
                let i = match r % 5 {
                    0 => Value::Null,
                    1 => Value::Int64([i64::MIN, i64::MAX, -1, 1 << 60][(next() % 4) as usize]),
                    _ => Value::Int64((next() % 200) as i64 - 100),
                };
                // Minutes over seven hours, often on a tile's edge (every 10 minutes).
                let at = if r % 3 == 0 { (next() % 42) as i64 * 10 * m } else { (next() % 420) as i64 * m };
                Event { order: (at, 0, j), values: vec![x, i] }
            })
            .collect();
        let clock = (next() % 480) as i64 * m;
        let record = AggRecord::build(&layout, &events, Timestamp(clock), 1);
        let bytes = record.encode(&layout);
        // Either side of the time the stored answer holds until, too.
        let until = record.answer_holds_until(&layout);
        assert!(until > clock, "round {round}: the stored answer holds at its clock");
        let edges = if until < clock + 8 * 60 * m { vec![until - 1, until] } else { vec![] };
        for at in [clock, clock + 9 * m, clock + 10 * m, clock + 95 * m, clock + 7 * 60 * m].into_iter().chain(edges) {
            let want = record.answer(&layout, at);
            let got = AggRecord::answer_stored(&layout, &bytes, at).unwrap();
            assert_close(&got, &want, &format!("round {round} at {at}"));
            assert_close(&AggRecord::answer_from_tiles(&layout, &bytes, at).unwrap(), &want, &format!("round {round} at {at}, tiles"));
            if at < until {
                // The stored answer is the record's at its clock, bit for bit.
                assert_eq!(format!("{got:?}"), format!("{:?}", record.answer(&layout, clock)), "round {round} at {at}");
            }
        }
    }
}

#[test]
fn the_stored_answer_holds_until_an_event_enters_or_leaves_a_window() {
    // Naively, minute by minute (every hop, event and clock here is a whole minute):
    // which events each window holds by the window rule of docs/aggregations.md, against the windows at the clock.
    // The first minute any differs is the time the record names, and the answer is the
    // same until then.
    let v = view();
    let layout = Layout::of(&v);
    let m = 60_000_000i64;
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut changes = 0;
    for round in 0..200 {
        let events: Vec<Event> = (0..(next() % 12) as i64)
            .map(|j| Event {
                order: ((next() % 600) as i64 * m, 0, j),
                values: vec![Value::Float64(j as f64), Value::String(format!("c{j}"))],
            })
            .collect();
        let clock = (next() % 600) as i64 * m;
        let record = AggRecord::build(&layout, &events, Timestamp(clock), 1);
        let held = |t: i64| -> Vec<Vec<i64>> {
            let windows = v.aggregations.iter().map(|a| ((t - a.window_us()).div_euclid(a.hop_us()) * a.hop_us(), t));
            windows.map(|(tail, head)| events.iter().map(|e| e.order.0).filter(|&ts| tail <= ts && ts <= head).collect()).collect()
        };
        let at_clock = held(clock);
        let horizon = clock + 8 * 86_400 / 60 * m;
        let first_change = (clock..horizon).step_by(m as usize).find(|&t| held(t) != at_clock).unwrap_or(i64::MAX);
        let until = record.answer_holds_until(&layout);
        assert_eq!(until.min(horizon), first_change.min(horizon), "round {round}");
        changes += usize::from(first_change < horizon);
        let answer = format!("{:?}", record.answer(&layout, clock));
        for t in [clock + m, (clock + until.min(horizon)) / 2, until.min(horizon) - 1].into_iter().filter(|&t| t < until) {
            assert_eq!(format!("{:?}", record.answer(&layout, t)), answer, "round {round} at {t}");
        }
    }
    assert!(changes > 100, "most rounds have a change to find ({changes} of 200)");
}

#[test]
fn a_record_of_another_layout_is_refused() {
    let v = view();
    let record = AggRecord::build(&Layout::of(&v), &[], Timestamp(0), 1).encode(&Layout::of(&v));
    let mut changed = v.clone();
    changed.aggregations[0].window = Ttl::from_secs(7200);
    assert!(AggRecord::answer_stored(&Layout::of(&changed), &record, 0).is_err());
}
