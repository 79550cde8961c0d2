//! Counter keys: which parts of a request identify the client for a rule, and how they
//! become one Redis key.
//!
//! Keys are unambiguous and carry no client data in the clear: each part is written with
//! its kind and length before its bytes, the whole is hashed with SHA-256, and the key is
//! `<rule name>/<algorithm><period>:{<first 96 bits of the hash, hex>}` (for a calendar
//! quota `<rule name>/fw-<unit><offset>:{...}`): no collision
//! in practice for billions of clients per rule, and 8 bytes less per Redis key than 128
//! bits. Rule names cannot contain `/` or `:`, so two different rule/part combinations
//! never share a counter, and an API key never reaches Redis. The hash is a Redis Cluster
//! hash tag: the rules of one request that key on the same parts (per user per minute
//! and per user per day, say) land in one slot and are checked in one atomic script.

use crate::attributes::{is_header_name, RequestAttributes};
use crate::wire::calendar::UtcOffset;
use crate::wire::{Algorithm, CalendarWindow};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::net::{IpAddr, SocketAddr};

mod api_key;
pub use api_key::{bearer_token, describe_sources, read_api_key, ApiKeySource, MAX_API_KEY_SOURCES};

/// Longest constant or claim name a key part may hold.
const MAX_PART_LEN: usize = 128;

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyPart {
    /// The value of a request header, e.g. `x-api-key` or `x-user-id`.
    Header(String),
    /// The client's IP: `source.address`, or X-Forwarded-For read through the configured
    /// number of trusted proxy hops.
    ClientIp,
    /// A claim of a JWT verified by Envoy's `jwt_authn` filter, from its dynamic metadata.
    JwtClaim(String),
    /// The request path without its query string.
    Path,
    /// The request method.
    Method,
    /// A fixed value: every request shares the counter (a global limit).
    Constant(String),
    /// An API key from the first of these places that holds one (`x-api-key`, then
    /// `Authorization: Bearer <key>`, say): only the key, keyed as a header's value is.
    ApiKey(Vec<ApiKeySource>),
}

impl KeyPart {
    /// Validates and normalises a configured key part; an error is the field within the
    /// part (`""`, or `.api_key[1]`) and why.
    pub(crate) fn compile(self) -> Result<KeyPart, (String, String)> {
        match self {
            KeyPart::ApiKey(sources) => api_key::compile_sources(sources).map(KeyPart::ApiKey),
            part => part.compile_single().map_err(|reason| (String::new(), reason)),
        }
    }

    fn compile_single(self) -> Result<KeyPart, String> {
        match self {
            KeyPart::Header(name) => {
                if !is_header_name(&name) {
                    return Err(format!("header name {name:?} is not a valid HTTP header name"));
                }
                Ok(KeyPart::Header(name.to_ascii_lowercase()))
            }
            KeyPart::JwtClaim(claim) => {
                let valid = !claim.is_empty()
                    && claim.len() <= MAX_PART_LEN
                    && claim
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b));
                if !valid {
                    return Err(format!(
                        "claim name {claim:?} must be 1..={MAX_PART_LEN} of A-Z a-z 0-9 - _ . : /"
                    ));
                }
                Ok(KeyPart::JwtClaim(claim))
            }
            KeyPart::Constant(value) => {
                if value.is_empty() || value.len() > MAX_PART_LEN {
                    return Err(format!("constant must be 1..={MAX_PART_LEN} bytes"));
                }
                Ok(KeyPart::Constant(value))
            }
            part => Ok(part),
        }
    }

    fn tag(&self) -> u8 {
        match self {
            // An API key is a header's value (or the token in one): a rule moving from
            // `{ "header": "x-api-key" }` to `api_key` keeps its clients' counters.
            KeyPart::Header(_) | KeyPart::ApiKey(_) => b'h',
            KeyPart::ClientIp => b'i',
            KeyPart::JwtClaim(_) => b'j',
            KeyPart::Path => b'p',
            KeyPart::Method => b'm',
            KeyPart::Constant(_) => b'c',
        }
    }
}

/// The value of one key part for this request, if it has one.
pub fn part_value(
    part: &KeyPart,
    request: &impl RequestAttributes,
    xff_num_trusted_hops: u32,
) -> Option<String> {
    let value = match part {
        KeyPart::Header(name) => request.header(name)?,
        KeyPart::ClientIp => client_ip(request, xff_num_trusted_hops)?.to_string(),
        KeyPart::JwtClaim(claim) => request.jwt_claim(claim)?,
        KeyPart::Path => {
            let path = request.path()?;
            path.split(['?', '#']).next().unwrap_or_default().to_string()
        }
        KeyPart::Method => request.method()?,
        KeyPart::Constant(value) => value.clone(),
        KeyPart::ApiKey(sources) => read_api_key(sources, request)?,
    };
    (!value.is_empty()).then_some(value)
}

/// The name of a rule's counters for one algorithm and period: `<rule>/<algorithm><period
/// ms>`. A counter's state means something only to its algorithm and period, so a config
/// change of either starts new counters instead of misreading the old ones (a script
/// finding another algorithm's key failed every request with WRONGTYPE until it expired).
pub fn counter_name(rule_name: &str, algorithm: Algorithm, period_ms: u64) -> String {
    format!("{rule_name}/{}{period_ms}", algorithm.traits().counter_tag)
}

/// The name of a calendar rule's counters: `<rule>/fw-<unit><±HHMM>`, e.g.
/// `quota/fw-month+0530`. The window a counter's state describes depends on the unit and
/// the offset, so changing either starts new counters, as a period change does.
pub fn calendar_counter_name(rule_name: &str, calendar: CalendarWindow) -> String {
    let offset = UtcOffset(calendar.offset_minutes).to_string().replace(':', "");
    format!("{rule_name}/fw-{}{offset}", calendar.unit.as_str())
}

/// The counter key named `counter` (see [`counter_name`]), keyed on `parts`, for this
/// request; `None` when the request lacks one of the parts (the rule then does not apply
/// to it).
pub fn counter_key(
    counter: &str,
    parts: &[KeyPart],
    request: &impl RequestAttributes,
    xff_num_trusted_hops: u32,
) -> Option<String> {
    let mut hasher = Sha256::new();
    for part in parts {
        let value = part_value(part, request, xff_num_trusted_hops)?;
        hasher.update([part.tag()]);
        hasher.update((value.len() as u64).to_be_bytes());
        hasher.update(value.as_bytes());
    }
    let digest = hasher.finalize();
    let mut key = String::with_capacity(counter.len() + 2 * KEY_HASH_BYTES + 3);
    key.push_str(counter);
    key.push_str(":{");
    let hex = |nibble: u8| char::from_digit(u32::from(nibble), 16).unwrap_or('0');
    for byte in digest.iter().take(KEY_HASH_BYTES) {
        key.push(hex(byte >> 4));
        key.push(hex(byte & 0xf));
    }
    key.push('}');
    Some(key)
}

/// Bytes of the SHA-256 digest kept in a counter key.
const KEY_HASH_BYTES: usize = 12;

/// The client's IP. With no trusted hops it is the peer (`source.address`). With N
/// trusted proxies in front of Envoy, each appended the address it saw to
/// X-Forwarded-For, so the client is the Nth entry from the right; anything further left
/// was written by the client and is ignored. A header shorter than N (the request did not
/// come through every trusted proxy) or an entry that is not an IP falls back to the peer.
pub fn client_ip(request: &impl RequestAttributes, xff_num_trusted_hops: u32) -> Option<IpAddr> {
    let peer = || parse_ip(&request.source_address()?);
    if xff_num_trusted_hops == 0 {
        return peer();
    }
    let Some(forwarded) = request.header("x-forwarded-for") else {
        return peer();
    };
    // Bounded: a hostile header of thousands of entries costs no more than N steps.
    forwarded
        .rsplit(',')
        .nth(xff_num_trusted_hops as usize - 1)
        .and_then(parse_ip)
        .or_else(peer)
}

/// The IP of an address given as `ip:port`, `[v6]:port` or a bare IP.
pub fn parse_ip(address: &str) -> Option<IpAddr> {
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
    // On wasm32 the same tests run under wasm-bindgen-test (Node).
    use crate::attributes::fake::FakeRequest;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn request(headers: &[(&str, &str)], source: Option<&str>) -> FakeRequest {
        headers
            .iter()
            .fold(FakeRequest::get("/").from(source), |r, (k, v)| {
                r.with_header(k, v)
            })
    }

    /// A rule's name and key parts, all a counter key depends on.
    struct KeyedRule {
        name: &'static str,
        parts: Vec<KeyPart>,
    }

    fn rule(name: &'static str, parts: Vec<KeyPart>) -> KeyedRule {
        KeyedRule { name, parts }
    }

    fn key(rule: &KeyedRule, request: &FakeRequest) -> Option<String> {
        counter_key(rule.name, &rule.parts, request, 0)
    }

    #[test]
    fn header_key_is_hashed_and_prefixed_by_rule() {
        let rule = rule("per-key", vec![KeyPart::Header("x-api-key".into())]);
        let k = key(&rule, &request(&[("x-api-key", "secret-123")], None)).unwrap();
        assert!(k.starts_with("per-key:{") && k.ends_with('}'), "{k}");
        assert_eq!(k.len(), "per-key:{}".len() + 2 * KEY_HASH_BYTES);
        assert!(!k.contains("secret"), "raw API key leaked into {k}");
        assert_eq!(
            Some(k.clone()),
            key(&rule, &request(&[("x-api-key", "secret-123")], None))
        );
        assert_ne!(
            Some(k),
            key(&rule, &request(&[("x-api-key", "secret-124")], None))
        );
    }

    #[test]
    fn missing_or_empty_part_means_rule_does_not_apply() {
        let rule = rule("r", vec![KeyPart::Header("x-api-key".into()), KeyPart::ClientIp]);
        assert_eq!(key(&rule, &request(&[], Some("1.2.3.4:5"))), None);
        assert_eq!(
            key(&rule, &request(&[("x-api-key", "")], Some("1.2.3.4:5"))),
            None
        );
        assert_eq!(key(&rule, &request(&[("x-api-key", "k")], None)), None);
        assert_eq!(key(&rule, &request(&[("x-api-key", "k")], Some("garbage"))), None);
        assert!(key(&rule, &request(&[("x-api-key", "k")], Some("1.2.3.4:5"))).is_some());
    }

    // A peer joins parts with `_`, so ("a_b", "c") and ("a", "b_c") collide; length
    // prefixes keep them apart.
    #[test]
    fn composite_keys_are_unambiguous() {
        let rule = rule(
            "r",
            vec![KeyPart::Header("x-a".into()), KeyPart::Header("x-b".into())],
        );
        let first = key(&rule, &request(&[("x-a", "a_b"), ("x-b", "c")], None));
        let second = key(&rule, &request(&[("x-a", "a"), ("x-b", "b_c")], None));
        assert_ne!(first, second);
        // The same bytes from two different sources are two different keys too.
        let by_header = rule_with(vec![KeyPart::Header("x-a".into())]);
        let by_constant = rule_with(vec![KeyPart::Constant("v".into())]);
        let req = request(&[("x-a", "v")], None);
        assert_ne!(key(&by_header, &req), key(&by_constant, &req));
    }

    fn rule_with(key: Vec<KeyPart>) -> KeyedRule {
        rule("same", key)
    }

    // docs/CONFIG.md, "What happens to live counters": a renamed header keeps the
    // counters, another kind of part starts new ones.
    #[test]
    fn a_part_is_keyed_by_its_kind_and_value_not_by_its_headers_name() {
        let before = rule_with(vec![KeyPart::Header("x-api-key".into())]);
        let renamed = rule_with(vec![KeyPart::Header("x-user".into())]);
        let req = request(&[("x-api-key", "alice"), ("x-user", "alice")], Some("10.0.0.1:5"));
        assert_eq!(key(&before, &req), key(&renamed, &req));
        let by_ip = rule_with(vec![KeyPart::ClientIp]);
        let both = rule_with(vec![KeyPart::Header("x-user".into()), KeyPart::ClientIp]);
        assert_ne!(key(&before, &req), key(&by_ip, &req));
        assert_ne!(key(&before, &req), key(&both, &req));
    }

    #[test]
    fn same_client_under_two_rules_gets_two_counters() {
        let req = request(&[("x-api-key", "k")], None);
        let a = rule("a", vec![KeyPart::Header("x-api-key".into())]);
        let b = rule("b", vec![KeyPart::Header("x-api-key".into())]);
        assert_ne!(key(&a, &req), key(&b, &req));
    }

    #[test]
    fn rules_on_the_same_parts_share_a_hash_tag() {
        let minute = rule("per-minute", vec![KeyPart::Header("x-user".into())]);
        let day = rule("per-day", vec![KeyPart::Header("x-user".into())]);
        let req = request(&[("x-user", "alice")], None);
        let tag = |key: String| key[key.find('{').unwrap()..].to_string();
        assert_eq!(tag(key(&minute, &req).unwrap()), tag(key(&day, &req).unwrap()));
    }

    #[test]
    fn path_method_constant_and_claim_parts() {
        let req = FakeRequest::get("/items/7?page=2").with_claim("sub", "alice");
        assert_eq!(part_value(&KeyPart::Path, &req, 0).as_deref(), Some("/items/7"));
        assert_eq!(part_value(&KeyPart::Method, &req, 0).as_deref(), Some("GET"));
        assert_eq!(
            part_value(&KeyPart::Constant("all".into()), &req, 0).as_deref(),
            Some("all")
        );
        assert_eq!(
            part_value(&KeyPart::JwtClaim("sub".into()), &req, 0).as_deref(),
            Some("alice")
        );
        assert_eq!(part_value(&KeyPart::JwtClaim("tier".into()), &req, 0), None);
    }

    #[test]
    fn client_ip_ignores_the_port() {
        let rule = rule("ip", vec![KeyPart::ClientIp]);
        assert_eq!(
            key(&rule, &request(&[], Some("10.0.0.1:1111"))),
            key(&rule, &request(&[], Some("10.0.0.1:2222")))
        );
        assert_eq!(parse_ip("[::1]:80"), Some("::1".parse().unwrap()));
        assert_eq!(parse_ip("192.0.2.7"), Some("192.0.2.7".parse().unwrap()));
        assert_eq!(parse_ip("not-an-ip:80"), None);
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn forwarded_for_is_trusted_only_through_the_configured_hops() {
        let peer = Some("10.0.0.9:443");
        let via = |xff: &str| request(&[("x-forwarded-for", xff)], peer);
        // No trusted hops: the header is ignored entirely.
        assert_eq!(client_ip(&via("203.0.113.5"), 0), ip("10.0.0.9"));
        // One trusted proxy appended the client it saw; a spoofed left part is ignored.
        assert_eq!(client_ip(&via("203.0.113.5"), 1), ip("203.0.113.5"));
        assert_eq!(client_ip(&via("6.6.6.6, 203.0.113.5"), 1), ip("203.0.113.5"));
        assert_eq!(
            client_ip(&via("1.1.1.1,6.6.6.6, 203.0.113.5"), 1),
            ip("203.0.113.5")
        );
        // Two trusted proxies: the client is second from the right.
        assert_eq!(
            client_ip(&via("6.6.6.6, 203.0.113.5, 10.0.0.2"), 2),
            ip("203.0.113.5")
        );
        // Too short for the trusted chain, or garbage: the peer.
        assert_eq!(client_ip(&via("203.0.113.5"), 2), ip("10.0.0.9"));
        assert_eq!(client_ip(&via("not-an-ip"), 1), ip("10.0.0.9"));
        assert_eq!(client_ip(&request(&[], peer), 1), ip("10.0.0.9"));
        // A hostile header costs N steps and still yields the trusted entry.
        let hostile = format!("{}203.0.113.5", "6.6.6.6,".repeat(100_000));
        assert_eq!(client_ip(&via(&hostile), 1), ip("203.0.113.5"));
    }

    #[test]
    fn each_algorithm_and_period_has_its_own_counters() {
        let names = [
            counter_name("r", Algorithm::TokenBucket, 60_000),
            counter_name("r", Algorithm::FixedWindow, 60_000),
            counter_name("r", Algorithm::SlidingWindowLog, 60_000),
            counter_name("r", Algorithm::SlidingWindowCounter, 60_000),
            counter_name("r", Algorithm::TokenBucket, 1_000),
        ];
        let distinct: std::collections::HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        assert_eq!(names[0], "r/tb60000");
    }

    #[test]
    fn each_calendar_unit_and_offset_has_its_own_counters() {
        use crate::wire::CalendarUnit;
        let calendar =
            |unit, offset_minutes| calendar_counter_name("r", CalendarWindow { unit, offset_minutes });
        let names = [
            calendar(CalendarUnit::Day, 0),
            calendar(CalendarUnit::Week, 0),
            calendar(CalendarUnit::Month, 0),
            calendar(CalendarUnit::Month, 330),
            calendar(CalendarUnit::Month, -330),
            counter_name("r", Algorithm::FixedWindow, CalendarUnit::Day.longest_ms()),
        ];
        let distinct: std::collections::HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        assert_eq!(names[3], "r/fw-month+0530");
        assert_eq!(names[4], "r/fw-month-0530");
        // What a key may hold (printable ASCII, no `:` before the hash tag).
        assert!(names
            .iter()
            .all(|n| n.bytes().all(|b| b.is_ascii_graphic() && b != b':')));
    }
}
