//! A request with `home` or `replicated` checks on a shim that serves several regions
//! (docs/REGIONS.md): decided all or nothing as any request is
//! ([`crate::decide::decision::decide`]), over the router that sends each check to the
//! region that counts it ([`Routed`]). On a shim without peers such checks count in this
//! region alone, as `independent` ones, which is said once in the log.

use crate::decide::decision::{self, DecideError, Decision};
use crate::decide::peek::peek;
use crate::store::any_store::AnyStore;
use crate::store::regions::router::Routed;
use crate::store::regions::Regions;
use crate::store::StoreError;
use ratelimit_wire::{Check, CheckResult, Regions as Rung};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether some of `checks` count beyond this region.
pub fn crosses_regions(checks: &[Check]) -> bool {
    checks.iter().any(|check| !check.regions.is_independent())
}

/// Why `checks` cannot be decided across `regions`: a replicated check whose cost is
/// more than one region's share of a whole limit would never be admitted.
pub fn refused_across(regions: &Regions, checks: &[Check]) -> Option<String> {
    let count = regions.count() as u64;
    checks.iter().enumerate().find_map(|(i, check)| {
        (check.regions == Rung::Replicated && check.cost > check.limit / count).then(|| {
            format!(
                "checks[{i}].cost: a replicated check's cost must be at most its limit over the {count} regions ({})",
                check.limit / count
            )
        })
    })
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

/// The state of `checks` across `regions`, charging nothing: each where it is counted.
pub async fn peek_across(
    store: &AnyStore,
    regions: &Regions,
    keys: &[String],
    checks: &[Check],
) -> Result<Vec<CheckResult>, StoreError> {
    match store {
        AnyStore::Redis(local) => peek(&Routed::new(local, regions, keys, checks), keys, checks).await,
        AnyStore::Memory(_) => peek(store, keys, checks).await,
    }
}

/// Per check, each region's component of a replicated counter as this region's Redis
/// holds it (region name, count in the window it holds), sorted by region; empty for
/// any other check.
pub async fn components(
    store: &AnyStore,
    keys: &[String],
    checks: &[Check],
) -> Result<Vec<Vec<(String, u64)>>, StoreError> {
    let mut all = Vec::with_capacity(checks.len());
    for (key, check) in keys.iter().zip(checks) {
        let AnyStore::Redis(local) = store else {
            all.push(Vec::new());
            continue;
        };
        if check.regions != Rung::Replicated {
            all.push(Vec::new());
            continue;
        }
        let fields: BTreeMap<String, String> = local.command(redis::cmd("HGETALL").arg(key)).await?;
        all.push(
            fields
                .iter()
                .filter_map(|(field, value)| {
                    Some((field.strip_prefix("c:")?.to_string(), value.parse().ok()?))
                })
                .collect(),
        );
    }
    Ok(all)
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
