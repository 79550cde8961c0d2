//! Which configured limit an RLQS bucket falls under, and its counter. A bucket id is a
//! map (its entries have no order), so it walks the domain's descriptor tree by keys: at
//! each level, the first of its unused entries in key order that matches a child (the
//! child `key_value` before the value-less `key`, as for RLS) goes down; the limit applies
//! when the last entry lands on it. The entries in the order they matched are the
//! descriptor the bucket stands for, and its counter is that descriptor's RLS counter
//! ([`crate::decide::rls::counter_key`]): an Envoy on the `rate_limit_quota` filter and one on the
//! `ratelimit` filter that name the same entries share one counter, and with the Wasm
//! filter's rule where the limit names a `filter_rule`.

use crate::decide::rlqs::share::Rule;
use crate::decide::rls::config::{Limit, Node, RlsConfig};
use crate::decide::rls::counter_key::counter_key;
use ratelimit_wire::Check;

/// At most this many entries in a bucket id, and this many bytes per key or value: a
/// bucket id is the client's input, kept for the life of its stream.
pub const MAX_ENTRIES: usize = 16;
pub const MAX_PART_BYTES: usize = 512;

/// A bucket id's entries, sorted by key: one bucket however Envoy ordered its map.
pub type BucketKey = Vec<(String, String)>;

/// What a bucket comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum BucketLimit {
    /// No configured limit: every request allowed, nothing counted.
    NoLimit,
    /// `unlimited`: every request allowed, nothing counted.
    Unlimited,
    /// `shadow_mode`: every request allowed; what the bucket reports is counted.
    Shadow { counter: Check, path: String },
    /// Served at `rule`'s rate, shared among the Envoys reporting `counter`; their
    /// reported admissions are charged to it.
    Limited {
        counter: Check,
        rule: Rule,
        path: String,
    },
}

/// The bucket id as a [`BucketKey`], or why it cannot be one.
pub fn bucket_key(bucket: &std::collections::HashMap<String, String>) -> Result<BucketKey, String> {
    if bucket.is_empty() {
        return Err("bucket_id: no entries".into());
    }
    if bucket.len() > MAX_ENTRIES {
        return Err(format!("bucket_id: more than {MAX_ENTRIES} entries"));
    }
    if let Some((key, _)) = bucket
        .iter()
        .find(|(k, v)| k.len() > MAX_PART_BYTES || v.len() > MAX_PART_BYTES)
    {
        let shown: String = key.chars().take(32).collect();
        return Err(format!(
            "bucket_id[{shown}]: a key or value longer than {MAX_PART_BYTES} bytes"
        ));
    }
    let mut entries: BucketKey = bucket.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    entries.sort();
    Ok(entries)
}

/// The limit `entries` fall under in `domain`.
pub fn bucket_limit(config: &RlsConfig, domain: &str, entries: &BucketKey) -> BucketLimit {
    let Some((limit, path)) = find(config, domain, entries) else {
        return BucketLimit::NoLimit;
    };
    let Some(rate) = limit.rate else {
        return BucketLimit::Unlimited;
    };
    let period_ms = rate.unit.seconds() * 1000;
    // A limit sharing a filter rule's counter (`filter_rule`) counts there, as RLS does.
    let shared_key = limit
        .shared
        .as_ref()
        .zip(path.last())
        .and_then(|(shared, (_, value))| shared.counter_key(value));
    let counter = Check {
        key: shared_key.unwrap_or_else(|| counter_key(domain, &path, rate.algorithm, period_ms)),
        algorithm: rate.algorithm,
        limit: u64::from(rate.requests_per_unit),
        period_ms,
        cost: 1,
        shadow: false,
        lease: 0,
        calendar: None,
        regions: Default::default(),
    };
    if limit.shadow_mode {
        return BucketLimit::Shadow {
            counter,
            path: limit.path.clone(),
        };
    }
    BucketLimit::Limited {
        rule: Rule {
            limit: counter.limit,
            period_s: rate.unit.seconds(),
        },
        counter,
        path: limit.path.clone(),
    }
}

fn find<'a>(
    config: &'a RlsConfig,
    domain: &str,
    entries: &'a BucketKey,
) -> Option<(&'a Limit, Vec<(&'a str, &'a str)>)> {
    let mut node: &Node = config.domains.get(domain)?;
    let mut unused: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut path = Vec::with_capacity(unused.len());
    loop {
        let (index, child) = unused
            .iter()
            .enumerate()
            .find_map(|(i, (key, value))| node.child(key, value).map(|child| (i, child)))?;
        path.push(unused.remove(index));
        if unused.is_empty() {
            return child.limit.as_ref().map(|limit| (limit, path));
        }
        node = child;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config() -> RlsConfig {
        RlsConfig::from_yaml(
            r#"
domain: edge
descriptors:
  - key: name
    value: free
    descriptors:
      - key: api_key
        rate_limit: { unit: minute, requests_per_unit: 40 }
  - key: name
    descriptors:
      - key: api_key
        rate_limit: { unit: minute, requests_per_unit: 400 }
  - key: internal
    rate_limit: { unlimited: true }
  - key: canary
    rate_limit: { unit: hour, requests_per_unit: 3, algorithm: token_bucket }
    shadow_mode: true
"#,
        )
    }

    fn bucket(entries: &[(&str, &str)]) -> BucketKey {
        let map: HashMap<String, String> = entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        bucket_key(&map).unwrap()
    }

    #[test]
    fn a_bucket_matches_the_tree_whatever_the_order_of_its_map() {
        let config = config();
        let limited = bucket_limit(&config, "edge", &bucket(&[("api_key", "k1"), ("name", "free")]));
        let BucketLimit::Limited { counter, rule, .. } = limited else {
            panic!("{limited:?}")
        };
        assert_eq!((counter.limit, counter.period_ms), (40, 60_000));
        assert_eq!(
            rule,
            Rule {
                limit: 40,
                period_s: 60
            }
        );
        // The same entries as an RLS descriptor, in the tree's order: one counter.
        assert_eq!(
            counter.key,
            counter_key(
                "edge",
                &[("name", "free"), ("api_key", "k1")],
                counter.algorithm,
                60_000
            )
        );
        let other = bucket_limit(&config, "edge", &bucket(&[("name", "pro"), ("api_key", "k1")]));
        assert!(matches!(other, BucketLimit::Limited { ref counter, .. } if counter.limit == 400));
    }

    #[test]
    fn unlimited_shadow_and_unmatched_buckets() {
        let config = config();
        assert_eq!(
            bucket_limit(&config, "edge", &bucket(&[("internal", "x")])),
            BucketLimit::Unlimited
        );
        assert!(matches!(
            bucket_limit(&config, "edge", &bucket(&[("canary", "x")])),
            BucketLimit::Shadow { .. }
        ));
        for unmatched in [
            bucket(&[("name", "free")]),                               // stops above the limit
            bucket(&[("name", "free"), ("api_key", "k"), ("x", "y")]), // deeper than the tree
            bucket(&[("other", "x")]),
        ] {
            assert_eq!(bucket_limit(&config, "edge", &unmatched), BucketLimit::NoLimit);
        }
        assert_eq!(
            bucket_limit(&config, "nowhere", &bucket(&[("internal", "x")])),
            BucketLimit::NoLimit
        );
    }

    #[test]
    fn a_bucket_under_a_filter_rule_counts_on_the_rule_s_counter() {
        let filter = ratelimit_rules::config::FilterConfig::from_json(
            br#"{"shim_cluster": "shim",
                 "rules": [{"name": "per-key", "key": [{"header": "x-api-key"}], "limit": 40, "period": "1m"}]}"#,
        )
        .unwrap();
        let mut config = RlsConfig::default();
        crate::decide::rls::filter_rule::add_file(
            &mut config,
            "domain: quota\ndescriptors:\n  - key: api_key\n    rate_limit: { unit: minute, requests_per_unit: 40, algorithm: token_bucket, filter_rule: per-key }\n",
            &filter,
        )
        .unwrap();
        let limited = bucket_limit(&config, "quota", &bucket(&[("api_key", "k1")]));
        let BucketLimit::Limited { counter, .. } = limited else {
            panic!("{limited:?}")
        };
        let shared = config.limits()[0].shared.clone().unwrap();
        assert_eq!(Some(counter.key.clone()), shared.counter_key("k1"));
        assert!(counter.key.starts_with("per-key/"), "{}", counter.key);
    }

    #[test]
    fn hostile_bucket_ids_are_refused() {
        assert!(bucket_key(&HashMap::new()).is_err());
        let many: HashMap<String, String> = (0..=MAX_ENTRIES)
            .map(|i| (i.to_string(), String::new()))
            .collect();
        assert!(bucket_key(&many).unwrap_err().contains("more than 16"));
        let long = HashMap::from([("k".to_string(), "v".repeat(MAX_PART_BYTES + 1))]);
        assert!(bucket_key(&long).unwrap_err().contains("longer than"));
    }
}
