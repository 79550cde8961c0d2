//! [`Shim`]: what every endpoint and both gRPC services are served with (the store, the
//! configuration, the metrics, the in-flight bound), and the token comparison they share.

use crate::metrics::Metrics;
use crate::store::any_store::AnyStore;
use crate::store::regions::Regions;
use crate::transport::admission::Admission;
use crate::transport::config::ShimConfig;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What every endpoint and gRPC service shares.
pub struct Shim {
    pub store: AnyStore,
    pub config: ShimConfig,
    /// Shared with the connection cap, which counts the open connections.
    pub metrics: Arc<Metrics>,
    pub admission: Admission,
    /// Set once the shutdown signal came: the shim reports not ready.
    pub draining: AtomicBool,
    /// This shim's region and its peers, when it has peers (docs/REGIONS.md).
    pub regions: Option<Arc<Regions>>,
}

impl Shim {
    pub fn new(store: AnyStore, config: ShimConfig, metrics: Arc<Metrics>) -> Shim {
        Shim {
            store,
            admission: Admission::new(config.max_in_flight),
            config,
            metrics,
            draining: AtomicBool::new(false),
            regions: None,
        }
    }

    /// The same shim serving several regions.
    pub fn with_regions(mut self, regions: Arc<Regions>) -> Shim {
        self.regions = Some(regions);
        self
    }

    /// Whether a caller presenting `presented` (absent: an empty token) may be served:
    /// always without `--token`, else when it is the token.
    pub fn accepts_token(&self, presented: &[u8]) -> bool {
        self.config
            .token
            .as_ref()
            .is_none_or(|token| constant_time_eq(presented, token.as_bytes()))
    }
}

/// Compares in time independent of where the inputs differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"secret"));
    }
}
