//! Reading `--rls-config`'s YAML field by field ([`super::config`]): each refusal names the
//! field's path, and the fields envoyproxy/ratelimit knows but the shim does not run are
//! refused by name instead of ignored.

use serde_yaml::{Mapping, Value};

/// Fields envoyproxy/ratelimit accepts that the shim does not run: refused when set.
const UNSUPPORTED: [&str; 4] = ["quota_mode", "value_to_metric", "share_threshold", "metadata"];

pub fn mapping<'a>(value: &'a Value, at: &str) -> Result<&'a Mapping, String> {
    value
        .as_mapping()
        .ok_or_else(|| format!("{at}: must be a mapping"))
}

/// Refuses a field not in `known` (naming the unsupported ones as such).
pub fn known_fields(map: &Mapping, at: &str, known: &[&str]) -> Result<(), String> {
    for (field, value) in map {
        let Some(field) = field.as_str() else {
            return Err(format!("{at}{field:?}: field names must be strings"));
        };
        if known.contains(&field) {
            continue;
        }
        let unset = matches!(value, Value::Null | Value::Bool(false));
        if UNSUPPORTED.contains(&field) {
            if unset {
                continue;
            }
            return Err(format!("{at}{field}: not supported by redis-shim (docs/RLS.md)"));
        }
        return Err(format!("{at}{field}: unknown field"));
    }
    Ok(())
}

pub fn string_field(map: &Mapping, field: &str, at: &str) -> Result<String, String> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        // YAML reads `value: 1` as a number; envoyproxy/ratelimit takes it as "1".
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(Value::Bool(b)) => Ok(b.to_string()),
        Some(_) => Err(format!("{at}{field}: must be a string")),
    }
}

pub fn bool_field(map: &Mapping, field: &str, at: &str) -> Result<bool, String> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{at}{field}: must be true or false")),
    }
}
