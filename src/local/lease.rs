//! Leases: tokens the shim grants an Envoy at once, spent locally. One acquisition per
//! counter per Envoy at a time ([`Claim`]), a lease's expiry bounded by the window its
//! tokens were charged to, and what a lease leaves unspent given back ([`HeldLease`]).
//! `docs/LOCAL.md` states the bounds this keeps.

use super::{fingerprint, LocalLayer, SlotStore};
use crate::plan::PlannedCheck;
use crate::wire::{Check, CheckResult, Refill, TokenReturn};

/// A lease acquisition this request holds for the Envoy: the counter, and the time its
/// claim runs out (which also tells it from a later claim of the same worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub fingerprint: u64,
    pub until_ms: u64,
}

/// A lease this worker acquired for the Envoy, until `expires_ms`: what is left of it
/// then goes back to the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLease {
    pub fingerprint: u64,
    pub expires_ms: u64,
    /// The counter the tokens came from (its check, as sent).
    pub counter: Check,
}

impl HeldLease {
    fn token_return(&self, amount: u64, stamp: i64) -> TokenReturn {
        TokenReturn {
            key: self.counter.key.clone(),
            algorithm: self.counter.algorithm,
            limit: self.counter.limit,
            period_ms: self.counter.period_ms,
            amount,
            stamp,
            calendar: self.counter.calendar,
        }
    }
}

impl<S: SlotStore> LocalLayer<'_, S> {
    /// Ends lease acquisitions that will not be answered (the request was refused here,
    /// waits for another, or went away): the next request may acquire.
    pub fn release(&self, claims: &[Claim]) {
        for claim in claims {
            let _ = self.update(claim.fingerprint, |record| {
                let ours = record.acquirer == self.worker && record.acquiring_until_ms == claim.until_ms;
                if ours {
                    record.acquiring_until_ms = 0;
                }
                ((), ours)
            });
        }
    }

    /// Takes the check's cost from this Envoy's lease, if it holds enough.
    pub(super) fn spend_lease(&self, item: &PlannedCheck, now_ms: u64) -> Option<CheckResult> {
        item.rule.lease?;
        let cost = item.check.cost;
        self.update(fingerprint(&item.check.key), |record| {
            if record.lease_tokens < cost || now_ms >= record.lease_expires_ms {
                return (None, false);
            }
            record.lease_tokens -= cost;
            let leased = CheckResult {
                allowed: true,
                limit: item.check.limit,
                remaining: record.lease_tokens,
                reset_ms: record.lease_expires_ms - now_ms,
                retry_after_ms: 0,
                granted: cost,
                lease_window_ms: 0,
                stamp: 0,
            };
            (Some(leased), true)
        })
        .ok()
        .flatten()
    }

    /// Records a refusal in the deny cache and a granted lease in the counter's slot, and
    /// ends the acquisition when this check made one. Returns the lease granted, and the
    /// expired leftover of the one before it, to give back.
    pub(super) fn learn(
        &self,
        item: &PlannedCheck,
        lease_size: u64,
        result: &CheckResult,
        allowed: bool,
        asked_ms: u64,
        now_ms: u64,
    ) -> (Option<HeldLease>, Option<TokenReturn>) {
        let rule = &*item.rule;
        let cost = item.check.cost;
        // An admission that left less than this cost predicts the next refusals: nothing
        // comes back before one cost's worth refills (or the window resets), so the key
        // is refused here until then instead of each request asking the shim to learn it.
        let deny_for_ms = if !result.allowed {
            result.retry_after_ms
        } else if allowed && result.remaining < cost {
            // A fixed window (a calendar month, say) gives nothing back before it ends:
            // an even refill over its period would announce a retry far too early.
            let refill_ms = match item.check.algorithm.traits().refill {
                Refill::AtWindowEnd => result.reset_ms,
                _ => (item.rate.ms_per_token() * cost as f64).ceil() as u64,
            };
            refill_ms.min(result.reset_ms)
        } else {
            0
        };
        let remember_denial =
            self.config.deny_cache && !rule.shadow && super::refusals_last(rule.algorithm) && deny_for_ms > 0;
        let acquiring = lease_size > 0;
        let lease = rule
            .lease
            .filter(|_| allowed && acquiring && result.granted > cost);
        if !remember_denial && lease.is_none() && !acquiring {
            return (None, None);
        }
        let fingerprint = fingerprint(&item.check.key);
        let learned = self.update(fingerprint, |record| {
            let mut learned = (None, None);
            if remember_denial {
                record.deny_until_ms = now_ms + deny_for_ms.min(super::DENY_RECHECK_MS);
                record.deny_retry_at_ms = now_ms + deny_for_ms;
                record.deny_cost = cost;
                record.deny_reset_at_ms = now_ms + result.reset_ms;
            }
            if let Some(lease) = lease {
                let held = HeldLease {
                    fingerprint,
                    expires_ms: record.lease_expires_ms,
                    counter: item.check.clone(),
                };
                if now_ms >= record.lease_expires_ms {
                    if record.lease_tokens > 0 {
                        learned.1 = Some(held.token_return(record.lease_tokens, record.lease_stamp));
                    }
                    record.lease_tokens = 0;
                }
                record.lease_tokens += result.granted - cost;
                record.lease_stamp = result.stamp;
                // Never past the end of the window the tokens were charged to: counted from
                // before the shim charged them, not from when its answer came.
                let ttl_ms = match result.lease_window_ms {
                    0 => lease.ttl.as_ms(),
                    window_ms => lease.ttl.as_ms().min(window_ms),
                };
                record.lease_expires_ms = asked_ms.min(now_ms) + ttl_ms;
                learned.0 = Some(HeldLease {
                    expires_ms: record.lease_expires_ms,
                    ..held
                });
            }
            if acquiring && record.acquirer == self.worker {
                record.acquiring_until_ms = 0;
            }
            (learned, true)
        });
        learned.unwrap_or((None, None))
    }

    /// Takes what is left of an expired lease, to give back to the shim; `None` when it
    /// was spent, or a later lease replaced it.
    pub fn take_leftover(&self, held: &HeldLease, now_ms: u64) -> Option<TokenReturn> {
        self.update(held.fingerprint, |record| {
            let leftover = record.lease_expires_ms == held.expires_ms
                && now_ms >= record.lease_expires_ms
                && record.lease_tokens > 0;
            if !leftover {
                return (None, false);
            }
            let back = held.token_return(record.lease_tokens, record.lease_stamp);
            record.lease_tokens = 0;
            (Some(back), true)
        })
        .ok()
        .flatten()
    }
}
