//! A limit counted on a Wasm filter rule's counter ([`SharedCounter`]), and where in its
//! tree the descriptor asking for it sits ([`Position`]): what [`super::config`] records
//! while loading and [`super::filter_rule`] decides, so that neither module reaches into
//! the other's.

use ratelimit_rules::attributes::GivenRequest;
use ratelimit_rules::keys::{counter_key, KeyPart};

/// A limit counted on a filter rule's counter.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedCounter {
    /// The filter rule's name.
    pub rule: String,
    /// The rule's counter name ([`ratelimit_rules::keys::counter_name`]).
    pub(super) counter: String,
    /// The rule's one key part, which the descriptor's last entry supplies.
    pub(super) part: KeyPart,
}

impl SharedCounter {
    /// The filter's counter key (before the shim's prefix) for a request whose key part
    /// holds `value`; `None` where the filter would not count such a request (an empty
    /// value, or an address that is not an IP).
    pub fn counter_key(&self, value: &str) -> Option<String> {
        let request = match &self.part {
            KeyPart::Header(name) => GivenRequest {
                headers: vec![(name.clone(), value.to_string())],
                ..Default::default()
            },
            KeyPart::ClientIp => GivenRequest {
                source_address: Some(value.to_string()),
                ..Default::default()
            },
            _ => return None,
        };
        // No trusted hops: the value already is the client's IP, as Envoy resolved it.
        counter_key(&self.counter, std::slice::from_ref(&self.part), &request, 0)
    }
}

/// Where in its tree the descriptor holding a shared limit sits.
pub struct Position<'a> {
    /// Its `key`.
    pub key: &'a str,
    /// Whether it has a `value` of its own.
    pub has_value: bool,
    /// Whether every descriptor above it has a `value`.
    pub above_all_valued: bool,
}
