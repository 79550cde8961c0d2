//! What the filter reads from a request: headers, the peer's address and verified JWT
//! claims, behind a trait that the host layer implements over Envoy, and tests and the
//! operator's `redis-shim counters` over plain values ([`GivenRequest`]). Matching, keys
//! and tiers all read requests through it.

/// What the filter needs to know about a request; the host layer implements it over
/// Envoy's header map and properties, tests over plain values.
pub trait RequestAttributes {
    /// The value of a request header (lower-case name), if present.
    fn header(&self, name: &str) -> Option<String>;
    /// Envoy's `source.address` property: `ip:port` or `[v6]:port`.
    fn source_address(&self) -> Option<String>;
    /// A claim of the verified JWT, rendered as text.
    fn jwt_claim(&self, name: &str) -> Option<String>;
    /// The `:path` pseudo-header.
    fn path(&self) -> Option<String> {
        self.header(":path")
    }
    /// The `:method` pseudo-header.
    fn method(&self) -> Option<String> {
        self.header(":method")
    }
}

/// A header value as text. HTTP allows any byte above 0x7f in a value, so it need not be
/// UTF-8; such a value becomes U+FFFD and the hex of its bytes, so that two different
/// values never share a counter (lossy decoding made them all one client).
pub fn header_text(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(invalid) => {
            let hex: String = invalid.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
            format!("\u{FFFD}{hex}")
        }
    }
}

/// A request header's value from the request's header pairs. A header sent several times
/// is one value: its values joined with `,` in order, as HTTP defines for list headers
/// (a client could otherwise rotate a first `x-api-key` and keep a second one fixed, or
/// the other way round, and be keyed on whichever the reader happened to take).
pub fn combined_header(pairs: &[(String, Vec<u8>)], name: &str) -> Option<String> {
    let mut values = pairs.iter().filter(|(n, _)| n == name).map(|(_, v)| v);
    let first = values.next()?;
    let mut joined = first.clone();
    for value in values {
        joined.push(b',');
        joined.extend_from_slice(value);
    }
    Some(header_text(joined))
}

/// A JWT claim's value as text, whatever its JSON type. Envoy hands the filter a string
/// claim as its bytes and a number as the 8 bytes of an IEEE double; anything else (a
/// boolean, an object...) arrives in some other binary form. Text stays text; a double
/// becomes its canonical text (`12345`, `1.5`); other bytes become hex. So every value
/// keys its own counter, and no claim type can switch a rule off (a rule used to skip
/// every claim whose bytes were not UTF-8: most integers).
pub fn claim_text(bytes: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(bytes) {
        if !text.chars().any(char::is_control) {
            return text.to_string();
        }
    }
    if let Ok(double) = <[u8; 8]>::try_from(bytes) {
        let number = f64::from_le_bytes(double);
        // Integers print without a fraction, as JSON wrote them.
        if number.fract() == 0.0 && number.abs() < 9_007_199_254_740_992.0 {
            return format!("{}", number as i64);
        }
        if number.is_finite() {
            return format!("{number}");
        }
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("0x{hex}")
}

/// Whether `name` is a valid (configurable) HTTP header name.
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
}

/// A request described by plain values (an operator's command line, say), so that a tool
/// keys and plans it exactly as the filter does. Header names match whatever their case;
/// a header given several times is one value, its values joined with `,` as
/// [`combined_header`] does for Envoy's headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GivenRequest {
    /// Header names and values, `:path` and `:method` included.
    pub headers: Vec<(String, String)>,
    /// `source.address`: an IP, or `ip:port`.
    pub source_address: Option<String>,
    /// Verified JWT claims, as text.
    pub claims: Vec<(String, String)>,
}

impl RequestAttributes for GivenRequest {
    fn header(&self, name: &str) -> Option<String> {
        let pairs: Vec<(String, Vec<u8>)> = self
            .headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.clone().into_bytes()))
            .collect();
        combined_header(&pairs, name)
    }
    fn source_address(&self) -> Option<String> {
        self.source_address.clone()
    }
    fn jwt_claim(&self, name: &str) -> Option<String> {
        self.claims
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::{claim_text, combined_header, header_text};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    // Regression: a rule keyed on a numeric claim did not apply to most integers.
    #[test]
    fn every_claim_type_has_a_distinct_text() {
        assert_eq!(claim_text(b"alice"), "alice");
        for (number, text) in [
            (1.0, "1"),
            (1000.0, "1000"),
            (12345.0, "12345"),
            (2147483648.0, "2147483648"),
            (-7.0, "-7"),
            (1.5, "1.5"),
        ] {
            assert_eq!(claim_text(&f64::to_le_bytes(number)), text);
        }
        // 7.0's bytes happen to be valid UTF-8, with control characters: still a number.
        assert_eq!(claim_text(&7.0f64.to_le_bytes()), "7");
        assert_eq!(claim_text(&[1]), "0x01");
        assert_ne!(claim_text(&[0xff, 0x00]), claim_text(&[0xfe, 0x00]));
    }

    // Regression: with x-api-key sent twice, only the first value was read.
    #[test]
    fn a_repeated_header_is_all_of_its_values() {
        let pairs = |values: &[&str]| -> Vec<(String, Vec<u8>)> {
            values
                .iter()
                .map(|v| ("x-api-key".to_string(), v.as_bytes().to_vec()))
                .chain([("other".to_string(), b"x".to_vec())])
                .collect()
        };
        assert_eq!(combined_header(&pairs(&["a"]), "x-api-key").as_deref(), Some("a"));
        assert_eq!(
            combined_header(&pairs(&["a", "b"]), "x-api-key").as_deref(),
            Some("a,b")
        );
        assert_ne!(
            combined_header(&pairs(&["rotating-1", "fixed"]), "x-api-key"),
            combined_header(&pairs(&["rotating-2", "fixed"]), "x-api-key")
        );
        assert_eq!(combined_header(&pairs(&["a"]), "missing"), None);
    }

    #[test]
    fn a_given_request_reads_as_the_filter_reads_envoy() {
        use super::{GivenRequest, RequestAttributes};
        let given = GivenRequest {
            headers: vec![
                (":path".into(), "/export?x=1".into()),
                ("X-Api-Key".into(), "a".into()),
                ("x-api-key".into(), "b".into()),
            ],
            source_address: Some("192.0.2.7".into()),
            claims: vec![("sub".into(), "alice".into())],
        };
        assert_eq!(given.header("x-api-key").as_deref(), Some("a,b"));
        assert_eq!(given.path().as_deref(), Some("/export?x=1"));
        assert_eq!(given.method(), None);
        assert_eq!(given.jwt_claim("sub").as_deref(), Some("alice"));
        assert_eq!(given.jwt_claim("tier"), None);
    }

    // Regression: every header value that was not UTF-8 decoded to the same text.
    #[test]
    fn header_values_that_are_not_utf8_stay_distinct() {
        assert_eq!(header_text(b"plain".to_vec()), "plain");
        assert_ne!(header_text(vec![0xff, 0x01]), header_text(vec![0xfe, 0x01]));
        assert_eq!(header_text(vec![0xff, 0x01]), "\u{FFFD}ff01");
    }
}

/// Test doubles for the pure layers' tests, here and in the filter crate (its
/// dev-dependency turns on the `test-support` feature).
#[cfg(any(test, feature = "test-support"))]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
pub mod fake {
    use super::RequestAttributes;
    use std::collections::HashMap;

    /// A request made of plain values, for the pure logic's tests.
    #[derive(Debug, Clone, Default)]
    pub struct FakeRequest {
        pub headers: HashMap<String, String>,
        pub claims: HashMap<String, String>,
        pub source: Option<String>,
        pub method: String,
        pub path: String,
    }

    impl FakeRequest {
        pub fn get(path: &str) -> FakeRequest {
            FakeRequest {
                method: "GET".into(),
                path: path.into(),
                source: Some("192.0.2.1:40000".into()),
                ..FakeRequest::default()
            }
        }

        pub fn with_header(mut self, name: &str, value: &str) -> FakeRequest {
            self.headers.insert(name.into(), value.into());
            self
        }

        pub fn with_claim(mut self, name: &str, value: &str) -> FakeRequest {
            self.claims.insert(name.into(), value.into());
            self
        }

        pub fn from(mut self, source: Option<&str>) -> FakeRequest {
            self.source = source.map(str::to_string);
            self
        }
    }

    impl RequestAttributes for FakeRequest {
        fn header(&self, name: &str) -> Option<String> {
            match name {
                ":path" => Some(self.path.clone()),
                ":method" => Some(self.method.clone()),
                _ => self.headers.get(name).cloned(),
            }
        }
        fn source_address(&self) -> Option<String> {
            self.source.clone()
        }
        fn jwt_claim(&self, name: &str) -> Option<String> {
            self.claims.get(name).cloned()
        }
    }
}
