//! What the filter reads from a request: headers, the peer's address and verified JWT
//! claims, behind a trait that the host layer implements over Envoy and tests over
//! plain values. Matching, keys and tiers all read requests through it.

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

/// Whether `name` is a valid (configurable) HTTP header name.
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
}

#[cfg(test)]
pub(crate) mod fake {
    use super::RequestAttributes;
    use std::collections::HashMap;

    /// A request made of plain values, for the pure logic's tests.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct FakeRequest {
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
