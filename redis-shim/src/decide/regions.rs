//! A request with `home` or `replicated` checks on a shim that serves several regions
//! (docs/REGIONS.md): decided all or nothing as any request is
//! ([`crate::decide::decision::decide`]), over the router that sends each check to the
//! region that counts it ([`Routed`]). On a shim without peers such checks count in this
//! region alone, as `independent` ones, which is said once in the log.

use crate::decide::decision::{self, DecideError, Decision};
use crate::store::any_store::AnyStore;
use crate::store::regions::router::Routed;
use crate::store::regions::Regions;
use ratelimit_wire::Check;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether some of `checks` count beyond this region.
pub fn crosses_regions(checks: &[Check]) -> bool {
    checks.iter().any(|check| !check.regions.is_independent())
}

/// Decides `checks` (Redis keys `keys`) across `regions`.
pub async fn decide_across(
    store: &AnyStore,
    regions: &Regions,
    keys: &[String],
    checks: &[Check],
) -> Result<Decision, DecideError> {
    match store {
        AnyStore::Redis(local) => {
            decision::decide(&Routed::new(local, regions, keys, checks), keys, checks).await
        }
        // Regions are refused at start on the store in memory.
        AnyStore::Memory(_) => decision::decide(store, keys, checks).await,
    }
}

/// Says once that `checks` name a rung this shim, without peers, serves as independent.
pub fn note_without_peers(checks: &[Check]) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if let Some(check) = checks.iter().find(|check| !check.regions.is_independent()) {
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                regions = check.regions.as_str(),
                "a check asks for regions, but this shim has no --peer-region: it counts in this region alone, as independent"
            );
        }
    }
}
