//! The `api_key` key part: a client's API key read from the first of several places that
//! holds one, as the official SDKs send it: `x-api-key: <key>` (Anthropic's) or
//! `Authorization: Bearer <key>` (OpenAI's, and Anthropic's with an auth token).
//!
//! Only the key is keyed, never the scheme around it, and it is hashed like every other
//! part: the same key sent in either header is one client with one counter.

use crate::attributes::{is_header_name, RequestAttributes};
use serde::Deserialize;

/// Most places one `api_key` part may list.
pub const MAX_API_KEY_SOURCES: usize = 8;

/// One place an API key may be sent.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApiKeySource {
    /// A header holding the key itself, e.g. `x-api-key`.
    Header(String),
    /// A header holding `Bearer <key>`, e.g. `authorization`: only the key after the scheme.
    Bearer(String),
}

impl ApiKeySource {
    fn header_name(&self) -> &str {
        match self {
            ApiKeySource::Header(name) | ApiKeySource::Bearer(name) => name,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiKeySource::Header(_) => "header",
            ApiKeySource::Bearer(_) => "bearer",
        }
    }

    /// The key this source finds in the request, if it holds one.
    fn read(&self, request: &impl RequestAttributes) -> Option<String> {
        match self {
            ApiKeySource::Header(name) => request.header(name).filter(|value| !value.is_empty()),
            ApiKeySource::Bearer(name) => bearer_token(&request.header(name)?).map(str::to_string),
        }
    }
}

/// `x-api-key` or `Bearer in authorization`: where a source reads, for messages.
impl std::fmt::Display for ApiKeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiKeySource::Header(name) => write!(f, "{name}"),
            ApiKeySource::Bearer(name) => write!(f, "Bearer in {name}"),
        }
    }
}

/// The sources in order, as `x-api-key, or Bearer in authorization`.
pub fn describe_sources(sources: &[ApiKeySource]) -> String {
    let places: Vec<String> = sources.iter().map(ToString::to_string).collect();
    places.join(", or ")
}

/// Validates and normalises (lower-case header names) an `api_key` part's list; an error
/// is the field at fault within the part (`.api_key`, `.api_key[1]`...) and why.
pub(crate) fn compile_sources(sources: Vec<ApiKeySource>) -> Result<Vec<ApiKeySource>, (String, String)> {
    let whole = ".api_key".to_string();
    if sources.is_empty() {
        return Err((whole, "must list at least one place to read the key from".into()));
    }
    if sources.len() > MAX_API_KEY_SOURCES {
        let reason = format!("at most {MAX_API_KEY_SOURCES} places, not {}", sources.len());
        return Err((whole, reason));
    }
    let mut compiled: Vec<ApiKeySource> = Vec::with_capacity(sources.len());
    for (i, source) in sources.into_iter().enumerate() {
        let name = source.header_name();
        if !is_header_name(name) {
            return Err((
                format!(".api_key[{i}].{}", source.kind()),
                format!("{name:?} is not a valid HTTP header name"),
            ));
        }
        let name = name.to_ascii_lowercase();
        let source = match source {
            ApiKeySource::Header(_) => ApiKeySource::Header(name),
            ApiKeySource::Bearer(_) => ApiKeySource::Bearer(name),
        };
        if compiled.contains(&source) {
            return Err((
                format!(".api_key[{i}]"),
                format!("{} {:?} is listed twice", source.kind(), source.header_name()),
            ));
        }
        compiled.push(source);
    }
    Ok(compiled)
}

/// The key of the first source that holds one: a source whose header is missing, empty
/// or (for `bearer`) not `Bearer <token>` is passed over for the next.
pub fn read_api_key(sources: &[ApiKeySource], request: &impl RequestAttributes) -> Option<String> {
    sources.iter().find_map(|source| source.read(request))
}

/// The token of an `Authorization`-style value `Bearer <token>` (RFC 6750, section 2.1):
/// the scheme in any case, one or more spaces, then a token of `A-Z a-z 0-9 - . _ ~ + /`
/// followed by any `=`. Anything else (another scheme, no token, a token with spaces or
/// commas, as two `Authorization` headers joined would give) is no bearer token.
pub fn bearer_token(value: &str) -> Option<&str> {
    const SCHEME: &str = "bearer";
    let scheme = value.get(..SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = value.get(SCHEME.len()..)?;
    let token = rest.trim_start_matches(' ');
    if token.len() == rest.len() {
        return None; // `Bearerabc`: no space after the scheme.
    }
    let token = token.trim_end_matches([' ', '\t']);
    let body = token.trim_end_matches('=');
    let valid = !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
    valid.then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attributes::fake::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn sdk_sources() -> Vec<ApiKeySource> {
        vec![
            ApiKeySource::Header("x-api-key".into()),
            ApiKeySource::Bearer("authorization".into()),
        ]
    }

    fn key(headers: &[(&str, &str)]) -> Option<String> {
        let request = headers
            .iter()
            .fold(FakeRequest::get("/v1/messages"), |r, (k, v)| r.with_header(k, v));
        read_api_key(&sdk_sources(), &request)
    }

    #[test]
    fn the_first_present_source_wins() {
        assert_eq!(key(&[("x-api-key", "sk-a")]).as_deref(), Some("sk-a"));
        assert_eq!(key(&[("authorization", "Bearer sk-b")]).as_deref(), Some("sk-b"));
        assert_eq!(
            key(&[("authorization", "Bearer sk-b"), ("x-api-key", "sk-a")]).as_deref(),
            Some("sk-a")
        );
        assert_eq!(key(&[]), None);
        assert_eq!(key(&[("x-other", "sk-a")]), None);
    }

    #[test]
    fn a_missing_empty_or_unusable_source_falls_through() {
        assert_eq!(
            key(&[("x-api-key", ""), ("authorization", "Bearer sk-b")]).as_deref(),
            Some("sk-b")
        );
        // Bearer first: an Authorization of another scheme passes to x-api-key.
        let bearer_first = [
            ApiKeySource::Bearer("authorization".into()),
            ApiKeySource::Header("x-api-key".into()),
        ];
        let request = FakeRequest::get("/")
            .with_header("authorization", "Basic dXNlcjpwYXNz")
            .with_header("x-api-key", "sk-a");
        assert_eq!(read_api_key(&bearer_first, &request).as_deref(), Some("sk-a"));
        assert_eq!(key(&[("authorization", "Bearer ")]), None);
        assert_eq!(key(&[("authorization", "Bearer")]), None);
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_only_the_token_is_kept() {
        for value in [
            "Bearer sk-1",
            "bearer sk-1",
            "BEARER sk-1",
            "bEaReR   sk-1",
            "Bearer sk-1 ",
        ] {
            assert_eq!(bearer_token(value), Some("sk-1"), "{value:?}");
        }
        assert_eq!(bearer_token("Bearer abc/+_~.-=="), Some("abc/+_~.-=="));
    }

    #[test]
    fn hostile_values_are_no_bearer_token() {
        for value in [
            "Bearersk-1",
            "Basic sk-1",
            "Bearer sk 1",
            "Bearer sk-1, Bearer sk-2",
            "Bearer sk-1,junk",
            "Bearer ====",
            "Bearer \tsk-1",
            "Bearer sk-\u{e9}",
            "Bear",
            "\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}",
            " Bearer sk-1",
            "Bearer sk-1=x",
        ] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
        // Long values are keyed whole (and hashed): nothing is cut or kept.
        let long = format!("Bearer {}", "a".repeat(60_000));
        assert_eq!(bearer_token(&long).map(str::len), Some(60_000));
        // Two Authorization headers are one joined value, hence no token: the next source.
        let request = crate::attributes::GivenRequest {
            headers: vec![
                ("Authorization".into(), "Bearer sk-1".into()),
                ("authorization".into(), "Bearer sk-2".into()),
            ],
            ..Default::default()
        };
        let bearer_only = [ApiKeySource::Bearer("authorization".into())];
        assert_eq!(read_api_key(&bearer_only, &request), None);
    }

    #[test]
    fn sources_are_checked_and_normalised() {
        let compiled = compile_sources(vec![
            ApiKeySource::Header("X-Api-Key".into()),
            ApiKeySource::Bearer("Authorization".into()),
        ])
        .unwrap();
        assert_eq!(compiled, sdk_sources());
        let err = |sources| compile_sources(sources).unwrap_err();
        let (at, why) = err(vec![]);
        assert_eq!(at, ".api_key");
        assert!(why.starts_with("must list"), "{why}");
        assert_eq!(
            err(vec![ApiKeySource::Bearer("bad name".into())]).0,
            ".api_key[0].bearer"
        );
        let twice = vec![
            ApiKeySource::Header("x-api-key".into()),
            ApiKeySource::Header("X-API-KEY".into()),
        ];
        assert_eq!(
            err(twice),
            (
                ".api_key[1]".into(),
                "header \"x-api-key\" is listed twice".into()
            )
        );
        let many = (0..9).map(|i| ApiKeySource::Header(format!("x-{i}"))).collect();
        assert_eq!(err(many), (".api_key".into(), "at most 8 places, not 9".into()));
    }

    #[test]
    fn one_key_is_one_counter_whichever_header_carries_it() {
        use crate::keys::{counter_key, KeyPart};
        let parts = [KeyPart::ApiKey(sdk_sources())];
        let by = |name: &str, value: &str| {
            counter_key("llm", &parts, &FakeRequest::get("/").with_header(name, value), 0)
        };
        let sent_as_x_api_key = by("x-api-key", "sk-1");
        assert!(sent_as_x_api_key.is_some());
        assert!(!sent_as_x_api_key.as_deref().unwrap().contains("sk-1"));
        assert_eq!(by("authorization", "Bearer sk-1"), sent_as_x_api_key);
        assert_eq!(by("authorization", "bearer sk-1"), sent_as_x_api_key);
        assert_ne!(by("authorization", "Bearer sk-2"), sent_as_x_api_key);
        assert_eq!(by("authorization", "Basic sk-1"), None);
        // As a `header` part keys it: a rule moving to `api_key` keeps its counters.
        let header = [KeyPart::Header("x-api-key".into())];
        let request = FakeRequest::get("/").with_header("x-api-key", "sk-1");
        assert_eq!(counter_key("llm", &header, &request, 0), sent_as_x_api_key);
    }

    fn config_with_key(key: &str) -> String {
        format!(
            r#"{{"shim_cluster": "c", "rules": [
                {{"name": "a", "key": ["client_ip"], "limit": 5, "period": "1s"}},
                {{"name": "llm", "key": ["method", {key}], "limit": 5, "period": "1s"}}
            ]}}"#
        )
    }

    #[test]
    fn the_configuration_reads_api_key_parts() {
        use crate::config::FilterConfig;
        let json = config_with_key(r#"{"api_key": [{"header": "X-Api-Key"}, {"bearer": "Authorization"}]}"#);
        let config = FilterConfig::from_json(json.as_bytes()).unwrap();
        assert_eq!(
            config.rules[1].key[1],
            crate::keys::KeyPart::ApiKey(sdk_sources())
        );
    }

    #[test]
    fn each_bad_api_key_part_names_its_field() {
        use crate::config::FilterConfig;
        let cases = [
            (
                r#"{"api_key": []}"#,
                "rules[1].key[1].api_key",
                "must list at least one",
            ),
            (
                r#"{"api_key": "x-api-key"}"#,
                "rules[1].key[1].api_key",
                "expected a sequence",
            ),
            (
                r#"{"api_key": [{"header": "x-api-key"}, {"basic": "authorization"}]}"#,
                "rules[1].key[1].api_key[1]",
                "unknown variant `basic`, expected `header` or `bearer`",
            ),
            (
                r#"{"api_key": [{"bearer": "authorization", "header": "x"}]}"#,
                "rules[1].key[1].api_key[0]",
                "",
            ),
            (
                r#"{"api_key": [{"header": "x-api-key"}, {"bearer": "auth orization"}]}"#,
                "rules[1].key[1].api_key[1].bearer",
                "not a valid HTTP header name",
            ),
            (
                r#"{"api_key": [{"bearer": "authorization"}, {"bearer": "Authorization"}]}"#,
                "rules[1].key[1].api_key[1]",
                "listed twice",
            ),
        ];
        for (key, field, reason) in cases {
            let json = config_with_key(key);
            let err = FilterConfig::from_json(json.as_bytes()).expect_err(&json);
            assert!(
                err.field == field && err.reason.contains(reason),
                "{key}: got {err}, expected {field}: ...{reason}..."
            );
        }
    }
}
