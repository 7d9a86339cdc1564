//! The request read by hand, for the shape nearly every request has: an object with
//! `entities` (join key -> list of integers or strings), `features` (strings),
//! `feature_service`, `full_feature_names` and other keys with plain values, no string
//! escapes. Anything else — an escape, a float, a nested unknown value, a key twice,
//! malformed JSON — is `None`, and the serde readings take the body as before: this
//! reading accepts a subset of what they accept and reads it the same (a differential
//! test holds it to that). It skips serde's visitor machinery, about a tenth of a
//! single-entity request's instructions.

use quiver_sdk::encoding::KeyValue;

use crate::lookup::EntityColumns;

use super::{Features, Parsed};

/// `body` read as a request, when it has the plain shape (see the module).
pub(super) fn scan(body: &str) -> Option<Parsed<'_>> {
    let mut s = Scanner { text: body, at: 0 };
    let mut parsed = Parsed { entities: None, features: None, service: None, full_names: false };
    let mut seen = [false; 4];
    s.expect(b'{')?;
    if !s.eat(b'}') {
        loop {
            let key = s.string()?;
            s.expect(b':')?;
            let field = ["entities", "features", "feature_service", "full_feature_names"].iter().position(|k| *k == key);
            match field {
                Some(f) if std::mem::replace(&mut seen[f], true) => return None,
                Some(0) => parsed.entities = s.entities()?,
                Some(1) => parsed.features = s.features()?,
                Some(2) => {
                    parsed.service = match s.scalar()? {
                        Scalar::Null => None,
                        Scalar::Str(name) => Some(Ok(name.to_string())),
                        _ => Some(Err("`feature_service` must be a name".to_string())),
                    }
                }
                Some(_) => parsed.full_names = matches!(s.scalar()?, Scalar::Bool(true)),
                None => {
                    s.scalar()?;
                }
            }
            if s.eat(b'}') {
                break;
            }
            s.expect(b',')?;
        }
    }
    s.skip_ws();
    (s.at == body.len()).then_some(parsed)
}

/// A plain JSON value.
enum Scalar<'a> {
    Null,
    Bool(bool),
    Int,
    Str(&'a str),
}

struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    fn skip_ws(&mut self) {
        let bytes = self.text.as_bytes();
        while self.at < bytes.len() && matches!(bytes[self.at], b' ' | b'\t' | b'\n' | b'\r') {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not taken.
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.text.as_bytes().get(self.at).copied()
    }

    /// Takes `b` if it comes next (after whitespace).
    fn eat(&mut self, b: u8) -> bool {
        let next = self.peek() == Some(b);
        self.at += usize::from(next);
        next
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        self.eat(b).then_some(())
    }

    /// A string without escapes or control characters.
    fn string(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let bytes = self.text.as_bytes();
        let start = self.at;
        while self.at < bytes.len() {
            match bytes[self.at] {
                b'"' => {
                    self.at += 1;
                    // The body is valid UTF-8 and quotes are ASCII: a char boundary.
                    return Some(&self.text[start..self.at - 1]);
                }
                b'\\' | 0..=0x1f => return None,
                _ => self.at += 1,
            }
        }
        None
    }

    /// An integer as JSON writes it (no fraction or exponent) that fits `i64`.
    fn int(&mut self) -> Option<i64> {
        self.skip_ws();
        let bytes = self.text.as_bytes();
        let negative = bytes.get(self.at) == Some(&b'-');
        let start = self.at + usize::from(negative);
        let mut end = start;
        while end < bytes.len() && bytes[end].is_ascii_digit() {
            end += 1;
        }
        let digits = &self.text[start..end];
        // No digits, a leading zero, a fraction or exponent, or "-0": the serde readings.
        if digits.is_empty()
            || (digits.len() > 1 && digits.starts_with('0'))
            || matches!(bytes.get(end), Some(b'.' | b'e' | b'E'))
            || (negative && digits == "0")
        {
            return None;
        }
        self.at = end;
        // `i64` parses "-9223372036854775808" and refuses what does not fit.
        self.text[start - usize::from(negative)..end].parse().ok()
    }

    /// `null`, `true`, `false`, an integer or a plain string.
    fn scalar(&mut self) -> Option<Scalar<'a>> {
        match self.peek()? {
            b'"' => self.string().map(Scalar::Str),
            b'-' | b'0'..=b'9' => self.int().map(|_| Scalar::Int),
            _ => {
                for (word, value) in [("null", Scalar::Null), ("true", Scalar::Bool(true)), ("false", Scalar::Bool(false))] {
                    if self.text[self.at..].starts_with(word) {
                        self.at += word.len();
                        return Some(value);
                    }
                }
                None
            }
        }
    }

    /// `entities`: `null` or an object of lists of integers and strings.
    fn entities(&mut self) -> Option<Option<EntityColumns>> {
        if self.null() {
            return Some(None);
        }
        self.expect(b'{')?;
        let mut columns = Vec::new();
        if self.eat(b'}') {
            return Some(Some(columns));
        }
        loop {
            let name = self.string()?;
            self.expect(b':')?;
            self.expect(b'[')?;
            let mut keys = Vec::new();
            if !self.eat(b']') {
                loop {
                    keys.push(match self.peek()? {
                        b'"' => KeyValue::Str(self.string()?.to_string()),
                        _ => KeyValue::Int(self.int()?),
                    });
                    if self.eat(b']') {
                        break;
                    }
                    self.expect(b',')?;
                }
            }
            columns.push((name.to_string(), keys));
            if self.eat(b'}') {
                return Some(Some(columns));
            }
            self.expect(b',')?;
        }
    }

    /// `features`: `null` or a list of strings.
    fn features(&mut self) -> Option<Option<Features<'a>>> {
        if self.null() {
            return Some(None);
        }
        self.expect(b'[')?;
        let mut list = Vec::new();
        if !self.eat(b']') {
            loop {
                list.push(self.string()?);
                if self.eat(b']') {
                    break;
                }
                self.expect(b',')?;
            }
        }
        Some(Some(Features::List(list)))
    }

    /// Takes a `null` if one comes next.
    fn null(&mut self) -> bool {
        let null = self.peek() == Some(b'n') && self.text[self.at..].starts_with("null");
        self.at += if null { 4 } else { 0 };
        null
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::super::Parsed;
    use super::scan;

    fn pick<'s>(rng: &mut StdRng, from: &[&'s str]) -> &'s str {
        from[rng.random_range(0..from.len())]
    }

    fn ws(rng: &mut StdRng) -> &'static str {
        pick(rng, &["", "", " ", "\n", "\t", "\r\n  "])
    }

    /// A list of `n` items written by `item`, with random whitespace.
    fn list(rng: &mut StdRng, open: char, close: char, n: usize, mut item: impl FnMut(&mut StdRng) -> String) -> String {
        let mut out = format!("{open}{}", ws(rng));
        for i in 0..n {
            if i > 0 {
                out += &format!("{},{}", ws(rng), ws(rng));
            }
            out += &item(rng);
        }
        out + ws(rng) + &close.to_string()
    }

    fn string(rng: &mut StdRng) -> String {
        pick(rng, &[r#""driver_id""#, r#""a:x""#, r#""café""#, r#""""#, r#""q\"x""#, r#""\u0078""#, r#""tab	in""#, r#""b:y z""#])
            .to_string()
    }

    fn int(rng: &mut StdRng) -> String {
        match rng.random_range(0..12) {
            0 => "0".into(),
            1 => "-0".into(),
            2 => "01".into(),
            3 => "-9223372036854775808".into(),
            4 => "9223372036854775807".into(),
            5 => "9223372036854775808".into(),
            6 => "-9223372036854775809".into(),
            7 => "1.5".into(),
            8 => "1e3".into(),
            9 => "-".into(),
            _ => rng.random_range(-1_000_000i64..1_000_000).to_string(),
        }
    }

    /// Any JSON value (and some that are not).
    fn value(rng: &mut StdRng, depth: u32) -> String {
        match rng.random_range(0..if depth > 1 { 6 } else { 8 }) {
            0 => pick(rng, &["null", "true", "false", "nul", "truex"]).to_string(),
            1 | 2 => int(rng),
            3 | 4 => string(rng),
            5 => pick(rng, &["[]", "{}", "1.0", "-1E-2"]).to_string(),
            6 => {
                let n = rng.random_range(0..3);
                list(rng, '[', ']', n, |rng| value(rng, depth + 1))
            }
            _ => {
                let n = rng.random_range(0..3);
                list(rng, '{', '}', n, |rng| format!("{}:{}", string(rng), value(rng, depth + 1)))
            }
        }
    }

    fn entities(rng: &mut StdRng) -> String {
        match rng.random_range(0..10) {
            0 => "null".into(),
            1 => value(rng, 0),
            _ => {
                let n = rng.random_range(0..3);
                list(rng, '{', '}', n, |rng| {
                    let keys = match rng.random_range(0..8) {
                        0 => value(rng, 1),
                        _ => {
                            let n = rng.random_range(0..4);
                            list(rng, '[', ']', n, |rng| if rng.random_bool(0.6) { int(rng) } else { string(rng) })
                        }
                    };
                    format!("{}{}:{}{keys}", pick(rng, &[r#""driver_id""#, r#""k""#, r#""customer_id""#, r#""k\u0031""#]), ws(rng), ws(rng))
                })
            }
        }
    }

    fn request(rng: &mut StdRng) -> String {
        let mut members: Vec<String> = Vec::new();
        let fields = ["entities", "features", "feature_service", "full_feature_names", "include_metadata", "features"];
        for _ in 0..rng.random_range(0..6) {
            let key = pick(rng, &fields);
            let v = match key {
                "entities" => entities(rng),
                "features" if rng.random_bool(0.8) => {
                    let n = rng.random_range(0..4);
                    list(rng, '[', ']', n, |rng| if rng.random_bool(0.9) { string(rng) } else { value(rng, 1) })
                }
                _ => value(rng, 0),
            };
            members.push(format!("{}\"{key}\"{}:{}{v}", ws(rng), ws(rng), ws(rng)));
        }
        let mut text = format!("{}{{{}}}{}", ws(rng), members.join(","), ws(rng));
        // Broken ones: cut short, something after, a byte changed.
        match rng.random_range(0..12) {
            0 => {
                let mut at = rng.random_range(0..=text.len());
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                text.truncate(at);
            }
            1 => text += pick(rng, &["x", "}", ",", " 1"]),
            2 => {
                let mut at = rng.random_range(0..=text.len());
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                text.insert(at, pick(rng, &[",", ":", "\"", "]", "{"]).chars().next().unwrap());
            }
            _ => {}
        }
        text
    }

    /// Whatever the hand reading reads, serde reads the same; and it reads most plain
    /// requests (else it is not the fast path it is meant to be).
    #[test]
    fn the_hand_reading_reads_what_serde_reads_the_same() {
        let mut rng = StdRng::seed_from_u64(19);
        let (mut scanned, mut by_serde) = (0, 0);
        for _ in 0..200_000 {
            let text = request(&mut rng);
            let serde = Parsed::typed_by_serde(&text);
            by_serde += usize::from(serde.is_some());
            if let Some(read) = scan(&text) {
                scanned += 1;
                assert_eq!(Some(&read), serde.as_ref(), "{text}");
            }
        }
        assert!(scanned > 20_000 && scanned * 10 > by_serde * 4, "read by hand {scanned}, by serde {by_serde}");
    }

    #[test]
    fn the_common_requests_are_read_by_hand() {
        for text in [
            r#"{"entities": {"driver_id": [1, 2, 3]}, "features": ["driver_hourly:conv_rate", "driver_hourly:acc_rate"]}"#,
            r#"{"features":["a:x"],"entities":{"driver_id":[-9223372036854775808],"customer_id":["C001"]},"full_feature_names":true}"#,
            r#"{"feature_service": "ranker", "entities": {"k": ["café"]}, "include_feature_view_version_metadata": false}"#,
        ] {
            assert_eq!(scan(text), Parsed::typed_by_serde(text), "{text}");
            assert!(scan(text).is_some(), "{text}");
        }
        for text in [r#"{"entities": {"k": [1]}, "entities": {"k": [2]}}"#, r#"{"features": ["a:\u0078"]}"#, r#"{"x": [1]}"#, "{} x"] {
            assert!(scan(text).is_none(), "{text}");
        }
    }
}
