//! A descriptor's `metadata` (any YAML mapping), and the response's dynamic metadata that
//! returns it, as envoyproxy/ratelimit builds it with RESPONSE_DYNAMIC_METADATA
//! (`--rls-response-metadata` here): `domain`, `descriptors` (each request descriptor's
//! `entries` as `key=value`, its `limit` override and `hitsAddend` when sent), the
//! request's `hitsAddend` when not 0, and `metadata`: the metadata of every limit that
//! passed (not over, not unlimited), merged in the request's order (the first value of a
//! field wins; two mappings merge field by field). Envoy keeps it as the filter's
//! dynamic metadata (`envoy.filters.http.ratelimit`), for access logs and later filters.

use crate::envoy_api::messages::protobuf::{Kind, ListValue, Struct, Value};
use crate::envoy_api::messages::ratelimit::{RateLimitDescriptor, RateLimitRequest};
use serde_yaml::Value as Yaml;

/// A descriptor's `metadata` field as a `google.protobuf.Struct`: `None` when absent or
/// empty, an error (naming `at`) when it is not a mapping of plain YAML values.
pub fn load(value: Option<&Yaml>, at: &str) -> Result<Option<Struct>, String> {
    match value {
        None | Some(Yaml::Null) => Ok(None),
        Some(Yaml::Mapping(map)) if map.is_empty() => Ok(None),
        Some(map @ Yaml::Mapping(_)) => match to_value(map, at)?.kind {
            Some(Kind::StructValue(fields)) => Ok(Some(fields)),
            _ => Err(format!("{at}: must be a mapping")),
        },
        Some(_) => Err(format!("{at}: must be a mapping")),
    }
}

fn to_value(value: &Yaml, at: &str) -> Result<Value, String> {
    let kind = match value {
        Yaml::Null => Kind::NullValue(0),
        Yaml::Bool(b) => Kind::BoolValue(*b),
        // JSON's numbers, as `structpb` makes them: every number a double.
        Yaml::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Yaml::String(s) => Kind::StringValue(s.clone()),
        Yaml::Sequence(items) => Kind::ListValue(ListValue {
            values: items
                .iter()
                .enumerate()
                .map(|(i, item)| to_value(item, &format!("{at}[{i}]")))
                .collect::<Result<_, _>>()?,
        }),
        Yaml::Mapping(map) => {
            let mut fields = std::collections::BTreeMap::new();
            for (key, item) in map {
                let key = match key {
                    Yaml::String(s) => s.clone(),
                    Yaml::Number(n) => n.to_string(),
                    Yaml::Bool(b) => b.to_string(),
                    _ => return Err(format!("{at}: a key must be a string")),
                };
                let item = to_value(item, &format!("{at}.{key}"))?;
                fields.insert(key, item);
            }
            Kind::StructValue(Struct { fields })
        }
        Yaml::Tagged(_) => return Err(format!("{at}: a tagged value (!tag) is not metadata")),
    };
    Ok(Value::of(kind))
}

/// The response's dynamic metadata for `request`, given the metadata of each descriptor's
/// limit that passed (`None` for the others), in the request's order.
pub fn response_metadata<'a>(
    request: &RateLimitRequest,
    passed: impl IntoIterator<Item = Option<&'a Struct>>,
) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    let text = |s: String| Value::of(Kind::StringValue(s));
    fields.insert("domain".to_string(), text(request.domain.clone()));
    let descriptors = request.descriptors.iter().map(descriptor_value).collect();
    fields.insert(
        "descriptors".to_string(),
        Value::of(Kind::ListValue(ListValue { values: descriptors })),
    );
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_string(),
            Value::of(Kind::NumberValue(f64::from(request.hits_addend))),
        );
    }
    let mut merged = Struct::default();
    for metadata in passed.into_iter().flatten() {
        merge(&mut merged, metadata);
    }
    if !merged.fields.is_empty() {
        fields.insert("metadata".to_string(), Value::of(Kind::StructValue(merged)));
    }
    Struct { fields }
}

fn descriptor_value(descriptor: &RateLimitDescriptor) -> Value {
    let mut fields = std::collections::BTreeMap::new();
    let entries = descriptor
        .entries
        .iter()
        .map(|entry| Value::of(Kind::StringValue(format!("{}={}", entry.key, entry.value))))
        .collect();
    fields.insert(
        "entries".to_string(),
        Value::of(Kind::ListValue(ListValue { values: entries })),
    );
    if let Some(limit) = &descriptor.limit {
        // The override in protobuf's text format, as upstream's `String()` writes it.
        let text = format!(
            "requests_per_unit:{} unit:{}",
            limit.requests_per_unit,
            override_unit_name(limit.unit)
        );
        fields.insert("limit".to_string(), Value::of(Kind::StringValue(text)));
    }
    if let Some(hits) = &descriptor.hits_addend {
        fields.insert(
            "hitsAddend".to_string(),
            Value::of(Kind::NumberValue(hits.value as f64)),
        );
    }
    Value::of(Kind::StructValue(Struct { fields }))
}

/// `envoy.type.v3.RateLimitUnit`'s names.
fn override_unit_name(unit: i32) -> String {
    let names = [
        "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK",
    ];
    usize::try_from(unit)
        .ok()
        .and_then(|i| names.get(i))
        .map_or_else(|| unit.to_string(), |name| name.to_string())
}

/// Adds `src`'s fields to `dest`: a field `dest` has already stays, unless both are
/// mappings, which merge.
fn merge(dest: &mut Struct, src: &Struct) {
    for (key, value) in &src.fields {
        match (dest.fields.get_mut(key), &value.kind) {
            (None, _) => {
                dest.fields.insert(key.clone(), value.clone());
            }
            (
                Some(Value {
                    kind: Some(Kind::StructValue(existing)),
                }),
                Some(Kind::StructValue(more)),
            ) => merge(existing, more),
            (Some(_), _) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy_api::messages::protobuf::UInt64Value;
    use crate::envoy_api::messages::ratelimit::{Entry, RateLimitOverride};

    fn yaml(text: &str) -> Yaml {
        serde_yaml::from_str(text).unwrap()
    }

    fn field<'a>(s: &'a Struct, path: &[&str]) -> &'a Kind {
        let mut at = s;
        for (i, key) in path.iter().enumerate() {
            let kind = at.fields[*key].kind.as_ref().unwrap();
            if i + 1 == path.len() {
                return kind;
            }
            let Kind::StructValue(next) = kind else {
                panic!("{key}")
            };
            at = next;
        }
        unreachable!()
    }

    #[test]
    fn yaml_metadata_becomes_a_struct_and_bad_metadata_is_named() {
        let loaded = load(
            Some(&yaml("service: { name: svc, weight: 2, tags: [a, true, null] }")),
            "descriptors[0].metadata",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            field(&loaded, &["service", "name"]),
            &Kind::StringValue("svc".into())
        );
        assert_eq!(field(&loaded, &["service", "weight"]), &Kind::NumberValue(2.0));
        let Kind::ListValue(tags) = field(&loaded, &["service", "tags"]) else {
            panic!()
        };
        assert_eq!(tags.values.len(), 3);
        assert_eq!(load(None, "m").unwrap(), None);
        assert_eq!(load(Some(&yaml("{}")), "m").unwrap(), None);
        let refused = load(Some(&yaml("[1]")), "descriptors[2].metadata").unwrap_err();
        assert!(
            refused.contains("descriptors[2].metadata: must be a mapping"),
            "{refused}"
        );
        let refused = load(Some(&yaml("a: !x 1")), "m").unwrap_err();
        assert!(refused.contains("m.a: a tagged value"), "{refused}");
    }

    #[test]
    fn the_response_metadata_names_the_request_and_merges_what_passed() {
        let first = load(Some(&yaml("svc: { name: one }\nonly: first")), "m").unwrap();
        let second = load(Some(&yaml("svc: { name: two, tier: gold }\nonly: second")), "m").unwrap();
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "service".into(),
                        value: "one".into(),
                    }],
                    hits_addend: Some(UInt64Value { value: 3 }),
                    ..Default::default()
                },
                RateLimitDescriptor {
                    limit: Some(RateLimitOverride {
                        requests_per_unit: 7,
                        unit: 3,
                    }),
                    ..Default::default()
                },
            ],
            hits_addend: 2,
        };
        let metadata = response_metadata(&request, [first.as_ref(), second.as_ref()]);
        assert_eq!(field(&metadata, &["domain"]), &Kind::StringValue("edge".into()));
        assert_eq!(field(&metadata, &["hitsAddend"]), &Kind::NumberValue(2.0));
        assert_eq!(
            field(&metadata, &["metadata", "svc", "name"]),
            &Kind::StringValue("one".into())
        );
        assert_eq!(
            field(&metadata, &["metadata", "svc", "tier"]),
            &Kind::StringValue("gold".into())
        );
        assert_eq!(
            field(&metadata, &["metadata", "only"]),
            &Kind::StringValue("first".into())
        );
        let Kind::ListValue(descriptors) = field(&metadata, &["descriptors"]) else {
            panic!()
        };
        let Some(Kind::StructValue(one)) = &descriptors.values[0].kind else {
            panic!()
        };
        let Kind::ListValue(entries) = field(one, &["entries"]) else {
            panic!()
        };
        assert_eq!(
            entries.values[0].kind,
            Some(Kind::StringValue("service=one".into()))
        );
        assert_eq!(field(one, &["hitsAddend"]), &Kind::NumberValue(3.0));
        let Some(Kind::StructValue(two)) = &descriptors.values[1].kind else {
            panic!()
        };
        assert_eq!(
            field(two, &["limit"]),
            &Kind::StringValue("requests_per_unit:7 unit:HOUR".into())
        );
        let none_passed = response_metadata(&request, [None, None]);
        assert!(!none_passed.fields.contains_key("metadata"));
    }
}
