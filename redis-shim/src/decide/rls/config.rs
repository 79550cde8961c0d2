//! `--rls-config`: envoyproxy/ratelimit's YAML configuration (one file, or every `.yaml`
//! and `.yml` file of a directory) loaded into [`RlsConfig`], each domain a tree of
//! descriptors ([`super::descriptors`] reads each level, field by field, so that every
//! refusal names the file and the field's path). A domain in two files is refused, or
//! merged with `--rls-merge-domains` (upstream's MERGE_DOMAIN_CONFIG).

use super::descriptors::{load_descriptors, Context};
use super::shared::{Position, SharedCounter};
pub use super::unit::Unit;
use super::wildcard::Wildcard;
use super::yaml_fields::{known_fields, mapping};
use crate::envoy_api::messages::protobuf::Struct;
use ratelimit_wire::Algorithm;
use serde_yaml::Value;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Every domain's descriptor tree.
#[derive(Debug, Default)]
pub struct RlsConfig {
    pub domains: HashMap<String, Node>,
    /// A domain in a second file adds to the first (`--rls-merge-domains`) instead of
    /// being refused.
    pub merge_domains: bool,
}

/// One level of a domain's descriptors: its children by `key_value` (or `key` alone for
/// a descriptor without a value, which matches any value), the wildcard ones among them
/// in the configuration's order, and its limit, if any.
#[derive(Debug, Default)]
pub struct Node {
    pub children: HashMap<String, Node>,
    pub wildcards: Vec<Wildcard>,
    pub limit: Option<Limit>,
    /// `share_threshold`: every value matching this descriptor's wildcard counts on one
    /// counter, the pattern's.
    pub share_threshold: bool,
    /// `value_to_metric`: accepted; upstream puts the value in its statistics' names,
    /// and the shim keeps no per-descriptor series.
    pub value_to_metric: bool,
}

/// How an entry went down to a child ([`Node::matched`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Via<'a> {
    /// Its `key_value`, exactly.
    Value,
    /// A wildcard `value`; the pattern's value part when the child has `share_threshold`
    /// (what the entry is counted as).
    Wildcard { shared_as: Option<&'a str> },
    /// The value-less `key`.
    Key,
}

impl Node {
    /// The child an entry goes down to: the one with its key and value, else the first
    /// wildcard that matches them, else the value-less one with its key.
    pub fn child(&self, key: &str, value: &str) -> Option<&Node> {
        self.matched(key, value).map(|(child, _)| child)
    }

    /// [`Node::child`], and how it matched.
    pub fn matched(&self, key: &str, value: &str) -> Option<(&Node, Via<'_>)> {
        let key_value = format!("{key}_{value}");
        if let Some(child) = self.children.get(&key_value) {
            return Some((child, Via::Value));
        }
        for wildcard in &self.wildcards {
            if wildcard.matches(&key_value) {
                let Some(child) = self.children.get(&wildcard.final_key) else {
                    continue;
                };
                let shared_as = child.share_threshold.then(|| wildcard.value_of(key));
                return Some((child, Via::Wildcard { shared_as }));
            }
        }
        self.children.get(key).map(|child| (child, Via::Key))
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
    /// `quota_mode`: over its limit, it refuses the request only when every quota-mode
    /// descriptor of the request is over too (`super::response`).
    pub quota_mode: bool,
    pub replaces: Vec<String>,
    pub detailed_metric: bool,
    /// The descriptor's `metadata`, returned with `--rls-response-metadata`.
    pub metadata: Option<Arc<Struct>>,
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
/// each `filter_rule` linked by `share`, a domain in several files merged when
/// `merge_domains`. Every file is read, so that the errors name each file refused and
/// each bad descriptor in it (`file: path.in.yaml: why`), not only the first one.
pub fn load(path: &Path, share: &ShareRule, merge_domains: bool) -> Result<RlsConfig, Vec<String>> {
    let mut config = RlsConfig {
        merge_domains,
        ..Default::default()
    };
    let mut errors = Vec::new();
    for file in config_files(path).map_err(|e| vec![e])? {
        let added = std::fs::read_to_string(&file)
            .map_err(|e| vec![e.to_string()])
            .and_then(|text| config.add_file_sharing(&text, share));
        if let Err(found) = added {
            errors.extend(found.iter().map(|e| format!("{}: {e}", file.display())));
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

/// The file's one YAML document; empty documents around it (upstream's example begins
/// with `---` twice) are skipped.
fn document(text: &str) -> Result<Value, String> {
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = serde::Deserialize::deserialize(document).map_err(|e| format!("not YAML: {e}"))?;
        if !matches!(value, Value::Null) {
            documents.push(value);
        }
    }
    match documents.len() {
        0 => Ok(Value::Null),
        1 => Ok(documents.remove(0)),
        n => Err(format!("{n} YAML documents: one domain per file")),
    }
}

impl RlsConfig {
    /// Adds one file's domain; a domain already loaded is refused (as envoyproxy/ratelimit
    /// does without MERGE_DOMAIN_CONFIG) unless [`RlsConfig::merge_domains`]; its errors
    /// joined by `; `.
    pub fn add_file(&mut self, text: &str) -> Result<(), String> {
        self.add_file_sharing(text, &no_filter_config)
            .map_err(|errors| errors.join("; "))
    }

    /// As [`RlsConfig::add_file`], each `filter_rule` linked by `share`: every error
    /// found, the file's own first, or one per bad descriptor.
    pub fn add_file_sharing(&mut self, text: &str, share: &ShareRule) -> Result<(), Vec<String>> {
        let errors = self.add_domain(text, share).map_err(|e| vec![e])?;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// Adds the file's domain and returns its descriptors' errors; a field of the file
    /// itself refused is the error.
    fn add_domain(&mut self, text: &str, share: &ShareRule) -> Result<Vec<String>, String> {
        let root = document(text)?;
        let root = mapping(&root, "the file")?;
        known_fields(root, "", &["domain", "descriptors"])?;
        let domain = match root.get("domain") {
            Some(Value::String(domain)) if !domain.is_empty() => domain.clone(),
            _ => return Err("domain: a non-empty string is required".into()),
        };
        if self.domains.contains_key(&domain) && !self.merge_domains {
            return Err(format!(
                "domain: {domain:?} is already configured by another file (--rls-merge-domains merges them)"
            ));
        }
        // A file that fails leaves the domain half merged: the whole load fails with it.
        let node = self.domains.entry(domain.clone()).or_default();
        let context = Context {
            share,
            above_all_valued: true,
        };
        let mut errors = Vec::new();
        load_descriptors(
            node,
            root.get("descriptors"),
            "descriptors",
            &domain,
            &context,
            &mut errors,
        );
        Ok(errors)
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
            ("domain: a\ndescriptors: [{ key: k, quota_mode: maybe }]", "descriptors[0].quota_mode: must be true or false"),
            ("domain: a\ndescriptors: [{ key: k, metadata: [1] }]", "descriptors[0].metadata: must be a mapping"),
            ("domain: a\ndescriptors: [{ key: k, share_threshold: true }]", "descriptors[0].share_threshold: only a wildcard"),
            ("domain: a\ndescriptors: [{ key: k, value: v, share_threshold: true }]", "share_threshold"),
            ("domain: a\ndescriptors: [{ key: k, value_to_metric: 1 }]", "value_to_metric"),
            ("domain: a\ndescriptors: [{ value: v }]", "descriptors[0].key"),
            ("domain: a\ndescriptors: [{ key: k, value: \"a*\" }, { key: k, value: \"a*\" }]", "descriptors[1]: duplicate"),
            ("---\ndomain: a\n---\ndomain: b\n", "2 YAML documents"),
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
        let mut twice = RlsConfig::default();
        twice.add_file("domain: a").unwrap();
        assert!(twice
            .add_file("domain: a")
            .unwrap_err()
            .contains("already configured"));
    }

    #[test]
    fn upstreams_descriptor_switches_and_metadata_load() {
        let config = RlsConfig::from_yaml(
            r#"
---
---
domain: edge
descriptors:
  - key: service
    value: svc_*
    quota_mode: true
    share_threshold: true
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
    metadata:
      service_with_quota: { name: "svc" }
"#,
        );
        let edge = &config.domains["edge"];
        assert_eq!(edge.wildcards.len(), 1);
        let service = &edge.children["service_svc_*"];
        assert!(service.share_threshold && service.value_to_metric);
        let limit = service.limit.as_ref().unwrap();
        assert!(limit.quota_mode && !limit.shadow_mode);
        assert!(limit
            .metadata
            .as_ref()
            .unwrap()
            .fields
            .contains_key("service_with_quota"));
        assert_eq!(
            edge.child("service", "svc_a").unwrap().limit.as_ref(),
            Some(limit)
        );
    }

    #[test]
    fn a_domain_in_two_files_merges_when_asked() {
        let first = "domain: a\ndescriptors: [{ key: k, value: \"x*\", rate_limit: { unit: second, requests_per_unit: 1 } }]";
        let second =
            "domain: a\ndescriptors: [{ key: j, rate_limit: { unit: second, requests_per_unit: 2 } }]";
        let mut merged = RlsConfig {
            merge_domains: true,
            ..Default::default()
        };
        merged.add_file(first).unwrap();
        merged.add_file(second).unwrap();
        let a = &merged.domains["a"];
        assert!(a.child("k", "xy").is_some() && a.child("j", "v").is_some());
        let refused = merged.add_file(first).unwrap_err();
        assert!(refused.contains("descriptors[0]: duplicate"), "{refused}");
    }
}
