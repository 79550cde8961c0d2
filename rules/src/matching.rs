//! Which requests a rule (or a weighted cost) applies to: path (exact or prefix), method
//! and request headers (present, or equal to a value). Every condition given must hold.

use crate::attributes::{is_header_name, RequestAttributes};
use serde::Deserialize;

/// A compiled request condition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMatch {
    path: Option<PathMatch>,
    /// Upper-case methods; empty means any.
    methods: Vec<String>,
    headers: Vec<HeaderCondition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PathMatch {
    Exact(String),
    Prefix(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct HeaderCondition {
    name: String,
    value: Option<String>,
}

/// The JSON form of a match.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    path_prefix: Option<String>,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    headers: Vec<RawHeaderCondition>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeaderCondition {
    name: String,
    /// Absent: the header only has to be present.
    #[serde(default)]
    value: Option<String>,
}

/// A compile error: the field (relative to the match) and the reason.
pub type MatchError = (String, String);

fn check_path(field: &str, path: &str) -> Result<(), MatchError> {
    if !path.starts_with('/')
        || path.len() > 1024
        || path.bytes().any(|b| !b.is_ascii_graphic())
        || path.contains('?')
    {
        return Err((
            field.into(),
            format!("{path:?} must start with '/' and hold no spaces or '?'"),
        ));
    }
    Ok(())
}

impl RawMatch {
    pub fn compile(self) -> Result<RequestMatch, MatchError> {
        let path = match (self.path, self.path_prefix) {
            (Some(_), Some(_)) => {
                return Err(("path".into(), "give either path or path_prefix, not both".into()))
            }
            (Some(path), None) => {
                check_path("path", &path)?;
                Some(PathMatch::Exact(path))
            }
            (None, Some(prefix)) => {
                check_path("path_prefix", &prefix)?;
                Some(PathMatch::Prefix(prefix))
            }
            (None, None) => None,
        };
        let mut methods = Vec::with_capacity(self.methods.len());
        for (i, method) in self.methods.into_iter().enumerate() {
            if method.is_empty() || method.len() > 32 || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
                return Err((
                    format!("methods[{i}]"),
                    format!("{method:?} is not an HTTP method"),
                ));
            }
            methods.push(method.to_ascii_uppercase());
        }
        let mut headers = Vec::with_capacity(self.headers.len());
        for (i, header) in self.headers.into_iter().enumerate() {
            if !is_header_name(&header.name) {
                return Err((
                    format!("headers[{i}].name"),
                    format!("{:?} is not a header name", header.name),
                ));
            }
            headers.push(HeaderCondition {
                name: header.name.to_ascii_lowercase(),
                value: header.value,
            });
        }
        Ok(RequestMatch {
            path,
            methods,
            headers,
        })
    }
}

impl RequestMatch {
    pub fn matches(&self, request: &impl RequestAttributes) -> bool {
        if let Some(path_match) = &self.path {
            let full = request.path().unwrap_or_default();
            let path = full.split(['?', '#']).next().unwrap_or_default();
            let ok = match path_match {
                PathMatch::Exact(exact) => path == exact,
                PathMatch::Prefix(prefix) => path.starts_with(prefix.as_str()),
            };
            if !ok {
                return false;
            }
        }
        if !self.methods.is_empty() {
            let method = request.method().unwrap_or_default();
            if !self.methods.contains(&method) {
                return false;
            }
        }
        self.headers.iter().all(
            |condition| match (request.header(&condition.name), &condition.value) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(actual), Some(expected)) => actual == *expected,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // On wasm32 the same tests run under wasm-bindgen-test (Node).
    use crate::attributes::fake::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn compile(json: &str) -> Result<RequestMatch, MatchError> {
        serde_json::from_str::<RawMatch>(json).unwrap().compile()
    }

    #[test]
    fn path_prefix_and_exact() {
        let search = compile(r#"{"path_prefix": "/search"}"#).unwrap();
        assert!(search.matches(&FakeRequest::get("/search?q=1")));
        assert!(search.matches(&FakeRequest::get("/search/deep")));
        assert!(!search.matches(&FakeRequest::get("/other")));
        let exact = compile(r#"{"path": "/login"}"#).unwrap();
        assert!(exact.matches(&FakeRequest::get("/login?next=/")));
        assert!(!exact.matches(&FakeRequest::get("/login/x")));
    }

    #[test]
    fn methods_and_headers() {
        let rule = compile(r#"{"methods": ["post"], "headers": [{"name": "X-Tier", "value": "free"}, {"name": "x-api-key"}]}"#)
            .unwrap();
        let mut request = FakeRequest::get("/")
            .with_header("x-tier", "free")
            .with_header("x-api-key", "k");
        assert!(!rule.matches(&request));
        request.method = "POST".into();
        assert!(rule.matches(&request));
        assert!(!rule.matches(&request.clone().with_header("x-tier", "paid")));
        let mut without_key = request.clone();
        without_key.headers.remove("x-api-key");
        assert!(!rule.matches(&without_key));
    }

    #[test]
    fn empty_match_matches_everything() {
        assert!(RequestMatch::default().matches(&FakeRequest::get("/anything")));
    }

    #[test]
    fn bad_matches_name_their_field() {
        assert_eq!(compile(r#"{"path": "nope"}"#).unwrap_err().0, "path");
        assert_eq!(
            compile(r#"{"path_prefix": "/a b"}"#).unwrap_err().0,
            "path_prefix"
        );
        assert_eq!(
            compile(r#"{"path": "/a", "path_prefix": "/b"}"#).unwrap_err().0,
            "path"
        );
        assert_eq!(
            compile(r#"{"methods": ["GET", "G3T"]}"#).unwrap_err().0,
            "methods[1]"
        );
        assert_eq!(
            compile(r#"{"headers": [{"name": "bad name"}]}"#).unwrap_err().0,
            "headers[0].name"
        );
    }
}
