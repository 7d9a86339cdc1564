use super::doc::NumbersDoc;
use super::*;

fn numbers(values: impl IntoIterator<Item = f64>) -> Numbers {
    let mut n = Numbers::default();
    values.into_iter().for_each(|x| n.add(x));
    n
}

/// Exact shares of `values` in the bins `edges` make (value <= edge: that bin).
fn direct_shares(values: &[f64], edges: &[f64]) -> Vec<f64> {
    let mut counts = vec![0usize; edges.len() + 1];
    for v in values {
        counts[edges.iter().position(|e| v <= e).unwrap_or(edges.len())] += 1;
    }
    counts.iter().map(|&c| c as f64 / values.len() as f64).collect()
}

#[test]
fn moments_merge_as_if_computed_at_once() {
    let all: Vec<f64> = (0..150).map(|i| ((i * 37) % 101) as f64 * 0.25 - 3.0).collect();
    let whole = numbers(all.clone());
    let mut parts = numbers(all[..40].iter().copied());
    parts.merge(&numbers(all[40..].iter().copied()));
    let mean = all.iter().sum::<f64>() / all.len() as f64;
    let var = all.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (all.len() - 1) as f64;
    for p in [&whole, &parts] {
        assert_eq!((p.n, p.min, p.max), (150, -3.0, 22.0));
        assert!((p.mean - mean).abs() < 1e-12);
        assert!((p.stddev().unwrap() - var.sqrt()).abs() < 1e-12);
    }
    assert_eq!(numbers([f64::NAN, 1.0]).nan, 1);
}

/// Below the sketch's capacity the ranks are exact: PSI from profiles equals PSI
/// computed directly from the rows over the same bins, to 1e-12.
#[test]
fn psi_from_profiles_equals_the_direct_computation_given_the_bins() {
    let reference: Vec<f64> = (0..150).map(|i| (i as f64 * 0.7).sin() * 10.0).collect();
    let current: Vec<f64> = (0..150).map(|i| (i as f64 * 0.7).sin() * 10.0 + 1.5).collect();
    let (r, c) = (numbers(reference.clone()), numbers(current.clone()));
    let edges = decile_edges(&r).unwrap();
    let direct = psi(&direct_shares(&reference, &edges), &direct_shares(&current, &edges));
    let got = Bins::deciles(&r, &c).unwrap().psi();
    assert!((got - direct).abs() < 1e-12, "{got} vs {direct}");
    assert!(got > 0.2, "a shift of 1.5 on a spread of 20 drifts: {got}");
    assert!(Bins::deciles(&r, &r).unwrap().psi().abs() < 1e-12);
    // Exact KS: the largest gap of the empirical distributions.
    let ks_direct = reference
        .iter()
        .chain(&current)
        .map(|x| {
            let f = |v: &[f64]| v.iter().filter(|y| *y <= x).count() as f64 / v.len() as f64;
            (f(&reference) - f(&current)).abs()
        })
        .fold(0.0, f64::max);
    assert!((ks(&r, &c).unwrap() - ks_direct).abs() < 1e-12);
}

/// Past its capacity the sketch answers ranks within its error on adversarial
/// orders: sorted, reversed, many duplicates, heavy tails.
#[test]
fn the_sketchs_rank_error_stays_under_one_percent() {
    let n = 200_000usize;
    let inputs: Vec<(&str, Vec<f64>)> = vec![
        ("sorted", (0..n).map(|i| i as f64).collect()),
        ("reversed", (0..n).rev().map(|i| i as f64).collect()),
        ("duplicates", (0..n).map(|i| (i % 7) as f64).collect()),
        ("heavy tail", (1..=n).map(|i| 1.0 / ((i * 7919 % n) as f64 / n as f64 + 1e-6).powi(2)).collect()),
    ];
    for (name, values) in inputs {
        let p = numbers(values.clone());
        let mut sorted = values.clone();
        sorted.sort_by(f64::total_cmp);
        let mut worst: f64 = 0.0;
        for q in 1..100 {
            let x = sorted[q * n / 100];
            let exact = sorted.partition_point(|v| *v <= x) as f64 / n as f64;
            worst = worst.max((p.cdf(x).unwrap() - exact).abs());
        }
        assert!(worst <= 0.01, "{name}: rank error {worst}");
    }
}

/// A profile of Arrow columns of every kind, merged from two halves, written as JSON
/// and read back, answers as the one profile of the whole column.
#[test]
fn profiles_of_columns_merge_and_read_back() {
    use arrow::array::{BooleanArray, Float64Array, ListArray, StringArray};
    let floats = Float64Array::from((0..1000).map(|i| (i % 9 != 0).then_some(i as f64 / 3.0)).collect::<Vec<_>>());
    let strings = StringArray::from((0..1000).map(|i| (i % 5 != 0).then(|| ["x", "y", "z"][i % 3])).collect::<Vec<_>>());
    let bools = BooleanArray::from((0..1000).map(|i| Some(i % 4 == 0)).collect::<Vec<_>>());
    let lists = ListArray::from_iter_primitive::<Float32Type, _, _>((0..1000).map(|i| Some(vec![Some(1.0f32); i % 6])));
    let columns: [(&dyn Array, DType); 4] = [
        (&floats, DType::Float64),
        (&strings, DType::String),
        (&bools, DType::Bool),
        (&lists, DType::List(quiver_sdk::types::ListElement::Float32)),
    ];
    for (array, dtype) in columns {
        let mut whole = Profile::default();
        whole.add_array(array, dtype);
        let (mut left, mut right) = (Profile::default(), Profile::default());
        left.add_array(&array.slice(0, 300), dtype);
        right.add_array(&array.slice(300, 700), dtype);
        left.merge(&right);
        let doc = ProfileDoc::from(&left);
        let text = serde_json::to_string(&doc).unwrap();
        let back = Profile::try_from(&serde_json::from_str::<ProfileDoc>(&text).unwrap()).unwrap();
        assert_eq!(ProfileDoc::from(&back), doc, "{dtype}: reads back as written");
        assert_eq!((back.count, back.nulls), (whole.count, whole.nulls), "{dtype}");
        let plain = |p: &Profile| {
            let d = ProfileDoc::from(p);
            let moments = |n: &Option<NumbersDoc>| n.as_ref().map(|n| (n.n, n.min, n.max, (n.mean * 1e9).round()));
            (moments(&d.numbers), d.categories.map(|c| (c.total, c.top)), moments(&d.lengths))
        };
        assert_eq!(plain(&back), plain(&whole), "{dtype}");
    }
    assert_eq!(
        Profile::try_from(&ProfileDoc {
            numbers: Some(NumbersDoc {
                n: 1,
                min: None,
                max: None,
                mean: 0.0,
                stddev: None,
                m2: 0.0,
                nan: 0,
                infinite: 0,
                kll: "0g".into()
            }),
            ..ProfileDoc::from(&Profile::default())
        })
        .unwrap_err(),
        "a sketch's hex has `0g`"
    );
}

#[test]
fn categories_count_their_most_frequent_values_and_psi_sees_a_mix_change() {
    let mut r = Categories::default();
    let mut c = Categories::default();
    for i in 0..1000 {
        r.add(["a", "b", "c", "d"][i % 4]);
        c.add(if i % 10 < 7 { "a" } else { ["b", "c", "d"][i % 3] });
    }
    assert_eq!(r.top()[..2], [("a".to_string(), 250), ("b".to_string(), 250)]);
    let direct = psi(&[0.25, 0.25, 0.25, 0.25, 0.0], &[0.7, 0.1, 0.1, 0.1, 0.0]);
    let profile = |c: &Categories| Profile { categories: Some(c.clone()), ..Profile::default() };
    let got = CategoryShares::of(&r, &profile(&c)).unwrap().psi();
    assert!((got - direct).abs() < 1e-2, "{got} vs {direct}");
    assert!(got > 0.2);
    assert!(CategoryShares::of(&r, &profile(&r)).unwrap().psi().abs() < 1e-12);
    let mut merged = r.clone();
    merged.merge(&c);
    assert_eq!(merged.total(), 2000);
}

#[test]
fn nan_and_infinities_are_values_counted_apart_and_the_json_reads_back() {
    let column =
        arrow::array::Float64Array::from(vec![Some(1.0), Some(f64::NAN), Some(f64::INFINITY), None, Some(3.0), Some(f64::NEG_INFINITY)]);
    let mut p = Profile::default();
    p.add_array(&column, DType::Float64);
    // One null (the missing value); NaN and the infinities are values, out of the moments.
    assert_eq!((p.count, p.nulls), (6, 1));
    let n = p.numbers.as_ref().unwrap();
    assert_eq!((n.n, n.min, n.max, n.mean, n.nan, n.infinite), (2, 1.0, 3.0, 2.0, 1, 2));
    assert_eq!(p.non_finite_rate(), Some(0.5));
    // Served values alike, and as the serving log holds them in JSON.
    let mut served = Profile::default();
    for v in [1.0, f64::NAN, f64::INFINITY, 3.0, f64::NEG_INFINITY] {
        served.add_value(&quiver_runtime::encoding::Value::Float64(v));
    }
    served.add_value(&quiver_runtime::encoding::Value::Null);
    let mut logged = Profile::default();
    for text in ["1.0", r#""NaN""#, r#""Infinity""#, "3.0", r#""-Infinity""#, "null"] {
        logged.add_json(&serde_json::from_str(text).unwrap(), DType::Float32).unwrap();
    }
    for q in [&served, &logged] {
        let n = q.numbers.as_ref().unwrap();
        assert_eq!((q.count, q.nulls, n.n, n.nan, n.infinite), (6, 1, 2, 1, 2));
    }
    // Other text is not a float; the non-finite text is not an integer.
    assert!(logged.add_json(&serde_json::json!("nan"), DType::Float64).is_err());
    assert!(logged.add_json(&serde_json::json!("NaN"), DType::Int64).is_err());
    assert_eq!(logged.count, 6, "a refused value is not counted");
    // Counted apart, the counts read back.
    let back =
        Profile::try_from(&serde_json::from_str::<ProfileDoc>(&serde_json::to_string(&ProfileDoc::from(&p)).unwrap()).unwrap()).unwrap();
    assert_eq!(back.numbers.as_ref().map(|n| (n.nan, n.infinite)), Some((1, 2)));
    // Moments that overflowed are written as null and read back.
    let mut huge = Profile::default();
    huge.add_value(&quiver_runtime::encoding::Value::Float64(1e300));
    huge.add_value(&quiver_runtime::encoding::Value::Float64(-1e300));
    let text = serde_json::to_string(&ProfileDoc::from(&huge)).unwrap();
    let back: ProfileDoc = serde_json::from_str(&text).unwrap();
    assert_eq!(Profile::try_from(&back).unwrap().count, 2);
    // A damaged sketch is an error, never a panic (even split inside a character).
    let mut bad = back.clone();
    bad.numbers.as_mut().unwrap().kll = "a\u{e9}0".into();
    assert!(Profile::try_from(&bad).is_err());
}

/// A current window counted into the reference's bins: each bin's count equals a plain
/// loop over the values and the edges, whatever the window's size (its sketch is past
/// exact here), merged halves count as the whole, and PSI over the counted shares
/// equals PSI computed directly to 1e-12. NaN, the infinities and nulls fall in no bin.
#[test]
fn a_window_counted_into_the_references_bins_equals_a_direct_count() {
    let reference: Vec<f64> = (0..5000).map(|i| ((i * 7919) % 5000) as f64 / 50.0).collect();
    let current: Vec<f64> = (0..9000).map(|i| ((i * 104_729) % 9000) as f64 / 60.0 + 20.0).collect();
    let mut r = Profile::default();
    reference.iter().for_each(|x| r.add_value(&quiver_runtime::encoding::Value::Float64(*x)));
    let binning = std::sync::Arc::new(Binning::of(&r).unwrap());
    let Binning::Numbers(edges) = &*binning else { panic!("{binning:?}") };
    let edges = edges.clone();
    let mut whole = Profile::counting(binning.clone());
    let (mut left, mut right) = (Profile::counting(binning.clone()), Profile::counting(binning.clone()));
    let odd = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY];
    let column = |values: &[f64]| arrow::array::Float64Array::from_iter(values.iter().copied().chain(odd).map(Some).chain([None]));
    whole.add_array(&column(&current), DType::Float64);
    left.add_array(&column(&current[..4000]), DType::Float64);
    right.add_array(&column(&current[4000..]), DType::Float64);
    left.merge(&right);
    // The direct count, written out: the first edge at or above the value, else the last bin.
    let mut direct = vec![0u64; edges.len() + 1];
    for x in &current {
        let mut k = edges.len();
        for (i, e) in edges.iter().enumerate() {
            if x <= e {
                k = i;
                break;
            }
        }
        direct[k] += 1;
    }
    for p in [&whole, &left] {
        assert_eq!(p.counted.as_ref().unwrap().counts, direct);
        assert!(p.numbers.as_ref().unwrap().share_error() > 0.0, "past the sketch's exact range");
    }
    let bins = Bins::counted(r.numbers.as_ref().unwrap(), whole.counted.as_ref().unwrap()).unwrap();
    assert_eq!(bins.current_error, None, "counted: exact");
    let shares: Vec<f64> = direct.iter().map(|&k| k as f64 / current.len() as f64).collect();
    let floor = |x: f64| x.max(1e-4);
    let by_hand: f64 = bins.reference.iter().zip(&shares).map(|(r, c)| (floor(*c) - floor(*r)) * (floor(*c) / floor(*r)).ln()).sum();
    assert!((bins.psi() - by_hand).abs() < 1e-12, "{} vs {by_hand}", bins.psi());
    // Read off the sketch instead, the report says how far a share may be off.
    let sketched = Bins::deciles(r.numbers.as_ref().unwrap(), whole.numbers.as_ref().unwrap()).unwrap();
    let error = sketched.current_error.unwrap();
    assert!(error > 0.01 && error < 0.02, "{error}");
    for (a, b) in sketched.current.iter().zip(&shares) {
        assert!((a - b).abs() <= error, "{a} vs {b}");
    }
    // Categories: the reference's top values and "other", counted from JSON as logged.
    let mut cats = Profile::default();
    for v in ["a", "a", "b"] {
        cats.add_value(&quiver_runtime::encoding::Value::String(v.into()));
    }
    let mut c = Profile::counting(std::sync::Arc::new(Binning::of(&cats).unwrap()));
    for v in [r#""b""#, r#""z""#, r#""a""#, "null", r#""y""#] {
        c.add_json(&serde_json::from_str(v).unwrap(), DType::String).unwrap();
    }
    assert_eq!(c.counted.unwrap().counts, [1, 1, 2]);
}
