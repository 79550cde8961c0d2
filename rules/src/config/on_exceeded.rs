//! A rule's `on_exceeded`: what a request over its limit gets. `"refuse"` (the default)
//! is the 429; `{"spill": {"header": NAME, "value": VALUE}}` sets that request header
//! instead and lets Envoy route the request again, so that a route matching the header
//! sends it to a fallback (docs/CONFIG.md, "Spill-over").

use super::ConfigError;
use serde_json::Value;

/// What a rule does with a request over its limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum OnExceeded {
    /// Answer it with the refusal (429 and its headers).
    #[default]
    Refuse,
    /// Set this request header and send the request on, rerouted.
    Spill(SpillHeader),
}

/// The request header a spill-over sets (lower-case name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillHeader {
    pub name: String,
    pub value: String,
}

/// The longest spill header value.
const MAX_VALUE_LEN: usize = 256;

/// Headers whose change would break the request's framing or its connection, not
/// choose its route: never a spill header.
const FRAMING_HEADERS: [&str; 7] = [
    "connection",
    "content-length",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Compiles a rule's `on_exceeded` (`at` is the rule's path). A shadow rule never
/// refuses, so it has nothing to spill.
pub(super) fn compile_on_exceeded(
    at: &str,
    raw: Option<Value>,
    shadow: bool,
) -> Result<OnExceeded, ConfigError> {
    let field = format!("{at}.on_exceeded");
    let spill = match raw {
        None => return Ok(OnExceeded::Refuse),
        Some(Value::String(name)) if name == "refuse" => return Ok(OnExceeded::Refuse),
        Some(Value::Object(mut object)) if object.len() == 1 && object.contains_key("spill") => {
            object.remove("spill").unwrap_or_default()
        }
        Some(_) => {
            return Err(ConfigError::new(
                field,
                r#"must be "refuse" or {"spill": {"header": NAME, "value": VALUE}}"#,
            ))
        }
    };
    let field = format!("{field}.spill");
    let Value::Object(spill) = spill else {
        return Err(ConfigError::new(
            field,
            r#"must be {"header": NAME, "value": VALUE}"#,
        ));
    };
    if let Some(unknown) = spill.keys().find(|key| *key != "header" && *key != "value") {
        return Err(ConfigError::new(
            format!("{field}.{unknown}"),
            "unknown field: a spill takes `header` and `value`",
        ));
    }
    let text = |name: &str| match spill.get(name) {
        Some(Value::String(text)) => Ok(text.clone()),
        _ => Err(ConfigError::new(format!("{field}.{name}"), "must be a string")),
    };
    let name = text("header")?.to_ascii_lowercase();
    let value = text("value")?;
    if !is_token(&name) {
        return Err(ConfigError::new(
            format!("{field}.header"),
            "must be a header name (letters, digits and !#$%&'*+-.^_`|~; no pseudo-header)",
        ));
    }
    if FRAMING_HEADERS.contains(&name.as_str()) {
        return Err(ConfigError::new(
            format!("{field}.header"),
            format!("{name} frames the request, it cannot route it"),
        ));
    }
    if value.is_empty() || value.len() > MAX_VALUE_LEN || !value.bytes().all(|b| (b' '..=b'~').contains(&b)) {
        return Err(ConfigError::new(
            format!("{field}.value"),
            format!("must be 1..={MAX_VALUE_LEN} printable ASCII characters"),
        ));
    }
    if shadow {
        return Err(ConfigError::new(
            format!("{at}.on_exceeded"),
            "a shadow rule never refuses, so it never spills: drop `shadow` or `on_exceeded`",
        ));
    }
    Ok(OnExceeded::Spill(SpillHeader { name, value }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn compile(raw: Value) -> Result<OnExceeded, ConfigError> {
        compile_on_exceeded("rules[0]", Some(raw), false)
    }

    #[test]
    fn refuse_is_the_default_and_a_spill_names_its_header() {
        assert_eq!(
            compile_on_exceeded("rules[0]", None, false),
            Ok(OnExceeded::Refuse)
        );
        assert_eq!(compile(json!("refuse")), Ok(OnExceeded::Refuse));
        assert_eq!(
            compile(json!({"spill": {"header": "X-Pool", "value": "fallback"}})),
            Ok(OnExceeded::Spill(SpillHeader {
                name: "x-pool".into(),
                value: "fallback".into()
            }))
        );
    }

    #[test]
    fn what_cannot_spill_is_refused_naming_the_field() {
        let field = |raw: Value| compile(raw).unwrap_err().field;
        assert_eq!(field(json!("spill")), "rules[0].on_exceeded");
        assert_eq!(field(json!({"spill": "x-pool"})), "rules[0].on_exceeded.spill");
        assert_eq!(
            field(json!({"spill": {"header": "x-pool", "value": "a", "status": 200}})),
            "rules[0].on_exceeded.spill.status"
        );
        for header in [":authority", "content-length", "bad header", ""] {
            assert_eq!(
                field(json!({"spill": {"header": header, "value": "a"}})),
                "rules[0].on_exceeded.spill.header",
                "{header}"
            );
        }
        for value in ["", "line\nbreak", &"v".repeat(257)] {
            assert_eq!(
                field(json!({"spill": {"header": "x-pool", "value": value}})),
                "rules[0].on_exceeded.spill.value"
            );
        }
        let shadow = compile_on_exceeded(
            "rules[0]",
            Some(json!({"spill": {"header": "x-pool", "value": "a"}})),
            true,
        );
        assert_eq!(shadow.unwrap_err().field, "rules[0].on_exceeded");
    }
}
