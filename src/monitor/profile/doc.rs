//! A profile's JSON form: the counts, the moments, the frequent values, and each
//! sketch as hex of its DataSketches bytes.

use datasketches::frequencies::FrequentItemsSketch;
use datasketches::kll::KllSketch;
use serde::{Deserialize, Serialize};

use super::{Categories, Numbers, Profile};

/// A profile as JSON (a manifest's, a stored report's): the counts, the numbers'
/// moments, the most frequent values, and each sketch as hex of its DataSketches bytes,
/// so a profile read back merges and compares as the one written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileDoc {
    pub count: u64,
    pub nulls: u64,
    #[serde(default)]
    pub not_found: u64,
    #[serde(default)]
    pub outside_max_age: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numbers: Option<NumbersDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<CategoriesDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lengths: Option<NumbersDoc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumbersDoc {
    pub n: u64,
    /// Absent when no number was seen.
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Null when it overflowed (values near f64's limits); read back as NaN.
    #[serde(deserialize_with = "nan_if_null")]
    pub mean: f64,
    pub stddev: Option<f64>,
    #[serde(deserialize_with = "nan_if_null")]
    pub m2: f64,
    pub nan: u64,
    /// Infinite values (absent in profiles written when they counted as nulls).
    #[serde(default)]
    pub infinite: u64,
    pub kll: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoriesDoc {
    pub total: u64,
    /// The most frequent values and their (estimated) counts, most frequent first.
    pub top: Vec<(String, u64)>,
    pub sketch: String,
}

impl From<&Profile> for ProfileDoc {
    fn from(p: &Profile) -> ProfileDoc {
        let numbers = |n: &Numbers| NumbersDoc {
            n: n.n,
            min: (n.n > 0).then_some(n.min),
            max: (n.n > 0).then_some(n.max),
            mean: n.mean,
            stddev: n.stddev(),
            m2: n.m2,
            nan: n.nan,
            infinite: n.infinite,
            kll: hex(&n.sketch.serialize()),
        };
        ProfileDoc {
            count: p.count,
            nulls: p.nulls,
            not_found: p.not_found,
            outside_max_age: p.outside_max_age,
            numbers: p.numbers.as_ref().map(numbers),
            categories: p.categories.as_ref().map(|c| CategoriesDoc { total: c.total(), top: c.top(), sketch: hex(&c.sketch.serialize()) }),
            lengths: p.lengths.as_ref().map(numbers),
        }
    }
}

impl TryFrom<&ProfileDoc> for Profile {
    type Error = String;

    /// # Errors
    /// A sketch whose hex or bytes do not read back.
    fn try_from(d: &ProfileDoc) -> Result<Profile, String> {
        let numbers = |n: &NumbersDoc| -> Result<Numbers, String> {
            let sketch = KllSketch::deserialize(&unhex(&n.kll)?).map_err(|e| format!("a quantile sketch: {e}"))?;
            Ok(Numbers {
                n: n.n,
                min: n.min.unwrap_or(f64::INFINITY),
                max: n.max.unwrap_or(f64::NEG_INFINITY),
                mean: n.mean,
                m2: n.m2,
                nan: n.nan,
                infinite: n.infinite,
                sketch,
            })
        };
        let categories = |c: &CategoriesDoc| -> Result<Categories, String> {
            let sketch = FrequentItemsSketch::deserialize(&unhex(&c.sketch)?).map_err(|e| format!("a frequent values sketch: {e}"))?;
            Ok(Categories { sketch })
        };
        Ok(Profile {
            count: d.count,
            nulls: d.nulls,
            not_found: d.not_found,
            outside_max_age: d.outside_max_age,
            numbers: d.numbers.as_ref().map(numbers).transpose()?,
            categories: d.categories.as_ref().map(categories).transpose()?,
            lengths: d.lengths.as_ref().map(numbers).transpose()?,
            counted: None,
        })
    }
}

/// A float JSON wrote as `null` (it was not finite) reads back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

fn unhex(text: &str) -> Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err("a sketch's hex has an odd length".into());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            let pair = &text.as_bytes()[i..i + 2];
            std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("a sketch's hex has `{}`", String::from_utf8_lossy(pair)))
        })
        .collect()
}
