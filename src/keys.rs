//! Counter keys: which parts of a request identify the client for a rule, and how they
//! become one Redis key.
//!
//! Keys are unambiguous and carry no client data in the clear: each part is written with
//! its kind and length before its bytes, the whole is hashed with SHA-256, and the key is
//! `<rule name>:{<first 128 bits of the hash, hex>}`. Rule names cannot contain `:`, so
//! two different rule/part combinations never share a counter, and an API key never
//! reaches Redis. The hash is a Redis Cluster hash tag: the rules of one request that key
//! on the same parts (per user per minute and per user per day, say) land in one slot and
//! are checked in one atomic script.

use crate::config::Rule;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::net::{IpAddr, SocketAddr};

/// Longest header name a key part may name.
const MAX_HEADER_NAME_LEN: usize = 128;

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyPart {
    /// The value of a request header, e.g. `x-api-key` or `x-user-id`.
    Header(String),
    /// The downstream client's IP address as Envoy sees it (`source.address`).
    ClientIp,
}

impl KeyPart {
    /// Validates and normalises a configured key part.
    pub(crate) fn compile(self) -> Result<KeyPart, String> {
        match self {
            KeyPart::Header(name) => {
                let valid = !name.is_empty()
                    && name.len() <= MAX_HEADER_NAME_LEN
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
                if !valid {
                    return Err(format!("header name {name:?} is not a valid HTTP header name"));
                }
                Ok(KeyPart::Header(name.to_ascii_lowercase()))
            }
            KeyPart::ClientIp => Ok(KeyPart::ClientIp),
        }
    }

    fn tag(&self) -> u8 {
        match self {
            KeyPart::Header(_) => b'h',
            KeyPart::ClientIp => b'i',
        }
    }
}

/// What the key builder needs to know about a request; the host layer implements it over
/// Envoy's header map and properties, tests over plain values.
pub trait RequestAttributes {
    /// The value of a request header (lower-case name), if present.
    fn header(&self, name: &str) -> Option<String>;
    /// Envoy's `source.address` property: `ip:port` or `[v6]:port`.
    fn source_address(&self) -> Option<String>;
}

/// The counter key of `rule` for this request, or `None` when the request lacks one of
/// the rule's parts (the rule then does not apply to it).
pub fn counter_key(rule: &Rule, request: &impl RequestAttributes) -> Option<String> {
    let mut hasher = Sha256::new();
    for part in &rule.key {
        let value = match part {
            KeyPart::Header(name) => request.header(name).filter(|v| !v.is_empty())?,
            KeyPart::ClientIp => client_ip(&request.source_address()?)?.to_string(),
        };
        hasher.update([part.tag()]);
        hasher.update((value.len() as u64).to_be_bytes());
        hasher.update(value.as_bytes());
    }
    let digest = hasher.finalize();
    let mut key = String::with_capacity(rule.name.len() + 35);
    key.push_str(&rule.name);
    key.push_str(":{");
    for byte in &digest[..16] {
        key.push(char::from(HEX[usize::from(byte >> 4)]));
        key.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    key.push('}');
    Some(key)
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The IP of an address given as `ip:port`, `[v6]:port` or a bare IP.
pub fn client_ip(address: &str) -> Option<IpAddr> {
    let address = address.trim();
    address
        .parse::<SocketAddr>()
        .map(|socket| socket.ip())
        .or_else(|_| address.parse::<IpAddr>())
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Algorithm;
    use std::collections::HashMap;

    #[derive(Default)]
    struct FakeRequest {
        headers: HashMap<String, String>,
        source: Option<String>,
    }

    impl RequestAttributes for FakeRequest {
        fn header(&self, name: &str) -> Option<String> {
            self.headers.get(name).cloned()
        }
        fn source_address(&self) -> Option<String> {
            self.source.clone()
        }
    }

    fn request(headers: &[(&str, &str)], source: Option<&str>) -> FakeRequest {
        FakeRequest {
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            source: source.map(str::to_string),
        }
    }

    fn rule(name: &str, key: Vec<KeyPart>) -> Rule {
        Rule {
            name: name.into(),
            key,
            algorithm: Algorithm::TokenBucket,
            limit: 5,
            period_ms: 60_000,
            cost: 1,
        }
    }

    #[test]
    fn header_key_is_hashed_and_prefixed_by_rule() {
        let rule = rule("per-key", vec![KeyPart::Header("x-api-key".into())]);
        let key = counter_key(&rule, &request(&[("x-api-key", "secret-123")], None)).unwrap();
        assert!(key.starts_with("per-key:{") && key.ends_with('}'), "{key}");
        assert_eq!(key.len(), "per-key:{}".len() + 32);
        assert!(!key.contains("secret"), "raw API key leaked into {key}");
        let again = counter_key(&rule, &request(&[("x-api-key", "secret-123")], None)).unwrap();
        assert_eq!(key, again);
        let other = counter_key(&rule, &request(&[("x-api-key", "secret-124")], None)).unwrap();
        assert_ne!(key, other);
    }

    #[test]
    fn missing_or_empty_part_means_rule_does_not_apply() {
        let rule = rule("r", vec![KeyPart::Header("x-api-key".into()), KeyPart::ClientIp]);
        assert_eq!(counter_key(&rule, &request(&[], Some("1.2.3.4:5"))), None);
        assert_eq!(
            counter_key(&rule, &request(&[("x-api-key", "")], Some("1.2.3.4:5"))),
            None
        );
        assert_eq!(counter_key(&rule, &request(&[("x-api-key", "k")], None)), None);
        assert_eq!(
            counter_key(&rule, &request(&[("x-api-key", "k")], Some("garbage"))),
            None
        );
        assert!(counter_key(&rule, &request(&[("x-api-key", "k")], Some("1.2.3.4:5"))).is_some());
    }

    // A peer joins parts with `_`, so ("a_b", "c") and ("a", "b_c") collide; length
    // prefixes keep them apart.
    #[test]
    fn composite_keys_are_unambiguous() {
        let rule = rule(
            "r",
            vec![KeyPart::Header("x-a".into()), KeyPart::Header("x-b".into())],
        );
        let first = counter_key(&rule, &request(&[("x-a", "a_b"), ("x-b", "c")], None));
        let second = counter_key(&rule, &request(&[("x-a", "a"), ("x-b", "b_c")], None));
        assert_ne!(first, second);
    }

    #[test]
    fn same_client_under_two_rules_gets_two_counters() {
        let by_key = rule("a", vec![KeyPart::Header("x-api-key".into())]);
        let by_key_too = rule("b", vec![KeyPart::Header("x-api-key".into())]);
        let req = request(&[("x-api-key", "k")], None);
        assert_ne!(counter_key(&by_key, &req), counter_key(&by_key_too, &req));
    }

    #[test]
    fn rules_on_the_same_parts_share_a_hash_tag() {
        let minute = rule("per-minute", vec![KeyPart::Header("x-user".into())]);
        let day = rule("per-day", vec![KeyPart::Header("x-user".into())]);
        let req = request(&[("x-user", "alice")], None);
        let tag = |key: String| key[key.find('{').unwrap()..].to_string();
        assert_eq!(
            tag(counter_key(&minute, &req).unwrap()),
            tag(counter_key(&day, &req).unwrap())
        );
    }

    #[test]
    fn client_ip_ignores_the_port() {
        let rule = rule("ip", vec![KeyPart::ClientIp]);
        let a = counter_key(&rule, &request(&[], Some("10.0.0.1:1111")));
        let b = counter_key(&rule, &request(&[], Some("10.0.0.1:2222")));
        assert_eq!(a, b);
        assert_eq!(client_ip("[::1]:80"), Some("::1".parse().unwrap()));
        assert_eq!(client_ip("192.0.2.7"), Some("192.0.2.7".parse().unwrap()));
        assert_eq!(client_ip("not-an-ip:80"), None);
    }
}
