//! Reading `--rls-config`'s YAML field by field ([`super::descriptors`]): each refusal
//! names the field's path, and a field neither envoyproxy/ratelimit nor the shim knows is
//! refused by name instead of ignored.

use serde_yaml::{Mapping, Value};

pub fn mapping<'a>(value: &'a Value, at: &str) -> Result<&'a Mapping, String> {
    value
        .as_mapping()
        .ok_or_else(|| format!("{at}: must be a mapping"))
}

/// Refuses a field not in `known`.
pub fn known_fields(map: &Mapping, at: &str, known: &[&str]) -> Result<(), String> {
    for field in map.keys() {
        let Some(field) = field.as_str() else {
            return Err(format!("{at}{field:?}: field names must be strings"));
        };
        if !known.contains(&field) {
            return Err(format!("{at}{field}: unknown field"));
        }
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
