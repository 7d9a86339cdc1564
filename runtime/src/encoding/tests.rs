use super::*;

fn row(event_ts: i64, created_ts: i64) -> OnlineRow {
    OnlineRow {
        event_ts,
        created_ts,
        fingerprint: 42,
        values: vec![
            Value::Null,
            Value::Int32(-7),
            Value::Int64(i64::MIN),
            Value::Float32(1.5),
            Value::Float64(-0.25),
            Value::Bool(true),
            Value::String("héllo".into()),
            Value::Bytes(vec![0, 255]),
            Value::Timestamp(1_700_000_000_000_000),
            Value::ListInt64(vec![1, -2]),
            Value::ListFloat32(vec![0.5, f32::MAX]),
            Value::ListFloat64(vec![]),
            Value::ListString(vec!["a".into(), "".into()]),
        ],
    }
}

#[test]
fn rows_round_trip() {
    let r = row(1_700_000_000_000_000, i64::MIN);
    assert_eq!(OnlineRow::decode(&r.encode()).unwrap(), r);
}

#[test]
fn the_header_orders_like_event_then_created_time() {
    let times = [i64::MIN, -5_000_000, -1, 0, 1, 1_700_000_000_000_000, i64::MAX];
    for &(e1, c1) in &[(0, 0), (-1, 5), (1_700_000_000_000_000, i64::MIN)] {
        for &e2 in &times {
            for &c2 in &times {
                let (a, b) = (row(e1, c1).encode(), row(e2, c2).encode());
                assert_eq!(replaces(&a, &b), (e2, c2) >= (e1, c1), "({e1},{c1}) vs ({e2},{c2})");
            }
        }
    }
    assert!(!replaces(&row(0, 0).encode(), &[1, 2, 3]));
}

#[test]
fn a_stored_row_beyond_the_horizon_never_blocks_a_write() {
    let future = row(253_402_300_799_000_000, 0).encode(); // 9999-12-31T23:59:59Z
    let now = 1_700_000_000_000_000;
    assert!(!replaces(&future, &row(now, 0).encode()));
    assert!(replaces_before(&future, &row(now, 0).encode(), now + 300_000_000));
    // At or before the horizon the plain rule holds.
    let soon = row(now + 300_000_000, 0).encode();
    assert!(!replaces_before(&soon, &row(now, 0).encode(), now + 300_000_000));
    assert!(replaces_before(&row(now, 0).encode(), &row(now, 1).encode(), now));
    assert!(!replaces_before(&row(now, 1).encode(), &row(now, 0).encode(), now));
    assert!(!replaces_before(&future, &[1, 2, 3], now));
}

#[test]
fn keys_of_rows_before_1970_expire_at_once() {
    let v = FeatureView::new("v").with_feature("a", DType::Int64).with_ttl(quiver_sdk::Ttl::from_secs(3600));
    assert_eq!(expire_at_ms(&v, -10 * 86_400_000_000), Some(1), "clamped past the epoch, never 0 (= no expiry)");
    let exactly_zero = -(3600 * 1000 + KEY_GRACE_MS) * 1000;
    assert_eq!(expire_at_ms(&v, exactly_zero), Some(1));
    assert_eq!(expire_at_ms(&v, 0), Some(3600 * 1000 + KEY_GRACE_MS));
    assert_eq!(expire_at_ms(&FeatureView::new("u").with_feature("a", DType::Int64), -1), None);
}

#[test]
fn damaged_rows_are_refused() {
    let bytes = row(1, 2).encode();
    for cut in [0, 10, 17, 25, bytes.len() - 1] {
        assert!(OnlineRow::decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    let mut extra = bytes.clone();
    extra.push(0);
    assert!(OnlineRow::decode(&extra).unwrap_err().0.contains("trailing"));
    let mut bad_tag = row(1, 2);
    bad_tag.values = vec![Value::Null];
    let mut b = bad_tag.encode();
    *b.last_mut().unwrap() = 99;
    assert!(OnlineRow::decode(&b).unwrap_err().0.contains("unknown value tag 99"));
}

#[test]
fn a_selective_decode_skips_what_is_not_kept() {
    let r = row(5, 6);
    let bytes = r.encode();
    let n = r.values.len();
    let mut values = vec![Value::String("left over".into())];
    // Every value kept alone (each kind of value skipped around it), then none.
    for k in 0..=n {
        let keep: Vec<bool> = (0..n).map(|j| j == k).collect();
        assert_eq!(
            OnlineRow::decode_into(&bytes, Some((42, &keep)), &mut values).unwrap(),
            RowHeader { event_ts: 5, created_ts: 6, fingerprint: 42 }
        );
        let want: Vec<Value> = r.values.iter().enumerate().map(|(j, v)| if j == k { v.clone() } else { Value::Null }).collect();
        assert_eq!(values, want, "keeping value {k}");
    }
    // Another fingerprint, or another count: decoded whole.
    let keep = vec![false; n];
    assert_eq!(OnlineRow::decode_into(&bytes, Some((43, &keep)), &mut values).unwrap().fingerprint, 42);
    assert_eq!(values, r.values);
    OnlineRow::decode_into(&bytes, Some((42, &keep[1..])), &mut values).unwrap();
    assert_eq!(values, r.values);
    // Damaged rows are refused whatever is kept.
    for cut in [0, 10, 17, 25, 40, bytes.len() - 1] {
        assert!(OnlineRow::decode_into(&bytes[..cut], Some((42, &keep)), &mut values).is_err(), "cut at {cut}");
    }
}

#[test]
fn values_check_types() {
    assert!(Value::Int64(1).fits(DType::Int64));
    assert!(Value::Null.fits(DType::List(ListElement::String)));
    assert!(!Value::Int64(1).fits(DType::Float64));
    assert!(Value::ListFloat32(vec![]).fits(DType::List(ListElement::Float32)));
}

#[test]
fn entity_keys_are_unambiguous() {
    let a = entity_key(&[KeyValue::Str("a|s1:b".into())]);
    let b = entity_key(&[KeyValue::Str("a".into()), KeyValue::Str("b".into())]);
    assert_ne!(a, b);
    assert_eq!(store_key("demo", "v", &[KeyValue::Int(-3)]), "quiver:demo:v:i-3");
    // The stored keys of every existing deployment: composite, extreme and non-ASCII keys.
    assert_eq!(
        store_key("p", "view_2", &[KeyValue::Int(i64::MIN), KeyValue::Str("é|x".into()), KeyValue::Int(0)]),
        "quiver:p:view_2:i-9223372036854775808|s4:é|x|i0"
    );
    assert_eq!(store_key("p", "v", &[KeyValue::Str(String::new())]), "quiver:p:v:s0:");
    assert_eq!(entity_key(&[KeyValue::Int(i64::MAX)]), "i9223372036854775807");
}
