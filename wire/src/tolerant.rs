//! How a shim reads a batch from a filter that states a version it serves
//! ([`crate::version`]): a check, a return or a settlement with a field this release
//! does not know is set aside, not refused with the whole batch. Each check set aside is
//! answered as not supported (naming the field) while its request's other checks are
//! decided; a return or settlement set aside is not applied and is named in the answer's
//! `unsupported`. Anything else that does not parse (unknown fields of the batch or of
//! a request, wrong types, garbage) is still refused whole, as from any client.

use crate::{BatchCheckRequest, Check, InvalidRequest, Settlement, TokenReturn, UnsupportedCheck};
use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde_json::{Map, Value};

/// A batch as read, and what of it was set aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TolerantBatch {
    /// The batch without what was set aside.
    pub batch: BatchCheckRequest,
    /// Per request (in order), the checks set aside, by their position in the request
    /// as sent.
    pub unsupported: Vec<Vec<UnsupportedCheck>>,
    /// Returns and settlements set aside, each as `returns[I]: FIELD`.
    pub skipped: Vec<String>,
}

/// Reads a batch, setting aside each check, return or settlement with unknown fields.
pub fn parse_batch(body: &[u8]) -> Result<TolerantBatch, InvalidRequest> {
    let invalid = |e: serde_json::Error| InvalidRequest(format!("invalid batch: {e}"));
    let mut value: Value = serde_json::from_slice(body).map_err(invalid)?;
    let mut unsupported = Vec::new();
    let mut skipped = Vec::new();
    if let Some(batch) = value.as_object_mut() {
        if let Some(requests) = batch.get_mut("requests").and_then(Value::as_array_mut) {
            for request in requests.iter_mut() {
                let checks = request.get_mut("checks").and_then(Value::as_array_mut);
                let set_aside = checks.map(|checks| set_aside(checks, field_names::<Check>()));
                unsupported.push(
                    set_aside
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(position, field)| UnsupportedCheck { position, field })
                        .collect(),
                );
            }
        }
        for (list, known) in [
            ("returns", field_names::<TokenReturn>()),
            ("settlements", field_names::<Settlement>()),
        ] {
            if let Some(items) = batch.get_mut(list).and_then(Value::as_array_mut) {
                skipped.extend(
                    set_aside(items, known)
                        .into_iter()
                        .map(|(index, field)| format!("{list}[{index}]: {field}")),
                );
            }
        }
    }
    let batch: BatchCheckRequest = serde_json::from_value(value).map_err(invalid)?;
    // A request the parse could not see into fails its parse above; otherwise the two
    // lists line up.
    unsupported.resize(batch.requests.len(), Vec::new());
    Ok(TolerantBatch {
        batch,
        unsupported,
        skipped,
    })
}

/// Removes the objects of `items` that have fields outside `known`; returns each one's
/// index as sent and its unknown fields, comma-separated.
fn set_aside(items: &mut Vec<Value>, known: &[&str]) -> Vec<(usize, String)> {
    let mut removed = Vec::new();
    let mut index = 0;
    items.retain(|item| {
        let unknown = item.as_object().map(|fields| unknown_fields(fields, known));
        index += 1;
        match unknown {
            Some(unknown) if !unknown.is_empty() => {
                removed.push((index - 1, unknown));
                false
            }
            _ => true,
        }
    });
    removed
}

fn unknown_fields(fields: &Map<String, Value>, known: &[&str]) -> String {
    let unknown: Vec<&str> = fields
        .keys()
        .map(String::as_str)
        .filter(|name| !known.contains(name))
        .collect();
    unknown.join(", ")
}

/// The field names a struct's derived `Deserialize` accepts, read from the derive
/// itself so that they can never drift from the struct.
fn field_names<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldNames(&mut names));
    names
}

/// A deserializer that only records the fields a struct asks for.
struct FieldNames<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("fields recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn field_names_come_from_the_derive() {
        let names = field_names::<Check>();
        for field in [
            "key",
            "algorithm",
            "limit",
            "period_ms",
            "cost",
            "shadow",
            "lease",
            "calendar",
        ] {
            assert!(names.contains(&field), "{field} in {names:?}");
        }
        assert!(field_names::<Settlement>().contains(&"actual"));
        assert!(field_names::<TokenReturn>().contains(&"amount"));
    }

    #[test]
    fn a_check_with_an_unknown_field_is_set_aside_and_named() {
        let body = br#"{"requests":[
            {"checks":[{"key":"a","limit":5,"period_ms":1000},
                       {"key":"b","limit":5,"period_ms":1000,"priority":2,"burst":1},
                       {"key":"c","limit":5,"period_ms":1000}]},
            {"checks":[{"key":"d","limit":5,"period_ms":1000}]}],
          "returns":[{"key":"e","limit":5,"period_ms":1000,"amount":1,"epoch":3}],
          "settlements":[{"key":"f","limit":5,"period_ms":1000,"charged":1,"actual":2}]}"#;
        let parsed = parse_batch(body).unwrap();
        let keys: Vec<&str> = parsed.batch.requests[0]
            .checks
            .iter()
            .map(|c| c.key.as_str())
            .collect();
        assert_eq!(keys, ["a", "c"]);
        assert_eq!(
            parsed.unsupported,
            vec![
                vec![UnsupportedCheck {
                    position: 1,
                    field: "burst, priority".into()
                }],
                vec![]
            ]
        );
        assert!(parsed.batch.returns.is_empty());
        assert_eq!(parsed.batch.settlements.len(), 1);
        assert_eq!(parsed.skipped, ["returns[0]: epoch"]);
    }

    #[test]
    fn what_is_not_a_check_field_is_still_refused_whole() {
        for (body, named) in [
            (&br#"{"requests":[],"returns":[],"extra":1}"#[..], "extra"),
            (br#"{"requests":[{"checks":[],"priority":1}]}"#, "priority"),
            (
                br#"{"requests":[{"checks":[{"key":"a","limit":"5","period_ms":1}]}]}"#,
                "invalid type",
            ),
            (
                br#"{"requests":[{"checks":[{"key":"a","period_ms":1,"x":1}, 7]}]}"#,
                "invalid type",
            ),
            (b"garbage", "invalid batch"),
            (b"[1,2]", "invalid type"),
        ] {
            let err = parse_batch(body).unwrap_err();
            assert!(err.0.contains(named), "{err} should name {named}");
        }
        let nested = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert!(parse_batch(nested.as_bytes()).is_err());
    }
}
