//! What the filter counts, per rule: one table of stat names, shown by Envoy as
//! `wasmcustom.ratelimit.<rule>.<stat>`. The pure layers say which stat to bump; the
//! host layer defines and increments them.

/// A per-rule stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stat {
    Allowed,
    Denied,
    ShadowDenied,
    DeniedLocally,
    DenyCacheHits,
    LeaseHits,
    ShimChecks,
    ShimErrors,
    ShimTimeouts,
    FailedOpen,
    FailedClosed,
    /// Concurrency slots given back when their request's stream ended: with `allowed`,
    /// what a concurrency rule admitted, the difference is what is in flight (or leaked).
    Released,
    CostSettled,
    CostUnreported,
    /// A response whose body was not read: its worker's budget for reading bodies was
    /// spent (also counted as `cost_unreported`).
    CostOverBudget,
    /// Checks the shim did not decide because it does not know one of their fields (an
    /// older shim, during an upgrade): each rule's failure mode decided them (also
    /// counted as `failed_open` or `failed_closed`, or by its fallback bucket).
    ShimUnsupported,
    /// Requests over this rule's limit sent on to its spill-over instead of refused
    /// (`denied` counts the refused ones).
    Spilled,
}

impl Stat {
    pub const ALL: [Stat; 17] = [
        Stat::Allowed,
        Stat::Denied,
        Stat::ShadowDenied,
        Stat::DeniedLocally,
        Stat::DenyCacheHits,
        Stat::LeaseHits,
        Stat::ShimChecks,
        Stat::ShimErrors,
        Stat::ShimTimeouts,
        Stat::FailedOpen,
        Stat::FailedClosed,
        Stat::Released,
        Stat::CostSettled,
        Stat::CostUnreported,
        Stat::CostOverBudget,
        Stat::ShimUnsupported,
        Stat::Spilled,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stat::Allowed => "allowed",
            Stat::Denied => "denied",
            Stat::ShadowDenied => "shadow_denied",
            Stat::DeniedLocally => "denied_locally",
            Stat::DenyCacheHits => "deny_cache_hits",
            Stat::LeaseHits => "lease_hits",
            Stat::ShimChecks => "shim_checks",
            Stat::ShimErrors => "shim_errors",
            Stat::ShimTimeouts => "shim_timeouts",
            Stat::FailedOpen => "failed_open",
            Stat::FailedClosed => "failed_closed",
            Stat::Released => "released",
            Stat::CostSettled => "cost_settled",
            Stat::CostUnreported => "cost_unreported",
            Stat::CostOverBudget => "cost_over_budget",
            Stat::ShimUnsupported => "shim_unsupported",
            Stat::Spilled => "spilled",
        }
    }

    /// Position in [`Stat::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One stat to bump for the rule at `rule_index` of the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    pub rule_index: usize,
    pub stat: Stat,
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_stat_sits_at_its_index() {
        for (position, stat) in Stat::ALL.into_iter().enumerate() {
            assert_eq!(stat.index(), position, "{}", stat.name());
        }
    }
}
