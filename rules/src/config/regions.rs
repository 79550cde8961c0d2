//! A rule's `regions`: where its counter lives when the shim serves several regions
//! (docs/REGIONS.md). Anything but `independent` is refused where the shim would refuse
//! the rule's check, and where the rule sends something after its check that would reach
//! another region than the one that counted it (a lease's unspent tokens, a settlement).
//! Tiers inherit the rule's regions.

use super::model::Scope;
use super::ConfigError;
use crate::wire::{Algorithm, Regions};

/// Whether a rule's `regions` can stand with its `algorithm` (the compiled one: a
/// calendar quota is a fixed window), its `scope`, a lease and a cost from the response.
pub(super) fn check_regions(
    at: &str,
    regions: Regions,
    algorithm: Algorithm,
    scope: Scope,
    has_lease: bool,
    has_cost_from_response: bool,
) -> Result<(), ConfigError> {
    if regions.is_independent() {
        return Ok(());
    }
    let name = regions.as_str();
    let field = |part: &str| format!("{at}.{part}");
    if scope == Scope::Local {
        return Err(ConfigError::new(
            field("regions"),
            format!("a local rule has no shim (it counts in this Envoy alone): it cannot be {name}"),
        ));
    }
    if let Some(reason) = regions.refuses(algorithm, false) {
        return Err(ConfigError::new(field("regions"), reason));
    }
    if has_lease {
        // The shim's own reason, as it would refuse the acquisition.
        let reason = regions.refuses(algorithm, true).unwrap_or_else(|| {
            format!("a lease is not served on a {name} counter (its unspent tokens would come back to the wrong region)")
        });
        return Err(ConfigError::new(field("lease"), reason));
    }
    if has_cost_from_response {
        return Err(ConfigError::new(
            field("cost_from_response"),
            format!("a settlement is not served on a {name} counter (the difference would reach the wrong region): a rule with cost_from_response keeps regions \"independent\""),
        ));
    }
    Ok(())
}
