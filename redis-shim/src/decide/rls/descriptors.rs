//! One level of `--rls-config`'s descriptors read into the domain's tree
//! ([`super::config::Node`]), field by field, each refusal naming the field's path:
//! `key`, `value` (a wildcard where it holds `*`, [`super::wildcard`]), `rate_limit`,
//! the descriptor's switches (`shadow_mode`, `quota_mode`, `detailed_metric`,
//! `value_to_metric`, `share_threshold`), its `metadata` ([`super::metadata`]) and the
//! nested `descriptors`.

use super::config::{Limit, Node, Rate, ShareRule, Unit};
use super::metadata;
use super::shared::Position;
use super::wildcard::Wildcard;
use super::yaml_fields::{bool_field, known_fields, mapping, string_field};
use ratelimit_wire::{Algorithm, MAX_LIMIT};
use serde_yaml::{Mapping, Value};
use std::sync::Arc;

/// What a level of descriptors needs to know beyond its own fields.
pub struct Context<'a> {
    pub share: &'a ShareRule<'a>,
    /// Whether every descriptor above this level has a `value`.
    pub above_all_valued: bool,
}

/// Loads the descriptor list `list` (at `at` in the file, `path` in the domain's tree)
/// into `parent`'s children. A descriptor refused is skipped with its first error in
/// `errors`, and the others are read on, so that one pass names every bad descriptor.
pub fn load_descriptors(
    parent: &mut Node,
    list: Option<&Value>,
    at: &str,
    path: &str,
    context: &Context,
    errors: &mut Vec<String>,
) {
    let list = match list {
        None | Some(Value::Null) => return,
        Some(Value::Sequence(list)) => list,
        Some(_) => return errors.push(format!("{at}: must be a list")),
    };
    // A value counted apart beside a value-less descriptor sharing a filter rule would
    // give that client one limit per path: the filter counts it under the rule. (A value
    // unlimited here is unlimited already: the filter's limit only narrows it.)
    let mut valued_keys = std::collections::HashSet::new();
    let mut shared_keys = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let sets = Sets {
            valued_keys: &mut valued_keys,
            shared_keys: &mut shared_keys,
        };
        match load_descriptor(parent, item, &at, path, context, sets, errors) {
            Ok((final_key, node)) => {
                if final_key.contains('*') {
                    parent.wildcards.push(Wildcard::new(&final_key));
                }
                parent.children.insert(final_key, node);
            }
            Err(error) => errors.push(error),
        }
    }
    for (key, limit_at) in shared_keys {
        if valued_keys.contains(&key) {
            errors.push(format!(
                "{limit_at}.filter_rule: another descriptor counts a value of {key:?} apart; the filter counts every value under the rule's one limit, so that client would pass both"
            ));
        }
    }
}

/// What one level's descriptors collect for the check after them: the keys that count
/// a value apart, and the `filter_rule`s shared (their key and where).
struct Sets<'a> {
    valued_keys: &'a mut std::collections::HashSet<String>,
    shared_keys: &'a mut Vec<(String, String)>,
}

/// One descriptor (`item`, at `at`) and its key in `parent`; its nested descriptors'
/// errors go to `errors`.
fn load_descriptor(
    parent: &Node,
    item: &Value,
    at: &str,
    path: &str,
    context: &Context,
    sets: Sets,
    errors: &mut Vec<String>,
) -> Result<(String, Node), String> {
    let map = mapping(item, at)?;
    let field_at = format!("{at}.");
    known_fields(
        map,
        &field_at,
        &[
            "key",
            "value",
            "rate_limit",
            "descriptors",
            "shadow_mode",
            "quota_mode",
            "detailed_metric",
            "value_to_metric",
            "share_threshold",
            "metadata",
        ],
    )?;
    let key = string_field(map, "key", &field_at)?;
    if key.is_empty() {
        return Err(format!("{at}.key: must not be empty"));
    }
    let value = string_field(map, "value", &field_at)?;
    let position = Position {
        key: &key,
        has_value: !value.is_empty(),
        above_all_valued: context.above_all_valued,
    };
    let child_context = Context {
        share: context.share,
        above_all_valued: context.above_all_valued && !value.is_empty(),
    };
    let final_key = if value.is_empty() {
        key.clone()
    } else {
        format!("{key}_{value}")
    };
    let node_path = format!("{path}.{final_key}");
    if parent.children.contains_key(&final_key) {
        return Err(format!("{at}: duplicate descriptor {node_path:?}"));
    }
    let share_threshold = bool_field(map, "share_threshold", &field_at)?;
    // As upstream: the `*` may be anywhere in `key_value`, the key included.
    if share_threshold && !final_key.contains('*') {
        return Err(format!(
            "{at}.share_threshold: only a wildcard value (holding `*`) can share its threshold, not {final_key:?}"
        ));
    }
    let mut node = Node {
        share_threshold,
        value_to_metric: bool_field(map, "value_to_metric", &field_at)?,
        ..Node::default()
    };
    let flags = Flags {
        shadow_mode: bool_field(map, "shadow_mode", &field_at)?,
        quota_mode: bool_field(map, "quota_mode", &field_at)?,
        detailed_metric: bool_field(map, "detailed_metric", &field_at)?,
    };
    let metadata = metadata::load(map.get("metadata"), &format!("{at}.metadata"))?;
    if let Some(rate_limit) = map.get("rate_limit").filter(|v| !v.is_null()) {
        let limit_at = format!("{at}.rate_limit");
        let rate_limit = mapping(rate_limit, &limit_at)?;
        let mut limit = load_limit(rate_limit, &limit_at, node_path.clone(), &flags)?;
        limit.metadata = metadata.map(Arc::new);
        if let Some(rule) = rate_limit.get("filter_rule").filter(|v| !v.is_null()) {
            let rule = rule
                .as_str()
                .ok_or_else(|| format!("{limit_at}.filter_rule: must be a rule's name"))?;
            limit.shared = Some((context.share)(rule, &limit, &position, &limit_at)?);
            sets.shared_keys.push((key.clone(), limit_at));
        }
        if limit.rate.is_some() && !value.is_empty() {
            sets.valued_keys.insert(key.clone());
        }
        node.limit = Some(limit);
    }
    load_descriptors(
        &mut node,
        map.get("descriptors"),
        &format!("{at}.descriptors"),
        &node_path,
        &child_context,
        errors,
    );
    Ok((final_key, node))
}

/// A descriptor's own switches, which its `rate_limit` carries.
struct Flags {
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
}

fn load_limit(map: &Mapping, at: &str, path: String, flags: &Flags) -> Result<Limit, String> {
    let field_at = format!("{at}.");
    known_fields(
        map,
        &field_at,
        &[
            "unit",
            "requests_per_unit",
            "unlimited",
            "name",
            "replaces",
            "algorithm",
            "filter_rule",
        ],
    )?;
    let unlimited = bool_field(map, "unlimited", &field_at)?;
    let unit_name = string_field(map, "unit", &field_at)?;
    let rate = if unlimited {
        if !unit_name.is_empty() {
            return Err(format!("{at}.unit: an unlimited rate_limit takes no unit"));
        }
        None
    } else {
        let unit = Unit::parse(&unit_name).ok_or_else(|| {
            format!("{at}.unit: {unit_name:?} is not one of second, minute, hour, day, week, month, year")
        })?;
        let requests_per_unit = match map.get("requests_per_unit") {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) => n
                .as_u64()
                .filter(|&n| n <= MAX_LIMIT)
                .ok_or_else(|| format!("{at}.requests_per_unit: must be 0..={MAX_LIMIT}"))?,
            Some(_) => return Err(format!("{at}.requests_per_unit: must be a whole number")),
        };
        let algorithm = match string_field(map, "algorithm", &field_at)?.as_str() {
            "" | "fixed_window" => Algorithm::FixedWindow,
            "token_bucket" => Algorithm::TokenBucket,
            other => {
                return Err(format!(
                    "{at}.algorithm: {other:?} is not fixed_window (the default) or token_bucket"
                ))
            }
        };
        Some(Rate {
            requests_per_unit: u32::try_from(requests_per_unit).unwrap_or(u32::MAX),
            unit,
            algorithm,
        })
    };
    let name = string_field(map, "name", &field_at)?;
    let mut replaces = Vec::new();
    match map.get("replaces") {
        None | Some(Value::Null) => {}
        Some(Value::Sequence(list)) => {
            for (i, entry) in list.iter().enumerate() {
                let entry_at = format!("{at}.replaces[{i}]");
                let entry = mapping(entry, &entry_at)?;
                known_fields(entry, &format!("{entry_at}."), &["name"])?;
                let replaced = string_field(entry, "name", &format!("{entry_at}."))?;
                if replaced.is_empty() {
                    return Err(format!("{entry_at}.name: must not be empty"));
                }
                if replaced == name {
                    return Err(format!("{entry_at}.name: a limit cannot replace itself"));
                }
                replaces.push(replaced);
            }
        }
        Some(_) => return Err(format!("{at}.replaces: must be a list of {{name: ...}}")),
    }
    Ok(Limit {
        path,
        name,
        rate,
        shadow_mode: flags.shadow_mode,
        quota_mode: flags.quota_mode,
        replaces,
        detailed_metric: flags.detailed_metric,
        metadata: None,
        shared: None,
    })
}
