use super::*;

fn slot(reference: &Profile) -> Slot {
    let limits = Limits::DEFAULT;
    Slot {
        view: "v".into(),
        version: 1,
        feature: "f".into(),
        limits,
        reference_null_rate: reference.null_rate(),
        grid: Grid::of(reference),
    }
}

/// A live monitor of `v:f` (version 1) against `reference` over an hour's window.
fn live_of(reference: &Profile) -> Live {
    let mut slots: HashMap<String, HashMap<String, usize>> = HashMap::new();
    slots.entry("v".to_string()).or_default().insert("f".to_string(), 0);
    Live {
        reference_name: "training:t".into(),
        window_us: 3_600_000_000,
        bucket_us: 300_000_000,
        slots,
        features: vec![slot(reference)],
        buckets: Mutex::new(VecDeque::new()),
    }
}

#[test]
fn served_values_count_into_the_references_bins_and_give_exact_psi_and_ks() {
    // 1..=100: the sketch holds every value, so the deciles are 10, 20, ..., 90.
    let mut reference = Profile::default();
    (1..=100).for_each(|i| reference.add_value(&Value::Float64(f64::from(i))));
    let slot = slot(&reference);
    let Grid::Numbers { points, deciles, .. } = &slot.grid else { panic!("numbers") };
    assert_eq!(deciles.iter().map(|d| points[*d]).collect::<Vec<_>>(), (1..10).map(|d| f64::from(d * 10)).collect::<Vec<_>>());
    let mut t = Tally { bins: vec![0; slot.grid.bins()], ..Tally::default() };
    let served =
        [Value::Float64(10.0), Value::Float64(10.5), Value::Float64(95.0), Value::Float64(500.0), Value::Float64(f64::NAN), Value::Null];
    for v in &served {
        t.count += 1;
        match slot.grid.bin(v) {
            Some(b) => t.bins[b] += 1,
            None if matches!(v, Value::Null) => t.nulls += 1,
            None => {}
        }
    }
    // 10 is in the bin that ends at 10 (at or below an edge); 500 beyond every point.
    assert_eq!(t.bins[points.partition_point(|p| *p < 10.0)], 1);
    assert_eq!(*t.bins.last().unwrap(), 1);
    let stats = slot.stats(&t);
    // Decile shares of the 4 numbers: (.., 10] 1/4; (10, 20] 1/4; (90, ..) 2/4.
    let current = [0.25, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5];
    let expected = crate::monitor::profile::psi(&[0.1; 10], &current);
    assert!((stats.psi.unwrap() - expected).abs() < 1e-9, "{:?} vs {expected}", stats.psi);
    // KS at the reference's points (1, ..., 100): the largest gap is at 94, the last
    // point below 95: the reference 0.94, the served values 2/4.
    assert!((stats.ks.unwrap() - 0.44).abs() < 1e-9, "{:?}", stats.ks);
    assert!((stats.null_rate - 1.0 / 6.0).abs() < 1e-12);
    assert!(stats.breach);
}

#[test]
fn categories_count_into_the_references_top_values_and_other() {
    let mut reference = Profile::default();
    for (v, n) in [("a", 6), ("b", 4)] {
        (0..n).for_each(|_| reference.add_value(&Value::String(v.into())));
    }
    let slot = slot(&reference);
    let mut t = Tally { bins: vec![0; slot.grid.bins()], ..Tally::default() };
    for v in ["a", "a", "c", "b"] {
        t.count += 1;
        t.bins[slot.grid.bin(&Value::String(v.into())).unwrap()] += 1;
    }
    let stats = slot.stats(&t);
    let expected = crate::monitor::profile::psi(&[0.6, 0.4, 0.0], &[0.5, 0.25, 0.25]);
    assert!((stats.psi.unwrap() - expected).abs() < 1e-12);
    assert_eq!(stats.ks, None);
}

#[test]
fn cells_find_the_same_bin_as_a_full_search() {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    // Heavy-tailed points, with repeats, and values on and between them.
    let mut points: Vec<f64> = (0..410).map(|_| (next() * 12.0).exp().floor()).collect();
    points.sort_by(f64::total_cmp);
    points.dedup();
    let cells = Cells::of(&points);
    // On, just above and just below every cell's edge too.
    let edges: Vec<f64> = (0..=Cells::N).map(|c| cells.lo + c as f64 / cells.scale).flat_map(|e| [e, e.next_up(), e.next_down()]).collect();
    // And the extremes a float holds, whose distance from the points overflows.
    let extremes = [f64::MAX, f64::MIN, f64::MIN_POSITIVE, -f64::MIN_POSITIVE, 0.0, -0.0, 1e300, -1e300];
    let probes = points.iter().copied().chain(edges).chain(extremes).chain((0..100_000).map(|_| (next() * 13.0).exp() - 2.0));
    for v in probes {
        assert_eq!(cells.bin(&points, v), crate::monitor::profile::bin(&points, v), "{v}");
    }
    // Points packed far closer than a float's rounding at their size: one cell.
    let near: Vec<f64> = (0..300).map(|i| 1e15 + f64::from(i) * 0.125).collect();
    let cells = Cells::of(&near);
    for v in near.iter().copied().chain([1e15 - 1.0, 1e15 + 17.06, 1e15 + 100.0, f64::MAX, f64::MIN]) {
        assert_eq!(cells.bin(&near, v), crate::monitor::profile::bin(&near, v), "{v}");
    }
    let one = [5.0];
    let bins: Vec<usize> = [f64::MIN, 4.0, 5.0, 6.0, f64::MAX].into_iter().map(|v| Cells::of(&one).bin(&one, v)).collect();
    assert_eq!(bins, [0, 0, 0, 1, 1]);
    // The widest range a float has: its cells' scale is finite, differences overflow.
    let wide = [f64::MIN, 0.0, f64::MAX];
    let cells = Cells::of(&wide);
    for v in [f64::MIN, -1.0, 0.0, 1.0, f64::MAX] {
        assert_eq!(cells.bin(&wide, v), crate::monitor::profile::bin(&wide, v), "{v}");
    }
}

/// The same served answers, counted by the live window (its `/metrics` gauge) and
/// as `quiver monitor` reads them back from the serving log's JSON (`compare` over
/// a profile counting into the reference's bins): one PSI, to 1e-9, equal to PSI
/// written out here over the report's bins — values on the edges, past every edge,
/// NaN, the infinities and nulls among them, more values than the sketches hold.
#[test]
fn the_gauge_and_the_report_give_one_psi_for_the_same_served_values() {
    use quiver_online::lookup::Column;
    use quiver_sdk::{DType, Definitions, Entity, FeatureView, KeyType};
    let mut reference = Profile::default();
    (0..2000).for_each(|i| reference.add_value(&Value::Float64(f64::from((i * 7919) % 2000) / 7.0)));
    let edges = decile_edges(reference.numbers.as_ref().unwrap()).unwrap();
    let mut served: Vec<Value> = (0..3000).map(|i| Value::Float64(f64::from((i * 104_729) % 3000) / 9.0 + 40.0)).collect();
    served.extend(edges.iter().flat_map(|e| std::iter::repeat_n(Value::Float64(*e), 3)));
    served.extend([Value::Float64(f64::NAN), Value::Float64(f64::INFINITY), Value::Float64(f64::NEG_INFINITY), Value::Null]);
    let n = served.len();
    let statuses = served.iter().map(|v| if matches!(v, Value::Null) { Status::NotFound } else { Status::Present }).collect();
    let now = 1_767_225_600_000_000;
    let answer = Served {
        request_time: now,
        defs: std::sync::Arc::new(quiver_sdk::registry::Registered::new(
            Definitions::default()
                .with_entity(Entity::new("user").with_join_key("user_id", KeyType::Int64))
                .with_feature_view(FeatureView::new("v").with_entity("user").with_feature("f", DType::Float64)),
        )),
        refs: vec!["v:f".parse().unwrap()],
        n_keys: 1,
        fields: Vec::new(),
        columns: vec![
            Column {
                name: "user_id".into(),
                values: (0..n as i64).map(Value::Int64).collect(),
                statuses: vec![Status::Present; n],
                event_ts: vec![None; n],
            },
            Column { name: "f".into(), values: served.clone(), statuses, event_ts: vec![Some(now); n] },
        ],
    };

    // The gauge.
    let live = live_of(&reference);
    live.add(&answer);
    let mut out = Exposition::new();
    live.render(&mut out, now);
    let text = out.finish();
    let gauge = |name: &str| -> f64 {
        let prefix = format!("{name}{{view=\"v\",version=\"1\",feature=\"f\",reference=\"training:t\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {name} in {text}")).parse().unwrap()
    };

    // The report, from the values as the serving log holds them.
    let mut log = crate::serving_log::LogColumns::default();
    crate::serving_log::append_log_rows(&answer, "r-1", &mut log);
    assert_eq!(log.len(), n);
    let mut current = Profile::counting(std::sync::Arc::new(crate::monitor::profile::Binning::of(&reference).unwrap()));
    for r in 0..log.len() {
        let values: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&log.row(r).values).unwrap();
        current.add_json(&values["f"], DType::Float64).unwrap();
    }
    let report = super::super::compare("v:f", &reference, &current, Limits::DEFAULT, true);
    let bins = report.bins.clone().unwrap();
    assert_eq!(bins.edges, edges);
    assert_eq!(bins.current_error, None, "counted, not read off a sketch");

    // PSI written out: each finite value in the first bin whose edge is at or above it.
    let mut counts = vec![0u64; edges.len() + 1];
    for v in &served {
        let Value::Float64(x) = v else { continue };
        if !x.is_finite() {
            continue;
        }
        counts[edges.iter().position(|e| x <= e).unwrap_or(edges.len())] += 1;
    }
    let total: u64 = counts.iter().sum();
    assert_eq!(total as usize, n - 4);
    let mut direct = 0.0;
    for (r, k) in bins.reference.iter().zip(&counts) {
        let (r, c) = (r.max(1e-4), (*k as f64 / total as f64).max(1e-4));
        direct += (c - r) * (c / r).ln();
    }
    let (gauge_psi, report_psi) = (gauge("quiver_feature_psi"), report.psi.unwrap());
    assert!((gauge_psi - report_psi).abs() <= 1e-9, "gauge {gauge_psi} vs report {report_psi}");
    assert!((report_psi - direct).abs() <= 1e-9, "report {report_psi} vs direct {direct}");
    // NaN and the infinities: values, not nulls, counted apart on both sides.
    assert_eq!(gauge("quiver_feature_null_rate"), 1.0 / n as f64);
    assert_eq!(report.null_rate.current, Some(1.0 / n as f64));
    assert_eq!(gauge("quiver_feature_non_finite_rate"), 3.0 / n as f64);
    assert_eq!(report.non_finite_rate.and_then(|r| r.current), Some(3.0 / n as f64));
}

/// A slot counts the answers that read the version its reference read: `v@2:f` and a
/// plain `v:f` once version 2 is the latest are another feature (docs/versions.md).
#[test]
fn answers_reading_another_version_are_not_counted_against_the_reference() {
    use quiver_online::lookup::Column;
    use quiver_sdk::{DType, Definitions, Entity, FeatureView, KeyType};
    let mut reference = Profile::default();
    (0..100).for_each(|i| reference.add_value(&Value::Float64(f64::from(i))));
    let view = |version: u32| {
        let mut v = FeatureView::new("v").with_entity("user").with_feature("f", DType::Float64);
        v.version = version;
        v
    };
    let mut defs =
        Definitions::default().with_entity(Entity::new("user").with_join_key("user_id", KeyType::Int64)).with_feature_view(view(2));
    defs.earlier_versions.feature_views.push(view(1));
    let defs = std::sync::Arc::new(quiver_sdk::registry::Registered::new(defs));
    let now = 1_767_225_600_000_000;
    let answer = |reference: &str| Served {
        request_time: now,
        defs: defs.clone(),
        refs: vec![reference.parse().unwrap()],
        n_keys: 1,
        fields: Vec::new(),
        columns: vec![
            Column { name: "user_id".into(), values: vec![Value::Int64(1)], statuses: vec![Status::Present], event_ts: vec![None] },
            Column { name: "f".into(), values: vec![Value::Float64(5.0)], statuses: vec![Status::Present], event_ts: vec![Some(now)] },
        ],
    };
    let live = live_of(&reference);
    for reference in ["v@2:f", "v:f", "v@1:f", "v@1:f"] {
        live.add(&answer(reference));
    }
    let buckets = live.buckets.lock().unwrap();
    assert_eq!(buckets.iter().map(|(_, t)| t[0].count).sum::<u64>(), 2, "only the two answers of version 1");
}
