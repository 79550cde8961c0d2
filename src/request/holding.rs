//! What a request holds once decided, until its stream ends: the charges its response
//! settles, and what goes back when the stream ends (for any reason), including what an
//! answer still on its way grants it.

use super::RequestDecision;
use crate::config::Scope;
use crate::events::Event;
use crate::local::{CheckState, LocalLayer, SlotStore};
use crate::settlement::PendingSettlement;
use crate::stream_end::{held, Held};
use crate::wire::Settlement;

impl RequestDecision {
    /// The charges of the admitted request that its response settles, taken once.
    pub fn take_settlements(&mut self) -> Vec<PendingSettlement> {
        std::mem::take(&mut self.to_settle)
    }

    /// Each check the shim charged for a rule whose cost the response reports.
    pub(super) fn charges_to_settle(&self) -> Vec<PendingSettlement> {
        self.planned
            .iter()
            .zip(&self.pass.checks)
            .filter_map(|(item, state)| {
                let CheckState::Known(result) = *state else {
                    return None;
                };
                let cost = item.rule.cost_from_response.clone()?;
                (result.granted > 0).then(|| PendingSettlement {
                    rule_index: item.rule_index,
                    cost,
                    settlement: Settlement {
                        key: item.check.key.clone(),
                        algorithm: item.check.algorithm,
                        limit: item.check.limit,
                        period_ms: item.check.period_ms,
                        charged: result.granted,
                        actual: result.granted,
                        stamp: result.stamp,
                        calendar: item.check.calendar,
                    },
                })
            })
            .collect()
    }

    /// The request's stream ended (for any reason): what it holds goes back, and so does
    /// whatever an answer still on its way grants it. Returns the events to record;
    /// nothing the second time.
    pub fn end_stream<S: SlotStore>(&mut self, local: &LocalLayer<'_, S>) -> Vec<Event> {
        self.stream_ended = true;
        let mut events: Vec<Event> = local
            .end_stream(&mut self.pass)
            .into_iter()
            .map(Event::Count)
            .collect();
        events.extend(self.take_held().into_iter().flat_map(Held::into_events));
        events
    }

    pub fn stream_ended(&self) -> bool {
        self.stream_ended
    }

    /// What the request holds now, taken: a result no longer holds it afterwards.
    pub(super) fn take_held(&mut self) -> Vec<Held> {
        let taken = held(
            self.planned
                .iter()
                .zip(&self.pass.checks)
                .filter_map(|(item, state)| {
                    match state {
                        // A local rule's slot is in shared data: the local layer gives it back.
                        CheckState::Known(result) if item.rule.scope == Scope::Global => {
                            Some((item.rule_index, &item.check, result))
                        }
                        _ => None,
                    }
                }),
        );
        for (item, state) in self.planned.iter().zip(self.pass.checks.iter_mut()) {
            if let CheckState::Known(result) = state {
                if taken.iter().any(|held| held.rule_index == item.rule_index) {
                    result.granted = 0;
                }
            }
        }
        taken
    }
}
