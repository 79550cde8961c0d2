//! The per-Envoy layer in front of the shim, kept in Envoy shared data so that every
//! worker thread sees it: local token buckets, the deny cache, token leases and local
//! concurrency counts.
//!
//! A [`LocalLayer`] is the configuration and the slot table (`slots`) together. For a
//! planned request it runs, check by check (`step`), the lease, the deny cache and the
//! local bucket (`bucket`), and leaves each check decided here or for the shim
//! ([`LocalPass`]); `lease` holds the lease protocol. When the shim answers, it learns from the answer (leases granted,
//! keys to deny until their retry time); when the shim cannot answer, it applies each
//! rule's local fallback. Whatever it charged is given back when the request ends up
//! refused, and a local concurrency slot (`in_flight`) when its stream ends. Pure over a [`SlotStore`]: the host layer implements it over shared data,
//! tests over a map.

mod bucket;
mod in_flight;
mod lease;
mod slots;
mod step;
#[cfg(test)]
pub(crate) mod tests;

pub use bucket::Bucket;
pub use in_flight::InFlight;
pub use lease::{Claim, HeldLease};
pub use slots::{create_slots, fingerprint, slot_of, SlotError, SlotRecord, SlotStore, RECORD_LEN};

use crate::config::{FilterConfig, RuleFailureMode, Scope};
use crate::plan::PlannedCheck;
use crate::stats::{Count, Stat};
use crate::wire::{Algorithm, CheckResult, Rate, TokenReturn};
use slots::update;
use step::LocalStep;

pub use crate::config::DENY_RECHECK_MS;

/// Whether a refusal of this algorithm holds until a time the shim can tell, so the deny
/// cache may keep it (and predict it from an admission that took the last token). A
/// concurrency refusal lifts whenever a request in flight ends, at any moment: it is
/// never cached, and every concurrency check asks the shim.
pub(crate) fn refusals_last(algorithm: Algorithm) -> bool {
    !algorithm.traits().counts_in_flight
}

/// The local layer of one filter instance on one worker: its configuration over its
/// slot table.
pub struct LocalLayer<'a, S> {
    pub config: &'a FilterConfig,
    pub store: &'a S,
    /// This worker's id, unique within the Envoy: who holds a lease acquisition.
    pub worker: u64,
    /// Whether a request may wait for this worker's lease acquisition (not past its
    /// deadline: it is then checked exactly instead).
    pub may_await_lease: bool,
}

/// Where one planned check stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CheckState {
    /// Decided: by a local rule, a lease, a refusal, the shim's answer or a fallback.
    Known(CheckResult),
    /// For the shim to decide, asking for a lease of `lease` tokens (0: no lease).
    AskShim { lease: u64 },
    /// Not decided: the request was refused before this check, or the shim failed and
    /// the rule lets requests through unseen.
    Unknown,
}

/// Where a request stands after the local layer: one state per planned check.
#[derive(Debug, Default)]
pub struct LocalPass {
    pub checks: Vec<CheckState>,
    /// An enforcing check refused here; nothing stays charged then.
    pub refused: bool,
    /// This worker is acquiring a lease for the counter with this fingerprint: the
    /// request waits for that answer and then runs the local layer again. Nothing stays
    /// charged meanwhile.
    pub awaits_lease: Option<u64>,
    /// Lease acquisitions this request holds for the Envoy.
    pub claims: Vec<Claim>,
    /// When the local layer ran: a lease's time counts from before the shim charged it.
    pub at_ms: u64,
    /// Stats the local layer's decisions bump.
    pub counts: Vec<Count>,
    /// Leases the shim's answer granted to this Envoy, to give back what they leave.
    pub granted_leases: Vec<HeldLease>,
    /// Expired leftovers of earlier leases, to give back to the shim.
    pub returns: Vec<TokenReturn>,
    charges: Vec<Charge>,
    probes: Vec<Probe>,
}

impl LocalPass {
    /// Whether some check waits for the shim.
    pub fn asks_shim(&self) -> bool {
        self.checks
            .iter()
            .any(|state| matches!(state, CheckState::AskShim { .. }))
    }
}

/// A local charge to give back if the request ends up refused (and a local concurrency
/// slot, when its stream ends).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Charge {
    rule_index: usize,
    fingerprint: u64,
    kind: ChargeKind,
    cost: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum ChargeKind {
    Bucket(Rate),
    Fallback(Rate),
    Lease,
    /// A slot of a local concurrency limit, taken in this generation.
    Slot(u64),
}

impl Charge {
    fn refund(&self, record: &mut SlotRecord) {
        match self.kind {
            ChargeKind::Bucket(rate) => record.bucket.give_back(rate, self.cost),
            ChargeKind::Fallback(rate) => record.fallback.give_back(rate, self.cost),
            ChargeKind::Lease => record.lease_tokens += self.cost,
            ChargeKind::Slot(generation) => record.in_flight.give_back(generation),
        }
    }
}

/// A request asking the shim whether a counter's cached refusal has lifted: until
/// `until_ms` the Envoy's other requests for the counter are still refused from the
/// cache. Ended by the answer (a refusal caches anew, an admission clears the entry) or
/// by the request's end without one.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Probe {
    fingerprint: u64,
    until_ms: u64,
}

/// The shim's answer did not carry one result per check sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MismatchedAnswer {
    pub expected: usize,
    pub received: usize,
}

/// What a failed shim call means for the request, once each pending rule's failure mode
/// has been applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackVerdict {
    /// Let it through; checks hold what local fallbacks decided.
    Allow,
    /// A rule fails closed.
    Closed,
    /// A local fallback bucket refused.
    Refused,
}

impl<S: SlotStore> LocalLayer<'_, S> {
    fn update<R>(
        &self,
        fingerprint: u64,
        apply: impl FnMut(&mut SlotRecord) -> (R, bool),
    ) -> Result<R, SlotError> {
        update(self.store, self.config.local_slots, fingerprint, apply)
    }

    /// Runs the local layer for a planned request: leases, deny cache, local buckets.
    pub fn before_shim(&self, planned: &[PlannedCheck], now_ms: u64) -> LocalPass {
        let mut pass = LocalPass {
            checks: vec![CheckState::Unknown; planned.len()],
            at_ms: now_ms,
            ..LocalPass::default()
        };
        for (item, state) in planned.iter().zip(pass.checks.iter_mut()) {
            let rule = &*item.rule;
            let fingerprint = fingerprint(&item.check.key);
            let count = |stat| Count {
                rule_index: item.rule_index,
                stat,
            };
            let step = match self.update(fingerprint, |record| self.step(record, item, now_ms)) {
                Ok(step) => step,
                // A local rule never calls the shim: without local state its failure
                // mode decides here.
                Err(_) if rule.scope == Scope::Local => {
                    let allowed = rule.on_failure != RuleFailureMode::Closed;
                    let result = CheckResult {
                        allowed,
                        limit: item.check.limit,
                        retry_after_ms: if allowed { 0 } else { 1_000 },
                        granted: if allowed { item.check.cost } else { 0 },
                        ..CheckResult::default()
                    };
                    if allowed {
                        LocalStep::Decided(result, item.rate)
                    } else {
                        LocalStep::Refused(result)
                    }
                }
                // Without local state, the shim still decides a global rule, exactly.
                Err(_) => LocalStep::Shim {
                    bucket: None,
                    lease: 0,
                    claim: None,
                    probe: None,
                },
            };
            let charge = |kind| Charge {
                rule_index: item.rule_index,
                fingerprint,
                kind,
                cost: item.check.cost,
            };
            match step {
                LocalStep::DenyCached(result) => {
                    pass.counts.push(count(Stat::DenyCacheHits));
                    *state = CheckState::Known(result);
                    pass.refused = true;
                }
                LocalStep::Refused(result) => {
                    pass.counts.push(count(Stat::DeniedLocally));
                    *state = CheckState::Known(result);
                    pass.refused |= !rule.shadow;
                }
                LocalStep::Decided(result, rate) => {
                    pass.charges.push(charge(ChargeKind::Bucket(rate)));
                    *state = CheckState::Known(result);
                }
                LocalStep::TookSlot(result) => {
                    let generation = u64::try_from(result.stamp).unwrap_or(0);
                    pass.charges.push(charge(ChargeKind::Slot(generation)));
                    *state = CheckState::Known(result);
                }
                LocalStep::Shim {
                    bucket,
                    lease,
                    claim,
                    probe,
                } => {
                    if let Some(rate) = bucket {
                        pass.charges.push(charge(ChargeKind::Bucket(rate)));
                    }
                    pass.claims.extend(claim);
                    pass.probes.extend(probe);
                    *state = CheckState::AskShim { lease };
                }
                LocalStep::Leased(result, bucket) => {
                    if let Some(rate) = bucket {
                        pass.charges.push(charge(ChargeKind::Bucket(rate)));
                    }
                    pass.charges.push(charge(ChargeKind::Lease));
                    pass.counts.push(count(Stat::LeaseHits));
                    *state = CheckState::Known(result);
                }
                LocalStep::AwaitLease => pass.awaits_lease = Some(fingerprint),
            }
            if pass.refused || pass.awaits_lease.is_some() {
                break;
            }
        }
        if pass.refused || pass.awaits_lease.is_some() {
            self.give_back(&std::mem::take(&mut pass.charges));
            self.release(&std::mem::take(&mut pass.claims));
            self.end_probes(&std::mem::take(&mut pass.probes));
            for state in &mut pass.checks {
                if let CheckState::AskShim { .. } = state {
                    *state = CheckState::Unknown;
                }
            }
        }
        pass
    }

    /// Ends the probes of a request that got its answer or will get none: an entry still
    /// held by the probe is cleared, so that the next request asks the shim.
    fn end_probes(&self, probes: &[Probe]) {
        for probe in probes {
            // Best effort: a hold that stays only lasts until its deadline.
            let _ = self.update(probe.fingerprint, |record| {
                let held = record.deny_until_ms == probe.until_ms;
                if held {
                    record.deny_until_ms = 0;
                }
                ((), held)
            });
        }
    }

    fn give_back(&self, charges: &[Charge]) {
        for charge in charges {
            // Best effort: a lost refund only makes the local layer stricter.
            let _ = self.update(charge.fingerprint, |record| {
                charge.refund(record);
                ((), true)
            });
        }
    }

    /// Merges the shim's answer (one result per check asked) into the pass, then records
    /// what the answer teaches: leases granted, keys to deny until their retry time, the
    /// end of this request's lease acquisitions. A refusal of a request's only shim check
    /// is served from this Envoy's lease when other requests' grants filled it. When the
    /// request is refused, local charges are given back.
    pub fn merge_answer(
        &self,
        planned: &[PlannedCheck],
        pass: &mut LocalPass,
        results: &[CheckResult],
        now_ms: u64,
    ) -> Result<(), MismatchedAnswer> {
        let asked: Vec<(&PlannedCheck, u64, &mut CheckState)> = planned
            .iter()
            .zip(pass.checks.iter_mut())
            .filter_map(|(item, state)| match *state {
                CheckState::AskShim { lease } => Some((item, lease, state)),
                _ => None,
            })
            .collect();
        if asked.len() != results.len() {
            return Err(MismatchedAnswer {
                expected: asked.len(),
                received: results.len(),
            });
        }
        let only_check = asked.len() == 1;
        let mut learned = Vec::with_capacity(asked.len());
        for ((item, lease_size, state), result) in asked.into_iter().zip(results) {
            *state = CheckState::Known(*result);
            learned.push((item, lease_size, *result, state));
        }
        let allowed = learned
            .iter()
            .all(|(item, _, result, _)| result.allowed || item.rule.shadow);
        for (item, lease_size, result, state) in learned {
            let (granted, leftover) = self.learn(item, lease_size, &result, allowed, pass.at_ms, now_ms);
            pass.granted_leases.extend(granted);
            pass.returns.extend(leftover);
            // With other checks, the shim charged none of them: admitting this one from
            // the lease would let them pass uncharged.
            if only_check && !result.allowed && !item.rule.shadow {
                if let Some(leased) = self.spend_lease(item, now_ms) {
                    *state = CheckState::Known(leased);
                    pass.charges.push(Charge {
                        rule_index: item.rule_index,
                        fingerprint: fingerprint(&item.check.key),
                        kind: ChargeKind::Lease,
                        cost: item.check.cost,
                    });
                    pass.counts.push(Count {
                        rule_index: item.rule_index,
                        stat: Stat::LeaseHits,
                    });
                }
            }
        }
        pass.claims.clear();
        self.end_probes(&std::mem::take(&mut pass.probes));
        let admitted = planned.iter().zip(&pass.checks).all(|(item, state)| {
            item.rule.shadow || matches!(state, CheckState::Known(result) if result.allowed)
        });
        if !admitted {
            self.give_back(&std::mem::take(&mut pass.charges));
        }
        Ok(())
    }

    /// Applies each pending rule's failure mode after the shim gave no answer.
    pub fn fall_back(&self, planned: &[PlannedCheck], pass: &mut LocalPass, now_ms: u64) -> FallbackVerdict {
        self.release(&std::mem::take(&mut pass.claims));
        self.end_probes(&std::mem::take(&mut pass.probes));
        let mut verdict = FallbackVerdict::Allow;
        for (item, state) in planned.iter().zip(pass.checks.iter_mut()) {
            if !matches!(state, CheckState::AskShim { .. }) {
                continue;
            }
            *state = CheckState::Unknown;
            let rule = &*item.rule;
            let cost = item.check.cost;
            match rule.on_failure {
                RuleFailureMode::Open => {}
                RuleFailureMode::Closed if rule.shadow => {}
                RuleFailureMode::Closed => {
                    verdict = FallbackVerdict::Closed;
                    break;
                }
                RuleFailureMode::Local(rate) => {
                    let fingerprint = fingerprint(&item.check.key);
                    let taken = self.update(fingerprint, |record| {
                        (record.fallback.take(now_ms, rate, cost), true)
                    });
                    // No local state either: this rule cannot decide, so it lets the
                    // request through.
                    if let Ok(result) = taken {
                        *state = CheckState::Known(result);
                        if result.allowed {
                            pass.charges.push(Charge {
                                rule_index: item.rule_index,
                                fingerprint,
                                kind: ChargeKind::Fallback(rate),
                                cost,
                            });
                        } else if !rule.shadow && verdict == FallbackVerdict::Allow {
                            verdict = FallbackVerdict::Refused;
                        }
                    }
                }
            }
        }
        if verdict != FallbackVerdict::Allow {
            self.give_back(&std::mem::take(&mut pass.charges));
        }
        verdict
    }

    /// The request's stream ended: the local concurrency slots it holds are given back.
    /// Returns a count per slot released.
    pub fn end_stream(&self, pass: &mut LocalPass) -> Vec<Count> {
        let (slots, others): (Vec<Charge>, Vec<Charge>) = std::mem::take(&mut pass.charges)
            .into_iter()
            .partition(|charge| matches!(charge.kind, ChargeKind::Slot(_)));
        pass.charges = others;
        // Best effort: a release that cannot be written is recovered after max_duration.
        self.give_back(&slots);
        slots
            .iter()
            .map(|slot| Count {
                rule_index: slot.rule_index,
                stat: Stat::Released,
            })
            .collect()
    }
}
