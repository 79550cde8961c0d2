//! Which configured limit a request's descriptor falls under, as envoyproxy/ratelimit
//! decides it: entry by entry down the domain's tree, each entry matching the child
//! `key_value` if there is one, else the first wildcard `value` of that level that
//! matches, else the value-less child `key` (any value); the limit applies only when it
//! sits at the depth of the descriptor's last entry. A descriptor with more entries than
//! the tree, or one that stops above a limit, has no limit. An entry that went through a
//! `share_threshold` wildcard is counted as the pattern (`files/*`), not its value, so
//! every value matching it shares one counter.

use super::config::{Limit, Node, RlsConfig, Via};

/// The limit a descriptor falls under, and the entries its counter is keyed by.
#[derive(Debug, PartialEq)]
pub struct Found<'a, 'e> {
    pub limit: &'a Limit,
    /// The descriptor's entries, each value a `share_threshold` wildcard matched replaced
    /// by its pattern.
    pub counted: Vec<(&'e str, &'e str)>,
}

/// The limit for `entries` (key, value pairs) in `domain`, if any.
pub fn find_limit<'a>(config: &'a RlsConfig, domain: &str, entries: &[(&str, &str)]) -> Option<&'a Limit> {
    find(config, domain, entries).map(|found| found.limit)
}

/// [`find_limit`], with the entries its counter is keyed by.
pub fn find<'a, 'e>(
    config: &'a RlsConfig,
    domain: &str,
    entries: &[(&'e str, &'e str)],
) -> Option<Found<'a, 'e>>
where
    'a: 'e,
{
    let mut node: &Node = config.domains.get(domain)?;
    let mut counted = Vec::with_capacity(entries.len());
    for (depth, &(key, value)) in entries.iter().enumerate() {
        let (child, via) = node.matched(key, value)?;
        counted.push(match via {
            Via::Wildcard {
                shared_as: Some(pattern),
            } => (key, pattern),
            _ => (key, value),
        });
        if depth + 1 == entries.len() {
            return child.limit.as_ref().map(|limit| Found { limit, counted });
        }
        node = child;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RlsConfig {
        RlsConfig::from_yaml(
            r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 10 }
  - key: path
    value: /login
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: tenant
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 7 }
"#,
        )
    }

    fn rpu(limit: Option<&Limit>) -> Option<u32> {
        limit.map(|l| l.rate.unwrap().requests_per_unit)
    }

    #[test]
    fn the_value_match_is_more_specific_than_the_key_alone() {
        let config = config();
        assert_eq!(rpu(find_limit(&config, "edge", &[("path", "/login")])), Some(5));
        assert_eq!(rpu(find_limit(&config, "edge", &[("path", "/other")])), Some(100));
        assert_eq!(
            rpu(find_limit(&config, "edge", &[("remote_address", "10.0.0.1")])),
            Some(10)
        );
    }

    #[test]
    fn a_limit_applies_only_at_the_depth_of_the_last_entry() {
        let config = config();
        assert_eq!(
            rpu(find_limit(&config, "edge", &[("tenant", "a"), ("user", "u")])),
            Some(7)
        );
        assert_eq!(
            find_limit(&config, "edge", &[("tenant", "a")]),
            None,
            "stops above the limit"
        );
        assert_eq!(
            find_limit(&config, "edge", &[("remote_address", "x"), ("extra", "y")]),
            None,
            "deeper than the tree"
        );
        assert_eq!(find_limit(&config, "edge", &[("unknown", "x")]), None);
        assert_eq!(find_limit(&config, "other", &[("path", "/login")]), None);
    }

    const WILDCARDS: &str = r#"
domain: edge
descriptors:
  - key: path
    value: /api/*/items
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: path
    value: /api/*
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: path
    value: /api/v1/items
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 4 }
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: tenant
    value: t-*
    share_threshold: true
    descriptors:
      - key: user
        value: u*
        rate_limit: { unit: minute, requests_per_unit: 6 }
"#;

    #[test]
    fn an_exact_value_then_the_first_wildcard_then_the_key() {
        let config = RlsConfig::from_yaml(WILDCARDS);
        let limit = |value: &str| rpu(find_limit(&config, "edge", &[("path", value)]));
        assert_eq!(limit("/api/v1/items"), Some(3), "the exact value first");
        assert_eq!(limit("/api/v2/items"), Some(1), "the first wildcard in order");
        assert_eq!(limit("/api/v2/other"), Some(2));
        assert_eq!(limit("/web"), Some(4), "no wildcard matches: the key");
    }

    #[test]
    fn a_shared_threshold_counts_the_pattern_at_any_depth() {
        let config = RlsConfig::from_yaml(WILDCARDS);
        let found = find(&config, "edge", &[("files", "files/a.pdf")]).unwrap();
        assert_eq!(found.counted, [("files", "files/*")]);
        let found = find(&config, "edge", &[("tenant", "t-1"), ("user", "u42")]).unwrap();
        assert_eq!(rpu(Some(found.limit)), Some(6));
        assert_eq!(
            found.counted,
            [("tenant", "t-*"), ("user", "u42")],
            "the user's wildcard does not share: its own value counts"
        );
        let found = find(&config, "edge", &[("path", "/api/x")]).unwrap();
        assert_eq!(found.counted, [("path", "/api/x")], "no share_threshold");
        assert_eq!(find(&config, "edge", &[("tenant", "x-1"), ("user", "u1")]), None);
    }
}
