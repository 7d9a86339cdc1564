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
    let got = psi_numbers(&r, &c).unwrap();
    assert!((got - direct).abs() < 1e-12, "{got} vs {direct}");
    assert!(got > 0.2, "a shift of 1.5 on a spread of 20 drifts: {got}");
    assert!(psi_numbers(&r, &r).unwrap().abs() < 1e-12);
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
        (&lists, DType::List(crate::types::ListElement::Float32)),
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
            numbers: Some(NumbersDoc { n: 1, min: None, max: None, mean: 0.0, stddev: None, m2: 0.0, nan: 0, kll: "0g".into() }),
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
    let got = psi_categories(&r, &c).unwrap();
    assert!((got - direct).abs() < 1e-2, "{got} vs {direct}");
    assert!(got > 0.2);
    assert!(psi_categories(&r, &r).unwrap().abs() < 1e-12);
    let mut merged = r.clone();
    merged.merge(&c);
    assert_eq!(merged.total(), 2000);
}

#[test]
fn nan_and_infinities_count_as_nulls_as_the_server_serves_them_and_the_json_reads_back() {
    let column = arrow::array::Float64Array::from(vec![Some(1.0), Some(f64::NAN), Some(f64::INFINITY), None, Some(3.0)]);
    let mut p = Profile::default();
    p.add_array(&column, DType::Float64);
    assert_eq!((p.count, p.nulls), (5, 3));
    let n = p.numbers.as_ref().unwrap();
    assert_eq!((n.n, n.min, n.max, n.mean), (2, 1.0, 3.0, 2.0));
    let mut served = Profile::default();
    for v in [1.0, f64::NAN, f64::INFINITY, 3.0] {
        served.add_value(&crate::encoding::Value::Float64(v));
    }
    served.add_value(&crate::encoding::Value::Null);
    assert_eq!((served.count, served.nulls), (5, 3));
    // Moments that overflowed are written as null and read back.
    let mut huge = Profile::default();
    huge.add_value(&crate::encoding::Value::Float64(1e300));
    huge.add_value(&crate::encoding::Value::Float64(-1e300));
    let text = serde_json::to_string(&ProfileDoc::from(&huge)).unwrap();
    let back: ProfileDoc = serde_json::from_str(&text).unwrap();
    assert_eq!(Profile::try_from(&back).unwrap().count, 2);
    // A damaged sketch is an error, never a panic (even split inside a character).
    let mut bad = back.clone();
    bad.numbers.as_mut().unwrap().kll = "a\u{e9}0".into();
    assert!(Profile::try_from(&bad).is_err());
}
