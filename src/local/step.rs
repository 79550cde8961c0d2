//! One planned check against its counter's slot record: a lease this Envoy holds, the
//! deny cache, a lease acquisition this worker has in flight, the local bucket; and
//! what is left for the shim.

use super::lease::Claim;
use super::slots::SlotRecord;
use super::{LocalLayer, Probe, SlotStore};
use crate::config::Scope;
use crate::plan::PlannedCheck;
use crate::wire::{CheckResult, Rate};

/// What the local layer decided for one check, before its shared data is written back.
pub(super) enum LocalStep {
    DenyCached(CheckResult),
    /// The local bucket refused.
    Refused(CheckResult),
    /// A local rule's bucket admitted, charging this rate.
    Decided(CheckResult, Rate),
    /// A local concurrency rule took a slot: held until the request's stream ends.
    TookSlot(CheckResult),
    /// Served from the Envoy's lease (after charging the local bucket, if any).
    Leased(CheckResult, Option<Rate>),
    /// For the shim, after charging the local bucket (if any), asking for a lease of
    /// `lease` tokens (0: none) when the request holds the acquisition `claim`; `probe`:
    /// the request asks whether the counter's cached refusal has lifted (see [`Probe`]).
    Shim {
        bucket: Option<Rate>,
        lease: u64,
        claim: Option<Claim>,
        probe: Option<Probe>,
    },
    /// This worker is acquiring the counter's lease: wait for it.
    AwaitLease,
}

impl<S: SlotStore> LocalLayer<'_, S> {
    /// One check against its slot record: a lease this Envoy holds, then the deny
    /// cache, then a lease acquisition this worker has in flight, then the local bucket.
    /// Returns the step and whether the record changed.
    pub(super) fn step(
        &self,
        record: &mut SlotRecord,
        item: &PlannedCheck,
        now_ms: u64,
    ) -> (LocalStep, bool) {
        let (rule, check) = (&*item.rule, &item.check);
        let lease = rule.lease.filter(|_| rule.scope == Scope::Global);
        let lease_usable =
            lease.is_some() && record.lease_tokens >= check.cost && now_ms < record.lease_expires_ms;
        let denies = self.config.deny_cache
            && !rule.shadow
            && super::refusals_last(rule.algorithm)
            && check.cost >= record.deny_cost;
        // The deny cache never refuses what this Envoy's own lease can admit.
        if !lease_usable {
            if denies && record.deny_until_ms > now_ms {
                let retry_at_ms = record.deny_retry_at_ms.max(record.deny_until_ms);
                let refusal = CheckResult {
                    allowed: false,
                    limit: check.limit,
                    remaining: 0,
                    // The retry time and reset the shim's refusal reported, not when this
                    // Envoy asks again.
                    reset_ms: record.deny_reset_at_ms.max(retry_at_ms) - now_ms,
                    retry_after_ms: retry_at_ms - now_ms,
                    granted: 0,
                    lease_window_ms: 0,
                    stamp: 0,
                };
                return (LocalStep::DenyCached(refusal), false);
            }
            if lease.is_some()
                && self.may_await_lease
                && record.acquiring_until_ms > now_ms
                && record.acquirer == self.worker
            {
                return (LocalStep::AwaitLease, false);
            }
        }
        if rule.scope == Scope::Local && rule.algorithm.traits().counts_in_flight {
            let result = record.in_flight.take(now_ms, item.rate);
            let step = if result.allowed {
                LocalStep::TookSlot(result)
            } else {
                LocalStep::Refused(result)
            };
            return (step, true);
        }
        let bucket = match rule.scope {
            Scope::Local => Some(item.rate),
            Scope::Global => rule.local,
        };
        if let Some(rate) = bucket {
            let result = record.bucket.take(now_ms, rate, check.cost);
            if !result.allowed {
                return (LocalStep::Refused(result), true);
            }
            if rule.scope == Scope::Local {
                return (LocalStep::Decided(result, rate), true);
            }
        }
        if lease_usable {
            record.lease_tokens -= check.cost;
            let leased = CheckResult {
                allowed: true,
                limit: check.limit,
                remaining: record.lease_tokens,
                reset_ms: record.lease_expires_ms - now_ms,
                retry_after_ms: 0,
                granted: check.cost,
                lease_window_ms: 0,
                stamp: 0,
            };
            return (LocalStep::Leased(leased, bucket), true);
        }
        // Acquire a lease for the Envoy, unless another worker is: then this request is
        // checked exactly, and cannot make the Envoy hold a second lease.
        let claim = match lease {
            Some(_) if record.acquiring_until_ms <= now_ms => {
                let until_ms = now_ms + self.config.shim.timeout_ms();
                record.acquirer = self.worker;
                record.acquiring_until_ms = until_ms;
                Some(Claim {
                    fingerprint: record.fingerprint,
                    until_ms,
                })
            }
            _ => None,
        };
        // A refusal that lifted within the last timeout: this request asks the shim, and
        // the Envoy's other requests for the counter stay refused until it answers (or
        // its deadline passes), instead of all racing to the shim at the instant a busy
        // bucket refills.
        let hold_ms = self.config.shim.timeout_ms();
        let probe =
            (denies && record.deny_until_ms > 0 && now_ms.saturating_sub(record.deny_until_ms) < hold_ms)
                .then(|| {
                    record.deny_until_ms = now_ms + hold_ms;
                    Probe {
                        fingerprint: record.fingerprint,
                        until_ms: record.deny_until_ms,
                    }
                });
        let step = LocalStep::Shim {
            bucket,
            lease: claim.and(lease).map_or(0, |lease| lease.size),
            claim,
            probe,
        };
        (step, bucket.is_some() || claim.is_some() || probe.is_some())
    }
}
