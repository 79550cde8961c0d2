//! `--rls-config`: envoyproxy/ratelimit's YAML configuration (one file, or every `.yaml`
//! and `.yml` file of a directory) loaded into [`RlsConfig`], each domain a tree of
//! descriptors. Read field by field rather than through serde, so that every refusal
//! names the file and the field's path, and so that the fields envoyproxy/ratelimit
//! knows but the shim does not run are refused by name instead of ignored.

use super::shared::{Position, SharedCounter};
pub use super::unit::Unit;
use super::yaml_fields::{bool_field, known_fields, mapping, string_field};
use ratelimit_wire::{Algorithm, MAX_LIMIT};
use serde_yaml::{Mapping, Value};
use std::collections::HashMap;
use std::path::Path;

/// Every domain's descriptor tree.
#[derive(Debug, Default)]
pub struct RlsConfig {
    pub domains: HashMap<String, Node>,
}

/// One level of a domain's descriptors: its children by `key_value` (or `key` alone for
/// a descriptor without a value, which matches any value), and its limit, if any.
#[derive(Debug, Default)]
pub struct Node {
    pub children: HashMap<String, Node>,
    pub limit: Option<Limit>,
}

impl Node {
    /// The child an entry goes down to: the one with its key and value, else the
    /// value-less one with its key.
    pub fn child(&self, key: &str, value: &str) -> Option<&Node> {
        self.children
            .get(&format!("{key}_{value}"))
            .or_else(|| self.children.get(key))
    }
}

/// A configured `rate_limit`.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// Where it is configured (`domain.key_value.key`), for logs and errors.
    pub path: String,
    /// `rate_limit.name` (empty when unnamed), which `replaces` refers to.
    pub name: String,
    /// None when `unlimited`.
    pub rate: Option<Rate>,
    pub shadow_mode: bool,
    pub replaces: Vec<String>,
    pub detailed_metric: bool,
    /// `filter_rule`: counted on that Wasm filter rule's counter (`super::filter_rule`).
    pub shared: Option<SharedCounter>,
}

/// A limit that counts: `requests_per_unit` per `unit`, by `algorithm`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub algorithm: Algorithm,
}

/// Links a `rate_limit.filter_rule` to the Wasm filter's rule: given the rule's name, the
/// limit, where its descriptor sits and the `rate_limit`'s path, the shared counter or why
/// the two would not count alike ([`super::filter_rule`]).
pub type ShareRule<'a> = dyn Fn(&str, &Limit, &Position, &str) -> Result<SharedCounter, String> + 'a;

/// The [`ShareRule`] without the filter's configuration: every `filter_rule` refused.
pub fn no_filter_config(_: &str, _: &Limit, _: &Position, at: &str) -> Result<SharedCounter, String> {
    Err(format!(
        "{at}.filter_rule: needs --rls-filter-config, the filter's plugin configuration"
    ))
}

/// Loads `path`: a file, or every `.yaml`/`.yml` file of a directory (in name order),
/// each `filter_rule` linked by `share`. Every file is read, so that the error names
/// each file refused (each with its first error, `file: path.in.yaml: why`), not only
/// the first one.
pub fn load(path: &Path, share: &ShareRule) -> Result<RlsConfig, Vec<String>> {
    let mut config = RlsConfig::default();
    let mut errors = Vec::new();
    for file in config_files(path).map_err(|e| vec![e])? {
        let added = std::fs::read_to_string(&file)
            .map_err(|e| e.to_string())
            .and_then(|text| config.add_file_sharing(&text, share));
        if let Err(e) = added {
            errors.push(format!("{}: {e}", file.display()));
        }
    }
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(errors)
    }
}

/// The files `path` names: itself, or every `.yaml`/`.yml` file of the directory, in
/// name order (symbolic links followed, as a Kubernetes ConfigMap's files are).
pub fn config_files(path: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<_> = std::fs::read_dir(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|file| file.is_file() && file.extension().is_some_and(|ext| ext == "yaml" || ext == "yml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!(
            "{}: no .yaml or .yml file in the directory",
            path.display()
        ));
    }
    Ok(files)
}

impl RlsConfig {
    /// Adds one file's domain; a domain already loaded is refused (as envoyproxy/ratelimit
    /// does without MERGE_DOMAIN_CONFIG).
    pub fn add_file(&mut self, text: &str) -> Result<(), String> {
        self.add_file_sharing(text, &no_filter_config)
    }

    /// As [`RlsConfig::add_file`], each `filter_rule` linked by `share`.
    pub fn add_file_sharing(&mut self, text: &str, share: &ShareRule) -> Result<(), String> {
        let root: Value = serde_yaml::from_str(text).map_err(|e| format!("not YAML: {e}"))?;
        let root = mapping(&root, "the file")?;
        known_fields(root, "", &["domain", "descriptors"])?;
        let domain = match root.get("domain") {
            Some(Value::String(domain)) if !domain.is_empty() => domain.clone(),
            _ => return Err("domain: a non-empty string is required".into()),
        };
        if self.domains.contains_key(&domain) {
            return Err(format!(
                "domain: {domain:?} is already configured by another file"
            ));
        }
        let mut node = Node::default();
        let context = Context {
            share,
            above_all_valued: true,
        };
        load_descriptors(
            &mut node,
            root.get("descriptors"),
            "descriptors",
            &domain,
            &context,
        )?;
        self.domains.insert(domain, node);
        Ok(())
    }

    /// One file's configuration, for tests.
    #[cfg(test)]
    pub fn from_yaml(text: &str) -> RlsConfig {
        let mut config = RlsConfig::default();
        config.add_file(text).unwrap();
        config
    }

    /// Every limit configured, for the warnings given at start.
    pub fn limits(&self) -> Vec<&Limit> {
        fn walk<'a>(node: &'a Node, out: &mut Vec<&'a Limit>) {
            out.extend(node.limit.as_ref());
            node.children.values().for_each(|child| walk(child, out));
        }
        let mut out = Vec::new();
        self.domains.values().for_each(|node| walk(node, &mut out));
        out
    }
}

/// What a level of descriptors needs to know beyond its own fields.
struct Context<'a> {
    share: &'a ShareRule<'a>,
    /// Whether every descriptor above this level has a `value`.
    above_all_valued: bool,
}

fn load_descriptors(
    parent: &mut Node,
    list: Option<&Value>,
    at: &str,
    path: &str,
    context: &Context,
) -> Result<(), String> {
    let list = match list {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Sequence(list)) => list,
        Some(_) => return Err(format!("{at}: must be a list")),
    };
    // A value counted apart beside a value-less descriptor sharing a filter rule would
    // give that client one limit per path: the filter counts it under the rule. (A value
    // unlimited here is unlimited already: the filter's limit only narrows it.)
    let mut valued_keys = std::collections::HashSet::new();
    let mut shared_keys = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let map = mapping(item, &at)?;
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
                "detailed_metric",
            ],
        )?;
        let key = string_field(map, "key", &field_at)?;
        if key.is_empty() {
            return Err(format!("{at}.key: must not be empty"));
        }
        let value = string_field(map, "value", &field_at)?;
        // envoyproxy/ratelimit matches a value holding `*` as a pattern; the shim would
        // match it literally, so it refuses it rather than count differently.
        if value.contains('*') {
            return Err(format!(
                "{at}.value: wildcard values ({value:?}) are not supported"
            ));
        }
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
        let mut node = Node::default();
        let shadow_mode = bool_field(map, "shadow_mode", &field_at)?;
        let detailed_metric = bool_field(map, "detailed_metric", &field_at)?;
        if let Some(rate_limit) = map.get("rate_limit").filter(|v| !v.is_null()) {
            let limit_at = format!("{at}.rate_limit");
            let rate_limit = mapping(rate_limit, &limit_at)?;
            let mut limit = load_limit(
                rate_limit,
                &limit_at,
                node_path.clone(),
                shadow_mode,
                detailed_metric,
            )?;
            if let Some(rule) = rate_limit.get("filter_rule").filter(|v| !v.is_null()) {
                let rule = rule
                    .as_str()
                    .ok_or_else(|| format!("{limit_at}.filter_rule: must be a rule's name"))?;
                limit.shared = Some((context.share)(rule, &limit, &position, &limit_at)?);
                shared_keys.push((key.clone(), limit_at));
            }
            if limit.rate.is_some() && !value.is_empty() {
                valued_keys.insert(key.clone());
            }
            node.limit = Some(limit);
        }
        load_descriptors(
            &mut node,
            map.get("descriptors"),
            &format!("{at}.descriptors"),
            &node_path,
            &child_context,
        )?;
        parent.children.insert(final_key, node);
    }
    for (key, limit_at) in shared_keys {
        if valued_keys.contains(&key) {
            return Err(format!(
                "{limit_at}.filter_rule: another descriptor counts a value of {key:?} apart; the filter counts every value under the rule's one limit, so that client would pass both"
            ));
        }
    }
    Ok(())
}

fn load_limit(
    map: &Mapping,
    at: &str,
    path: String,
    shadow_mode: bool,
    detailed_metric: bool,
) -> Result<Limit, String> {
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
        shadow_mode,
        replaces,
        detailed_metric,
        shared: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        RlsConfig::default().add_file(text).unwrap_err()
    }

    #[test]
    fn envoyproxy_ratelimit_fields_load() {
        let config = RlsConfig::from_yaml(
            r#"
domain: edge
descriptors:
  - key: api_key
    shadow_mode: true
    detailed_metric: true
    rate_limit: { unit: MINUTE, requests_per_unit: 10, name: per-key, replaces: [{ name: global }] }
  - key: internal
    value: "yes"
    rate_limit: { unlimited: true }
  - key: tenant
    descriptors:
      - key: user
        rate_limit: { unit: year, requests_per_unit: 0, algorithm: token_bucket }
"#,
        );
        let edge = &config.domains["edge"];
        let per_key = edge.children["api_key"].limit.as_ref().unwrap();
        assert_eq!(per_key.path, "edge.api_key");
        assert_eq!(per_key.name, "per-key");
        assert_eq!(per_key.replaces, ["global"]);
        assert!(per_key.shadow_mode && per_key.detailed_metric);
        assert_eq!(
            per_key.rate,
            Some(Rate {
                requests_per_unit: 10,
                unit: Unit::Minute,
                algorithm: Algorithm::FixedWindow
            })
        );
        assert_eq!(edge.children["internal_yes"].limit.as_ref().unwrap().rate, None);
        let user = edge.children["tenant"].children["user"].limit.as_ref().unwrap();
        assert_eq!(user.rate.unwrap().algorithm, Algorithm::TokenBucket);
        assert_eq!(config.limits().len(), 3);
    }

    #[test]
    fn what_it_cannot_run_is_refused_naming_the_field() {
        let cases = [
            ("descriptors: []", "domain"),
            ("domain: a\nlimits: []", "limits: unknown field"),
            ("domain: a\ndescriptors: [{ key: k, quota_mode: true }]", "descriptors[0].quota_mode: not supported"),
            ("domain: a\ndescriptors: [{ key: k, metadata: { a: 1 } }]", "descriptors[0].metadata"),
            ("domain: a\ndescriptors: [{ key: k, share_threshold: true }]", "share_threshold"),
            ("domain: a\ndescriptors: [{ key: k, value_to_metric: true }]", "value_to_metric"),
            ("domain: a\ndescriptors: [{ value: v }]", "descriptors[0].key"),
            ("domain: a\ndescriptors: [{ key: k, value: \"a*\" }]", "descriptors[0].value: wildcard"),
            ("domain: a\ndescriptors: [{ key: k }, { key: k }]", "descriptors[1]: duplicate"),
            (
                "domain: a\ndescriptors: [{ key: k, descriptors: [{ key: j, rate_limit: { unit: fortnight } }] }]",
                "descriptors[0].descriptors[0].rate_limit.unit",
            ),
            ("domain: a\ndescriptors: [{ key: k, rate_limit: { unlimited: true, unit: second } }]", "unit"),
            (
                "domain: a\ndescriptors: [{ key: k, rate_limit: { unit: second, requests_per_unit: 2000000000 } }]",
                "requests_per_unit",
            ),
            ("domain: a\ndescriptors: [{ key: k, rate_limit: { unit: second, algorithm: leaky } }]", "algorithm"),
            (
                "domain: a\ndescriptors: [{ key: k, rate_limit: { unit: second, name: n, replaces: [{ name: n }] } }]",
                "replaces[0].name",
            ),
            ("domain: a\ndescriptors: [{ key: k, rate_limit: { unit: second, burst: 3 } }]", "rate_limit.burst"),
        ];
        for (text, expected) in cases {
            let message = refused(text);
            assert!(
                message.contains(expected),
                "{text}: {message} should name {expected}"
            );
        }
        // Unsupported fields left at their default are harmless, as in envoyproxy/ratelimit.
        assert!(RlsConfig::default()
            .add_file("domain: a\ndescriptors: [{ key: k, quota_mode: false }]")
            .is_ok());
        let mut twice = RlsConfig::default();
        twice.add_file("domain: a").unwrap();
        assert!(twice
            .add_file("domain: a")
            .unwrap_err()
            .contains("already configured"));
    }
}
