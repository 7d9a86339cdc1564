//! A view's layout fingerprint: which online rows and records were written under which
//! definition of it.

use super::FeatureView;

/// A fingerprint of a view's feature names and types, and of its aggregations (FNV-1a,
/// stable across builds): each online row and record carries the one it was written
/// under, so a reader knows a row of an earlier definition.
pub fn fingerprint(view: &FeatureView) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    eat(view.name.as_bytes());
    for f in &view.features {
        eat(f.name.as_bytes());
        eat(f.dtype.as_str().as_bytes());
    }
    // An event log's online records hold one partial per aggregation: any change to
    // the aggregations is another layout.
    for a in &view.aggregations {
        eat(a.name.as_bytes());
        eat(a.function.as_str().as_bytes());
        eat(a.column.as_bytes());
        eat(&a.window_us().to_le_bytes());
        eat(&a.hop_us().to_le_bytes());
        eat(&(a.keep() as u64).to_le_bytes());
    }
    h
}

#[cfg(test)]
mod tests {
    use super::fingerprint;
    use crate::{DType, FeatureView, Ttl};

    #[test]
    fn fingerprints_change_with_the_schema() {
        let v = FeatureView::new("v").with_feature("a", DType::Int64);
        let same = FeatureView::new("v").with_feature("a", DType::Int64).with_ttl(Ttl::from_secs(9));
        assert_eq!(fingerprint(&v), fingerprint(&same), "ttl is not part of the row schema");
        for other in [
            FeatureView::new("v").with_feature("a", DType::Float64),
            FeatureView::new("v").with_feature("b", DType::Int64),
            FeatureView::new("w").with_feature("a", DType::Int64),
            FeatureView::new("v").with_feature("a", DType::Int64).with_feature("b", DType::Int64),
        ] {
            assert_ne!(fingerprint(&v), fingerprint(&other), "{other:?}");
        }
    }
}
