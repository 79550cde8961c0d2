//! The counter key of a descriptor under a limit. As envoyproxy/ratelimit keys its
//! counters, one counter per domain and descriptor (every entry's key and value as the
//! request sent them), whichever configured limit matched; unlike it, the values never
//! reach Redis in the clear: domain and entries, each written with its length before its
//! bytes (so no two descriptors share an encoding), are hashed with SHA-256, as the
//! filter's keys are (`rules/src/keys.rs`). The key is
//! `rls/<algorithm tag><period ms>:{<first 96 bits of the hash, hex>}`: the hash is the
//! Redis Cluster hash tag, the algorithm and period keep counters of different shapes
//! apart (a limit changed in the configuration starts a fresh counter).

use ratelimit_wire::Algorithm;
use sha2::{Digest, Sha256};
use std::fmt::Write;

/// The counter key (before the shim's prefix) of `entries` in `domain`.
pub fn counter_key(domain: &str, entries: &[(&str, &str)], algorithm: Algorithm, period_ms: u64) -> String {
    let mut hasher = Sha256::new();
    let mut part = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    };
    part(domain.as_bytes());
    for (key, value) in entries {
        part(key.as_bytes());
        part(value.as_bytes());
    }
    let digest = hasher.finalize();
    let mut key = format!("rls/{}{period_ms}:{{", algorithm.traits().counter_tag);
    for byte in &digest[..12] {
        let _ = write!(key, "{byte:02x}");
    }
    key.push('}');
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_no_value_and_tell_descriptors_apart() {
        let key = counter_key(
            "edge",
            &[("api_key", "secret-123")],
            Algorithm::FixedWindow,
            60_000,
        );
        assert!(key.starts_with("rls/fw60000:{") && key.ends_with('}'), "{key}");
        assert_eq!(key.len(), "rls/fw60000:{}".len() + 24);
        assert!(!key.contains("secret") && !key.contains("api_key"));
        let same = counter_key(
            "edge",
            &[("api_key", "secret-123")],
            Algorithm::FixedWindow,
            60_000,
        );
        assert_eq!(key, same);
        let others = [
            counter_key(
                "edge2",
                &[("api_key", "secret-123")],
                Algorithm::FixedWindow,
                60_000,
            ),
            counter_key(
                "edge",
                &[("api_key", "secret-124")],
                Algorithm::FixedWindow,
                60_000,
            ),
            // The same bytes split differently between key and value.
            counter_key(
                "edge",
                &[("api_keys", "ecret-123")],
                Algorithm::FixedWindow,
                60_000,
            ),
            counter_key(
                "edge",
                &[("api_key", "secret-123")],
                Algorithm::TokenBucket,
                60_000,
            ),
            counter_key(
                "edge",
                &[("api_key", "secret-123")],
                Algorithm::FixedWindow,
                1_000,
            ),
        ];
        for other in others {
            assert_ne!(key, other);
        }
    }
}
