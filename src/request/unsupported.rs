//! The checks of a request that a shim did not decide, because it does not know one of
//! their fields (an older shim, within one minor version: `docs/OPERATIONS.md`,
//! "Upgrading"): set aside while the shim's other results are merged, then each decided
//! by its rule's failure mode, counted and reported for logging once.

use super::RequestDecision;
use crate::events::Event;
use crate::local::{CheckState, LocalLayer, SlotStore};
use crate::response::Outcome;
use crate::stats::{Count, Stat};
use crate::wire::{CheckResult, UnsupportedCheck};

/// A check the shim did not decide: its index in the plan, the lease it asked for, and
/// the fields the shim does not know.
pub(super) struct SetAside {
    index: usize,
    lease: u64,
    field: String,
}

impl RequestDecision {
    /// Marks the checks the shim did not decide as passing for the time of merging the
    /// others' results, so that the local layer treats them as no refusal (their
    /// failure mode decides next); returns each one's planned index, lease and field.
    pub(super) fn set_aside(
        &mut self,
        answered: usize,
        unsupported: &[UnsupportedCheck],
    ) -> Result<Vec<SetAside>, String> {
        let asked: Vec<usize> = self
            .pass
            .checks
            .iter()
            .enumerate()
            .filter(|(_, state)| matches!(state, CheckState::AskShim { .. }))
            .map(|(index, _)| index)
            .collect();
        if answered != asked.len() {
            return Err(format!("{answered} results for {} checks", asked.len()));
        }
        let mut set_aside = Vec::with_capacity(unsupported.len());
        for check in unsupported {
            let state = asked
                .get(check.position)
                .and_then(|&index| Some((index, self.pass.checks.get_mut(index)?)));
            let Some((index, state)) = state else {
                return Err(format!(
                    "check {} is not supported, of {answered}",
                    check.position
                ));
            };
            let CheckState::AskShim { lease } = *state else {
                return Err(format!("check {} is named not supported twice", check.position));
            };
            *state = CheckState::Known(CheckResult {
                allowed: true,
                ..CheckResult::default()
            });
            set_aside.push(SetAside {
                index,
                lease,
                field: check.field.clone(),
            });
        }
        Ok(set_aside)
    }

    /// Decides a request some of whose checks the shim did not decide: refused by the
    /// others, they stay undecided; otherwise each one's failure mode decides.
    pub(super) fn decide_set_aside<S: SlotStore>(
        &mut self,
        local: &LocalLayer<'_, S>,
        set_aside: Vec<SetAside>,
        now_ms: u64,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let refused = self
            .planned
            .iter()
            .zip(&self.pass.checks)
            .enumerate()
            .any(|(index, (item, state))| {
                !set_aside.iter().any(|aside| aside.index == index)
                    && !item.rule.shadow
                    && matches!(state, CheckState::Known(result) if !result.allowed)
            });
        for aside in set_aside {
            let (Some(item), Some(state)) = (
                self.planned.get(aside.index),
                self.pass.checks.get_mut(aside.index),
            ) else {
                continue;
            };
            *state = if refused {
                CheckState::Unknown
            } else {
                CheckState::AskShim { lease: aside.lease }
            };
            events.push(Event::Count(Count {
                rule_index: item.rule_index,
                stat: Stat::ShimUnsupported,
            }));
            events.push(Event::Unsupported {
                rule: item.rule.name.clone(),
                field: aside.field,
            });
        }
        if refused {
            self.decide_known(local, now_ms, events)
        } else {
            self.fail_pending(local, now_ms, events)
        }
    }
}
