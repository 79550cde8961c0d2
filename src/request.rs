//! One request's decision, from its plan to its outcome: a small state machine, pure so
//! that `cargo test` runs every transition natively.
//!
//! [`RequestDecision::start`] runs the local layer over the plan and either decides at
//! once or names the checks to ask the shim; then one of [`RequestDecision::on_answer`]
//! (the shim's results) or [`RequestDecision::on_failure`] (a [`ShimFailure`]) decides.
//! Each step returns what to do with the request together with the [`Event`]s the host
//! must record (stats, log lines): deciding never touches the host. When the request's
//! stream ends, [`RequestDecision::end_stream`] says what it gives back
//! ([`stream_end`](crate::stream_end)).

use crate::config::RuleFailureMode;
use crate::events::Event;
use crate::judged::Judged;
use crate::local::{CheckState, Claim, FallbackVerdict, LocalLayer, LocalPass, SlotStore};
use crate::plan::PlannedCheck;
use crate::response::{decide, shadow_refusals, unavailable, Outcome};
use crate::settlement::PendingSettlement;
use crate::shim_call::ShimFailure;
use crate::spill::{spill_over, Spill};
use crate::stats::{Count, Stat};
use crate::stream_end::{Held, SlotAsked};
use crate::wire::{Check, CheckResult, UnsupportedCheck};

mod holding;
mod unsupported;

/// A step's result and the events to record for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition<T> {
    pub next: T,
    pub events: Vec<Event>,
}

/// Where a request goes after the local layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    Decided(Outcome),
    /// Ask the shim these checks, then call `on_answer` or `on_failure`. The request
    /// acquires the Envoy's lease of the counters in `claims`: other requests of this
    /// worker for them wait for its answer. `slots`: the checks that can grant it a
    /// concurrency slot, to release at once should the answer find the stream gone.
    AskShim {
        checks: Vec<Check>,
        claims: Vec<Claim>,
        slots: Vec<SlotAsked>,
    },
    /// This worker is acquiring the lease of the counter with this fingerprint: call
    /// `run_local` again once that acquisition ends.
    AwaitLease(u64),
}

/// A request's decision in progress.
#[derive(Debug, Default)]
pub struct RequestDecision {
    /// Every applicable rule's check for this request.
    planned: Vec<PlannedCheck>,
    /// What the local layer and the shim have decided so far.
    pass: LocalPass,
    /// The charges the response settles, once the shim admitted the request.
    to_settle: Vec<PendingSettlement>,
    /// The request's stream has ended: whatever it is granted from now on goes back.
    stream_ended: bool,
    /// This is the check of a request spilled over by these rules: it refuses rather
    /// than spill again, and an admission names them to the client.
    spilled: Option<Spill>,
}

impl RequestDecision {
    /// Runs the local layer over a non-empty plan.
    pub fn start<S: SlotStore>(
        local: &LocalLayer<'_, S>,
        planned: Vec<PlannedCheck>,
        now_ms: u64,
    ) -> (RequestDecision, Transition<Start>) {
        RequestDecision::start_spilled(local, planned, None, now_ms)
    }

    /// Runs the local layer over the plan of a request spilled over by `spilled` (which
    /// the plan leaves out), or over a request's first plan.
    pub fn start_spilled<S: SlotStore>(
        local: &LocalLayer<'_, S>,
        planned: Vec<PlannedCheck>,
        spilled: Option<Spill>,
        now_ms: u64,
    ) -> (RequestDecision, Transition<Start>) {
        let mut request = RequestDecision {
            planned,
            pass: LocalPass::default(),
            to_settle: Vec::new(),
            stream_ended: false,
            spilled,
        };
        let transition = request.run_local(local, now_ms);
        (request, transition)
    }

    /// Runs the local layer, again after waiting for a lease.
    pub fn run_local<S: SlotStore>(&mut self, local: &LocalLayer<'_, S>, now_ms: u64) -> Transition<Start> {
        self.pass = local.before_shim(&self.planned, now_ms);
        let mut events: Vec<Event> = self.pass.counts.drain(..).map(Event::Count).collect();
        let next = if let Some(fingerprint) = self.pass.awaits_lease {
            Start::AwaitLease(fingerprint)
        } else if self.pass.refused || !self.pass.asks_shim() {
            Start::Decided(self.decide_known(local, now_ms, &mut events))
        } else {
            self.count_asked(Stat::ShimChecks, &mut events);
            Start::AskShim {
                checks: self.checks_for_shim(),
                claims: self.pass.claims.clone(),
                slots: self.slots_asked(),
            }
        };
        Transition { next, events }
    }

    /// The shim's results, one per check asked.
    pub fn on_answer<S: SlotStore>(
        &mut self,
        local: &LocalLayer<'_, S>,
        results: &[CheckResult],
        now_ms: u64,
    ) -> Transition<Outcome> {
        self.on_answer_in_part(local, results, &[], now_ms)
    }

    /// The shim's results, one per check asked, where the checks in `unsupported` (by
    /// position among those asked) were not decided: a newer filter's field the shim
    /// does not know. Each of those is decided by its rule's failure mode, after the
    /// others, as if the shim had failed for it alone; the others stand as the shim
    /// decided and charged them (docs/OPERATIONS.md, "Upgrading").
    pub fn on_answer_in_part<S: SlotStore>(
        &mut self,
        local: &LocalLayer<'_, S>,
        results: &[CheckResult],
        unsupported: &[UnsupportedCheck],
        now_ms: u64,
    ) -> Transition<Outcome> {
        let set_aside = match self.set_aside(results.len(), unsupported) {
            Ok(set_aside) => set_aside,
            Err(reason) => return self.on_failure(local, ShimFailure::BadAnswer(reason), now_ms),
        };
        let decided: Vec<CheckResult> = results
            .iter()
            .enumerate()
            .filter(|(position, _)| !unsupported.iter().any(|check| check.position == *position))
            .map(|(_, result)| *result)
            .collect();
        match local.merge_answer(&self.planned, &mut self.pass, &decided, now_ms) {
            Ok(()) => {
                let pass = &mut self.pass;
                let mut events: Vec<Event> = pass.counts.drain(..).map(Event::Count).collect();
                events.extend(pass.granted_leases.drain(..).map(Event::LeaseGranted));
                events.extend(pass.returns.drain(..).map(Event::ReturnTokens));
                let next = if set_aside.is_empty() {
                    self.decide_known(local, now_ms, &mut events)
                } else {
                    self.decide_set_aside(local, set_aside, now_ms, &mut events)
                };
                if let Outcome::Allow { .. } = next {
                    self.to_settle = self.charges_to_settle();
                }
                if self.stream_ended {
                    events.extend(self.take_held().into_iter().flat_map(Held::into_events));
                }
                Transition { next, events }
            }
            Err(mismatch) => self.on_failure(
                local,
                ShimFailure::BadAnswer(format!(
                    "{} results for {} checks",
                    mismatch.received, mismatch.expected
                )),
                now_ms,
            ),
        }
    }

    /// The shim gave no usable answer: each pending rule's failure mode decides.
    pub fn on_failure<S: SlotStore>(
        &mut self,
        local: &LocalLayer<'_, S>,
        failure: ShimFailure,
        now_ms: u64,
    ) -> Transition<Outcome> {
        let mut events = Vec::new();
        let failed = if failure.is_timeout() {
            Stat::ShimTimeouts
        } else {
            Stat::ShimErrors
        };
        self.count_asked(failed, &mut events);
        events.push(Event::ShimFailed(failure));
        let next = self.fail_pending(local, now_ms, &mut events);
        Transition { next, events }
    }

    /// Each check still waiting for the shim is decided by its rule's failure mode.
    fn fail_pending<S: SlotStore>(
        &mut self,
        local: &LocalLayer<'_, S>,
        now_ms: u64,
        events: &mut Vec<Event>,
    ) -> Outcome {
        // A rule falling back to a local bucket is counted as allowed or denied instead.
        let mut failing_closed = Vec::new();
        for (item, state) in self.planned.iter().zip(&self.pass.checks) {
            let stat = match (state, item.rule.on_failure) {
                (CheckState::AskShim { .. }, RuleFailureMode::Open) => Stat::FailedOpen,
                (CheckState::AskShim { .. }, RuleFailureMode::Closed) => Stat::FailedClosed,
                _ => continue,
            };
            if stat == Stat::FailedClosed && !item.rule.shadow {
                failing_closed.push(item.rule.name.clone());
            }
            events.push(Event::Count(Count {
                rule_index: item.rule_index,
                stat,
            }));
        }
        match local.fall_back(&self.planned, &mut self.pass, now_ms) {
            FallbackVerdict::Closed => {
                let names: Vec<&str> = failing_closed.iter().map(String::as_str).collect();
                Outcome::Reply(unavailable(&names))
            }
            // Pending rules without a fallback decision pass unseen by the headers.
            FallbackVerdict::Refused | FallbackVerdict::Allow => self.decide_known(local, now_ms, events),
        }
    }

    /// The checks asked of the shim that can grant a concurrency slot, with their
    /// position among those sent.
    fn slots_asked(&self) -> Vec<SlotAsked> {
        self.planned
            .iter()
            .zip(&self.pass.checks)
            .filter(|(_, state)| matches!(state, CheckState::AskShim { .. }))
            .enumerate()
            .filter(|(_, (item, _))| item.check.algorithm.traits().counts_in_flight)
            .map(|(position, (item, _))| SlotAsked {
                position,
                rule_index: item.rule_index,
                check: item.check.clone(),
            })
            .collect()
    }

    /// What to ask the shim: each pending check, with the lease it asks for.
    fn checks_for_shim(&self) -> Vec<Check> {
        self.planned
            .iter()
            .zip(&self.pass.checks)
            .filter_map(|(item, state)| match *state {
                CheckState::AskShim { lease } => Some(Check {
                    lease,
                    ..item.check.clone()
                }),
                _ => None,
            })
            .collect()
    }

    fn count_asked(&self, stat: Stat, events: &mut Vec<Event>) {
        for (item, state) in self.planned.iter().zip(&self.pass.checks) {
            if let CheckState::AskShim { .. } = state {
                events.push(Event::Count(Count {
                    rule_index: item.rule_index,
                    stat,
                }));
            }
        }
    }

    /// Decides from every result known so far, and counts the decision per rule.
    fn decide_known<S>(&self, local: &LocalLayer<'_, S>, now_ms: u64, events: &mut Vec<Event>) -> Outcome {
        let known = || {
            self.planned
                .iter()
                .zip(&self.pass.checks)
                .filter_map(|(item, state)| match *state {
                    CheckState::Known(result) => Some((item, result)),
                    _ => None,
                })
        };
        let judged: Vec<Judged<'_>> = known()
            .map(|(item, result)| Judged {
                rule: &item.rule,
                check: &item.check,
                result,
            })
            .collect();
        events.extend(
            shadow_refusals(&judged)
                .into_iter()
                .map(|rule| Event::ShadowRefusal(rule.to_string())),
        );
        let mut outcome = decide(&judged, now_ms, &local.config.response);
        match (&mut outcome, &self.spilled) {
            (Outcome::Reply(_), None) => {
                let known = known().map(|(item, result)| (item.rule_index, &*item.rule, result));
                if let Some(spill) = spill_over(known) {
                    outcome = Outcome::Spill(spill);
                }
            }
            (Outcome::Allow { headers }, Some(spilled)) => headers.push(spilled.response_header()),
            _ => {}
        }
        let allowed = matches!(outcome, Outcome::Allow { .. });
        let refused = if matches!(outcome, Outcome::Spill(_)) {
            Stat::Spilled
        } else {
            Stat::Denied
        };
        for (item, result) in known() {
            let stat = match (item.rule.shadow, result.allowed, allowed) {
                (true, false, _) => Stat::ShadowDenied,
                (false, false, _) => refused,
                (_, true, true) => Stat::Allowed,
                (_, true, false) => continue,
            };
            events.push(Event::Count(Count {
                rule_index: item.rule_index,
                stat,
            }));
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attributes::fake::FakeRequest;
    use crate::config::{CostSource, FilterConfig};
    use crate::local::tests::MapStore;
    use crate::plan::plan;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const NOW_MS: u64 = 1_700_000_000_000;

    fn config(rules: &str) -> FilterConfig {
        let json = format!(r#"{{"shim_cluster": "c", "local_slots": 64, "rules": [{rules}]}}"#);
        FilterConfig::from_json(json.as_bytes()).unwrap()
    }

    fn global(name: &str, extra: &str) -> String {
        format!(
            r#"{{"name": "{name}", "key": [{{"header": "x-api-key"}}], "limit": 10, "period": "10s"{extra}}}"#
        )
    }

    /// Starts a request for API key `k` against `config`.
    fn start(config: &FilterConfig, store: &MapStore) -> (RequestDecision, Transition<Start>) {
        start_for("k", config, store)
    }

    fn start_for(
        api_key: &str,
        config: &FilterConfig,
        store: &MapStore,
    ) -> (RequestDecision, Transition<Start>) {
        let planned = plan(config, &FakeRequest::get("/").with_header("x-api-key", api_key));
        RequestDecision::start(&layer(config, store), planned, NOW_MS)
    }

    fn layer<'a>(config: &'a FilterConfig, store: &'a MapStore) -> LocalLayer<'a, MapStore> {
        LocalLayer {
            config,
            store,
            worker: 1,
            may_await_lease: true,
        }
    }

    fn result(allowed: bool) -> CheckResult {
        CheckResult {
            allowed,
            limit: 10,
            remaining: if allowed { 9 } else { 0 },
            reset_ms: 1_000,
            retry_after_ms: if allowed { 0 } else { 1_000 },
            granted: u64::from(allowed),
            lease_window_ms: 0,
            stamp: 0,
        }
    }

    fn counted(events: &[Event]) -> Vec<(usize, Stat)> {
        events
            .iter()
            .filter_map(|event| match event {
                Event::Count(count) => Some((count.rule_index, count.stat)),
                _ => None,
            })
            .collect()
    }

    fn status(outcome: &Outcome) -> u32 {
        match outcome {
            Outcome::Allow { .. } => 200,
            Outcome::Reply(reply) => reply.status,
            Outcome::Spill(spill) => panic!("no rule spills here: {spill:?}"),
        }
    }

    #[test]
    fn a_local_rule_decides_without_the_shim() {
        let config = config(
            r#"{"name": "l", "scope": "local", "key": [{"header": "x-api-key"}], "limit": 1, "period": "1m"}"#,
        );
        let store = MapStore::with_slots(&config);
        let (_, first) = start(&config, &store);
        let Start::Decided(Outcome::Allow { headers }) = first.next else {
            panic!("{:?}", first.next)
        };
        assert!(headers
            .iter()
            .any(|(name, value)| name == "x-ratelimit-remaining" && value == "0"));
        assert_eq!(counted(&first.events), [(0, Stat::Allowed)]);
        let (_, second) = start(&config, &store);
        let Start::Decided(outcome) = second.next else {
            panic!("{:?}", second.next)
        };
        assert_eq!(status(&outcome), 429);
        assert_eq!(
            counted(&second.events),
            [(0, Stat::DeniedLocally), (0, Stat::Denied)]
        );
    }

    #[test]
    fn a_global_rule_asks_the_shim_and_its_answer_decides() {
        let config = config(
            &[
                global("a", ""),
                global("b", r#", "lease": {"size": 5, "ttl": "1s"}"#),
            ]
            .join(","),
        );
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut request, started) = start(&config, &store);
        let Start::AskShim { checks, .. } = started.next else {
            panic!("{:?}", started.next)
        };
        assert_eq!(checks.iter().map(|c| c.lease).collect::<Vec<_>>(), [0, 5]);
        assert_eq!(
            counted(&started.events),
            [(0, Stat::ShimChecks), (1, Stat::ShimChecks)]
        );
        let answered = request.on_answer(&local, &[result(true), result(false)], NOW_MS);
        assert_eq!(status(&answered.next), 429);
        // Rule `a` admitted a request that `b` refused: counted for neither as allowed.
        assert_eq!(counted(&answered.events), [(1, Stat::Denied)]);

        let (mut allowed, _) = start_for("other", &config, &store);
        let answered = allowed.on_answer(&local, &[result(true), result(true)], NOW_MS);
        assert_eq!(status(&answered.next), 200);
        assert_eq!(
            counted(&answered.events),
            [(0, Stat::Allowed), (1, Stat::Allowed)]
        );
    }

    #[test]
    fn only_a_request_the_shim_admitted_waits_for_its_real_cost() {
        let config = config(
            &[
                global(
                    "tokens",
                    r#", "cost": 3, "cost_from_response": {"header": "x-usage-tokens"}"#,
                ),
                global("plain", ""),
            ]
            .join(","),
        );
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let charged = CheckResult {
            granted: 3,
            stamp: 1_700_000_000_000,
            ..result(true)
        };
        let (mut admitted, _) = start(&config, &store);
        admitted.on_answer(&local, &[charged, result(true)], NOW_MS);
        let pending = admitted.take_settlements();
        assert_eq!(
            pending.len(),
            1,
            "only the rule reading its cost from the response"
        );
        assert_eq!(pending[0].rule_index, 0);
        assert_eq!(
            pending[0].cost.source,
            CostSource::Header("x-usage-tokens".into())
        );
        let settlement = &pending[0].settlement;
        assert_eq!(
            (settlement.charged, settlement.stamp, settlement.limit),
            (3, 1_700_000_000_000, 10)
        );
        assert!(admitted.take_settlements().is_empty(), "taken once");

        // Refused by another rule: nothing was charged, nothing to settle.
        let (mut refused, _) = start_for("other", &config, &store);
        refused.on_answer(&local, &[charged, result(false)], NOW_MS);
        assert!(refused.take_settlements().is_empty());
        // Let through by the failure mode: the shim charged nothing.
        let (mut failed, _) = start_for("third", &config, &store);
        failed.on_failure(&local, ShimFailure::Timeout, NOW_MS);
        assert!(failed.take_settlements().is_empty());
    }

    #[test]
    fn a_shadow_refusal_is_logged_and_counted_but_never_refuses() {
        let config = config(&global("trial", r#", "shadow": true"#));
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut request, _) = start(&config, &store);
        let answered = request.on_answer(&local, &[result(false)], NOW_MS);
        assert_eq!(answered.next, Outcome::Allow { headers: vec![] });
        assert!(answered.events.contains(&Event::ShadowRefusal("trial".into())));
        assert_eq!(counted(&answered.events), [(0, Stat::ShadowDenied)]);
    }

    #[test]
    fn without_an_answer_each_rules_failure_mode_decides() {
        let config = config(
            &[
                global("open", r#", "failure_mode": "open""#),
                global("closed", r#", "failure_mode": "closed""#),
            ]
            .join(","),
        );
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut request, _) = start(&config, &store);
        let failed = request.on_failure(&local, ShimFailure::Timeout, NOW_MS);
        assert_eq!(status(&failed.next), 503);
        assert_eq!(
            counted(&failed.events),
            [
                (0, Stat::ShimTimeouts),
                (1, Stat::ShimTimeouts),
                (0, Stat::FailedOpen),
                (1, Stat::FailedClosed)
            ]
        );
        assert!(failed.events.contains(&Event::ShimFailed(ShimFailure::Timeout)));

        let open_only = self::config(&global("open", r#", "failure_mode": "open""#));
        let local = layer(&open_only, &store);
        let (mut request, _) = start(&open_only, &store);
        let failed = request.on_failure(
            &local,
            ShimFailure::Unreachable("no healthy upstream".into()),
            NOW_MS,
        );
        // Fails open: through, and unseen by the headers.
        assert_eq!(failed.next, Outcome::Allow { headers: vec![] });
        assert_eq!(
            counted(&failed.events),
            [(0, Stat::ShimErrors), (0, Stat::FailedOpen)]
        );
    }

    #[test]
    fn a_local_fallback_limits_while_the_shim_is_down() {
        let config = config(&global(
            "g",
            r#", "failure_mode": "local", "fallback": {"limit": 1, "period": "1m"}"#,
        ));
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let statuses: Vec<u32> = (0..2)
            .map(|_| {
                let (mut request, _) = start(&config, &store);
                status(&request.on_failure(&local, ShimFailure::ShuttingDown, NOW_MS).next)
            })
            .collect();
        assert_eq!(statuses, [200, 429]);
    }

    #[test]
    fn a_check_the_shim_did_not_support_falls_to_its_own_failure_mode_alone() {
        let config = config(
            &[
                global("decided", ""),
                global("open", r#", "failure_mode": "open""#),
                global("closed", r#", "failure_mode": "closed""#),
            ]
            .join(","),
        );
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let not_supported = |position| UnsupportedCheck {
            position,
            field: "priority".into(),
        };
        let placeholder = CheckResult::default();

        // The open rule's check set aside: admitted by the decided rule and the open one.
        let (mut request, _) = start(&config, &store);
        let answered = request.on_answer_in_part(
            &local,
            &[result(true), placeholder, result(true)],
            &[not_supported(1)],
            NOW_MS,
        );
        assert_eq!(status(&answered.next), 200);
        let counts = counted(&answered.events);
        assert!(counts.contains(&(1, Stat::ShimUnsupported)), "{counts:?}");
        assert!(counts.contains(&(1, Stat::FailedOpen)), "{counts:?}");
        assert!(counts.contains(&(0, Stat::Allowed)) && counts.contains(&(2, Stat::Allowed)));
        assert!(!counts.iter().any(|(_, stat)| *stat == Stat::ShimErrors));
        assert!(answered.events.contains(&Event::Unsupported {
            rule: "open".into(),
            field: "priority".into()
        }));

        // The closed rule's check set aside: refused as unavailable, named.
        let (mut request, _) = start(&config, &store);
        let answered = request.on_answer_in_part(
            &local,
            &[result(true), result(true), placeholder],
            &[not_supported(2)],
            NOW_MS,
        );
        assert_eq!(status(&answered.next), 503);
        assert!(counted(&answered.events).contains(&(2, Stat::FailedClosed)));

        // Refused by a decided rule: a 429, and the set-aside check decides nothing.
        let (mut request, _) = start(&config, &store);
        let answered = request.on_answer_in_part(
            &local,
            &[result(false), result(true), placeholder],
            &[not_supported(2)],
            NOW_MS,
        );
        assert_eq!(status(&answered.next), 429);
        let counts = counted(&answered.events);
        assert!(counts.contains(&(2, Stat::ShimUnsupported)), "{counts:?}");
        assert!(!counts.contains(&(2, Stat::FailedClosed)), "{counts:?}");

        // A position outside the checks asked is an answer that does not match (another
        // client: the refusal above is in the deny cache).
        let (mut request, _) = start_for("other", &config, &store);
        let answered = request.on_answer_in_part(
            &local,
            &[result(true), result(true), result(true)],
            &[not_supported(3)],
            NOW_MS,
        );
        assert_eq!(status(&answered.next), 503);
    }

    #[test]
    fn an_answer_that_does_not_match_is_a_failure() {
        let config = config(&global("g", r#", "failure_mode": "closed""#));
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut request, _) = start(&config, &store);
        let answered = request.on_answer(&local, &[], NOW_MS);
        assert_eq!(status(&answered.next), 503);
        assert!(answered
            .events
            .iter()
            .any(|event| matches!(event, Event::ShimFailed(ShimFailure::BadAnswer(_)))));
    }

    #[test]
    fn a_refusal_is_remembered_and_the_next_request_refused_without_the_shim() {
        let config = config(&global("g", ""));
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut request, _) = start(&config, &store);
        request.on_answer(&local, &[result(false)], NOW_MS);
        let (_, next) = start(&config, &store);
        let Start::Decided(outcome) = next.next else {
            panic!("{:?}", next.next)
        };
        assert_eq!(status(&outcome), 429);
        assert_eq!(
            counted(&next.events),
            [(0, Stat::DenyCacheHits), (0, Stat::Denied)]
        );
    }

    #[test]
    fn a_request_waits_for_its_workers_lease_acquisition_then_spends_from_it() {
        let config = config(&global("g", r#", "lease": {"size": 4, "ttl": "1s"}"#));
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut acquiring, started) = start(&config, &store);
        let Start::AskShim { checks, claims, .. } = started.next else {
            panic!("{:?}", started.next)
        };
        assert_eq!((checks[0].lease, claims.len()), (4, 1));
        let (mut waiting, parked) = start(&config, &store);
        assert_eq!(parked.next, Start::AwaitLease(claims[0].fingerprint));
        assert_eq!(counted(&parked.events), []);
        let granted = CheckResult {
            granted: 4,
            ..result(true)
        };
        assert_eq!(status(&acquiring.on_answer(&local, &[granted], NOW_MS).next), 200);
        let resumed = waiting.run_local(&local, NOW_MS);
        let Start::Decided(outcome) = resumed.next else {
            panic!("{:?}", resumed.next)
        };
        assert_eq!(status(&outcome), 200);
        assert_eq!(
            counted(&resumed.events),
            [(0, Stat::LeaseHits), (0, Stat::Allowed)]
        );
    }

    fn concurrency(name: &str, extra: &str) -> String {
        format!(
            r#"{{"name": "{name}", "algorithm": "concurrency", "key": [{{"header": "x-api-key"}}], "limit": 2{extra}}}"#
        )
    }

    fn slot(stamp: i64) -> CheckResult {
        CheckResult {
            allowed: true,
            limit: 2,
            remaining: 1,
            granted: 1,
            stamp,
            ..CheckResult::default()
        }
    }

    fn released(events: &[Event]) -> Vec<i64> {
        events
            .iter()
            .filter_map(|event| match event {
                Event::ReturnTokens(back) => Some(back.stamp),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_admitted_request_releases_its_slot_once_when_its_stream_ends() {
        let config = config(&[global("rate", ""), concurrency("slots", "")].join(","));
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut request, started) = start(&config, &store);
        let Start::AskShim { slots, .. } = started.next else {
            panic!("{:?}", started.next)
        };
        assert_eq!(
            slots
                .iter()
                .map(|s| (s.position, s.rule_index))
                .collect::<Vec<_>>(),
            [(1, 1)],
            "the concurrency check, second among those sent"
        );
        let answered = request.on_answer(&local, &[result(true), slot(901)], NOW_MS);
        assert_eq!(status(&answered.next), 200);
        assert!(
            released(&answered.events).is_empty(),
            "held while the stream lasts"
        );
        let ended = request.end_stream(&local);
        assert_eq!(released(&ended), [901]);
        let Some(Event::ReturnTokens(back)) = ended.first() else {
            panic!("{ended:?}")
        };
        assert_eq!((back.amount, back.limit, back.period_ms), (1, 2, 60_000));
        assert!(counted(&ended).contains(&(1, Stat::Released)));
        assert_eq!(request.end_stream(&local), [], "released once");
    }

    #[test]
    fn a_stream_that_ended_while_waiting_releases_what_the_answer_grants() {
        let config = config(&concurrency("slots", r#", "max_duration": "5s""#));
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut request, _) = start(&config, &store);
        assert_eq!(request.end_stream(&local), [], "nothing held yet");
        let answered = request.on_answer(&local, &[slot(7)], NOW_MS);
        assert_eq!(released(&answered.events), [7]);
        assert!(counted(&answered.events).contains(&(0, Stat::Released)));
    }

    #[test]
    fn a_refused_request_holds_no_slot() {
        let config = config(&concurrency("slots", ""));
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut request, _) = start(&config, &store);
        let refusal = CheckResult {
            allowed: false,
            limit: 2,
            retry_after_ms: 1_000,
            ..CheckResult::default()
        };
        assert_eq!(status(&request.on_answer(&local, &[refusal], NOW_MS).next), 429);
        assert_eq!(request.end_stream(&local), []);
    }

    #[test]
    fn concurrency_refusals_are_never_cached_nor_predicted() {
        let config = config(&concurrency("slots", ""));
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut refused, _) = start(&config, &store);
        let refusal = CheckResult {
            allowed: false,
            limit: 2,
            retry_after_ms: 1_000,
            ..CheckResult::default()
        };
        refused.on_answer(&local, &[refusal], NOW_MS);
        // The last slot taken predicts nothing either: any request in flight may end.
        let (mut last, _) = start(&config, &store);
        let last_slot = CheckResult {
            remaining: 0,
            ..slot(3)
        };
        last.on_answer(&local, &[last_slot], NOW_MS);
        let (_, next) = start(&config, &store);
        assert!(
            matches!(next.next, Start::AskShim { .. }),
            "a slot may have freed: the shim decides ({:?})",
            next.next
        );
    }

    #[test]
    fn a_local_concurrency_slot_is_taken_here_and_released_at_stream_end() {
        let config =
            config(&concurrency("here", r#", "scope": "local", "limit": 1"#).replace(r#""limit": 2, "#, ""));
        let store = MapStore::with_slots(&config);
        let local = layer(&config, &store);
        let (mut first, started) = start(&config, &store);
        assert!(
            matches!(started.next, Start::Decided(Outcome::Allow { .. })),
            "{:?}",
            started.next
        );
        let (_, second) = start(&config, &store);
        let Start::Decided(refused) = second.next else {
            panic!("{:?}", second.next)
        };
        assert_eq!(status(&refused), 429);
        let ended = first.end_stream(&local);
        assert_eq!(counted(&ended), [(0, Stat::Released)]);
        assert!(released(&ended).is_empty(), "nothing goes to the shim");
        assert_eq!(first.end_stream(&local), [], "released once");
        let (_, third) = start(&config, &store);
        assert!(
            matches!(third.next, Start::Decided(Outcome::Allow { .. })),
            "{:?}",
            third.next
        );
    }
}
