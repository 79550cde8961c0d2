//! Which configured limit a request's descriptor falls under, as envoyproxy/ratelimit
//! decides it: entry by entry down the domain's tree, each entry matching the child
//! `key_value` if there is one, else the value-less child `key` (any value); the limit
//! applies only when it sits at the depth of the descriptor's last entry. A descriptor
//! with more entries than the tree, or one that stops above a limit, has no limit.

use super::config::{Limit, Node, RlsConfig};

/// The limit for `entries` (key, value pairs) in `domain`, if any.
pub fn find_limit<'a>(config: &'a RlsConfig, domain: &str, entries: &[(&str, &str)]) -> Option<&'a Limit> {
    let mut node: &Node = config.domains.get(domain)?;
    for (depth, (key, value)) in entries.iter().enumerate() {
        let child = node.child(key, value)?;
        if depth + 1 == entries.len() {
            return child.limit.as_ref();
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
}
