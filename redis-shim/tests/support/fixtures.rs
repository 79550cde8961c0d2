//! What many tests share: check bodies and their answers, YAML files of the repository.

use super::http::{post, Reply};
use serde::Deserialize as _;
use serde_json::{json, Value};
use std::fs;
use std::path::Path;

/// The algorithms' wire names.
pub const ALGORITHMS: [&str; 4] = [
    "token_bucket",
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
];

/// One check of a `/v1/check` body; add fields (`cost`, `lease`, `shadow`) with
/// [`with`].
pub fn check_of(key: &str, algorithm: &str, limit: u64, period_ms: u64) -> Value {
    json!({ "key": key, "algorithm": algorithm, "limit": limit, "period_ms": period_ms })
}

/// `check` with one more field.
pub fn with(mut check: Value, field: &str, value: Value) -> Value {
    check[field] = value;
    check
}

/// A `/v1/check` body of these checks.
pub fn checks_body(checks: &[Value]) -> String {
    json!({ "checks": checks }).to_string()
}

/// Posts checks to the shim and returns its answer, failing the test on anything but
/// a 200.
pub fn decide_at(url: &str, checks: &[Value]) -> Value {
    let reply = post(url, &[], &checks_body(checks));
    assert_eq!(reply.status, 200, "{reply:?}");
    serde_json::from_str(&reply.body).unwrap()
}

/// Replies that are 200s with `"allowed":true`.
pub fn count_allowed(replies: &[Reply]) -> usize {
    replies
        .iter()
        .filter(|r| r.status == 200 && r.body.starts_with(r#"{"allowed":true"#))
        .count()
}

/// Every document of a YAML file, as JSON values; panics naming the file on a parse error.
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| {
            let value = serde_yaml::Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
            serde_json::to_value(value)
                .unwrap_or_else(|e| panic!("{} is not plain data: {e}", path.display()))
        })
        .collect()
}

/// The one document of a YAML file, as a JSON value.
pub fn yaml_file(path: &Path) -> Value {
    let mut documents = yaml_documents(path);
    assert_eq!(documents.len(), 1, "{} should hold one document", path.display());
    documents.remove(0)
}
