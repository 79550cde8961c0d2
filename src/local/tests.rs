use super::*;
// On wasm32 the same tests run under wasm-bindgen-test (Node).
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use super::slots::update;
use crate::attributes::fake::FakeRequest;
use crate::plan::plan;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// Shared data as a map of slot -> (bytes, version), like Envoy's.
#[derive(Default)]
pub(crate) struct MapStore {
    slots: RefCell<HashMap<u32, (Vec<u8>, u32)>>,
    /// Writes to fail with a CAS mismatch, as if another worker wrote first.
    conflicts: Cell<usize>,
}

impl MapStore {
    /// A store with every slot of `config`'s table created, as `on_configure` does.
    pub(crate) fn with_slots(config: &FilterConfig) -> MapStore {
        let store = MapStore::default();
        create_slots(&store, config.local_slots).unwrap();
        store
    }
}

impl SlotStore for MapStore {
    fn load(&self, slot: u32) -> Option<(Vec<u8>, u32)> {
        self.slots.borrow().get(&slot).cloned()
    }
    fn store(&self, slot: u32, bytes: &[u8], cas: Option<u32>) -> Result<bool, SlotError> {
        let mut slots = self.slots.borrow_mut();
        let version = slots.get(&slot).map_or(0, |(_, v)| *v);
        if self.conflicts.get() > 0 {
            self.conflicts.set(self.conflicts.get() - 1);
            let (bytes, _) = slots.get(&slot).cloned().unwrap_or_default();
            slots.insert(slot, (bytes, version + 1));
            return Ok(false);
        }
        if cas.is_some_and(|cas| cas != version) {
            return Ok(false);
        }
        slots.insert(slot, (bytes.to_vec(), version + 1));
        Ok(true)
    }
}

fn config(rules: &str, extra: &str) -> FilterConfig {
    let json = format!(r#"{{"shim_cluster": "c", "local_slots": 64, {extra} "rules": [{rules}]}}"#);
    FilterConfig::from_json(json.as_bytes()).unwrap()
}

/// This worker's id in the tests.
const WORKER: u64 = 1;

fn layer<'a>(config: &'a FilterConfig, store: &'a MapStore) -> LocalLayer<'a, MapStore> {
    LocalLayer {
        config,
        store,
        worker: WORKER,
        may_await_lease: true,
    }
}

/// The result decided for the check at `position` of the plan.
fn known(pass: &LocalPass, position: usize) -> CheckResult {
    match pass.checks.get(position) {
        Some(CheckState::Known(result)) => *result,
        other => panic!("check {position} is {other:?}"),
    }
}

fn ask(lease: u64) -> CheckState {
    CheckState::AskShim { lease }
}

fn count(stat: Stat) -> Count {
    Count { rule_index: 0, stat }
}

fn request(key: &str) -> FakeRequest {
    FakeRequest::get("/").with_header("x-api-key", key)
}

fn shim_result(allowed: bool, granted: u64, retry_after_ms: u64) -> CheckResult {
    CheckResult {
        allowed,
        limit: 100,
        remaining: 50,
        reset_ms: 1000,
        retry_after_ms,
        granted,
        lease_window_ms: 0,
        stamp: 0,
    }
}

const LOCAL_RULE: &str =
    r#"{"name": "local", "scope": "local", "key": [{"header": "x-api-key"}], "limit": 3, "period": "3s"}"#;

#[test]
fn records_round_trip_and_garbage_reads_as_empty() {
    let record = SlotRecord {
        fingerprint: 7,
        bucket: Bucket {
            tokens: 2.5,
            updated_ms: 99,
        },
        deny_until_ms: 5,
        deny_cost: 2,
        deny_retry_at_ms: 7,
        lease_tokens: 9,
        lease_expires_ms: 11,
        ..SlotRecord::default()
    };
    assert_eq!(SlotRecord::decode(&record.encode()), record);
    assert_eq!(SlotRecord::decode(b"short"), SlotRecord::default());
}

#[test]
fn a_local_rule_admits_its_limit_then_refuses_until_refilled() {
    let config = config(LOCAL_RULE, "");
    let store = MapStore::with_slots(&config);
    let planned = plan(&config, &request("k"));
    let outcomes: Vec<bool> = (0..5)
        .map(|_| !layer(&config, &store).before_shim(&planned, 1_000).refused)
        .collect();
    assert_eq!(outcomes, [true, true, true, false, false]);
    let refused = layer(&config, &store).before_shim(&planned, 1_000);
    let result = known(&refused, 0);
    assert_eq!((result.remaining, result.retry_after_ms), (0, 1_000));
    assert!(!refused.asks_shim());
    // One token per second comes back.
    assert!(!layer(&config, &store).before_shim(&planned, 2_000).refused);
    assert!(layer(&config, &store).before_shim(&planned, 2_000).refused);
}

#[test]
fn a_conflicting_write_is_retried_and_never_spends_a_token_twice() {
    let config = config(LOCAL_RULE, "");
    let store = MapStore::with_slots(&config);
    let planned = plan(&config, &request("k"));
    store.conflicts.set(3);
    let admitted = (0..10)
        .filter(|_| !layer(&config, &store).before_shim(&planned, 1_000).refused)
        .count();
    assert_eq!(admitted, 3);
    store.conflicts.set(usize::MAX);
    // Endless contention: the local layer gives up, it does not spin or panic.
    assert_eq!(update(&store, 64, 5, |_| ((), true)), Err(SlotError::Contended));
}

#[test]
fn the_table_stays_bounded_and_a_flood_of_keys_shares_its_buckets() {
    let config = config(LOCAL_RULE, "");
    let store = MapStore::with_slots(&config);
    let admitted = (0..1_000)
        .filter(|i| {
            let planned = plan(&config, &request(&format!("key-{i}")));
            !layer(&config, &store).before_shim(&planned, 1_000).refused
        })
        .count();
    assert_eq!(store.slots.borrow().len(), 64);
    // At one instant, at most one bucket of 3 per slot.
    assert!(admitted <= 64 * 3, "{admitted} admitted");
}

// Regression: a slot taken over started from a full bucket, so a key crafted to land
// in a victim's slot reset the victim's local limit on every request.
#[test]
fn a_colliding_key_cannot_refill_anothers_bucket() {
    let config = config(LOCAL_RULE, "");
    let store = MapStore::with_slots(&config);
    let victim = plan(&config, &request("victim"));
    let slot = slot_of(fingerprint(&victim[0].check.key), config.local_slots);
    let attacker = (0..)
        .map(|i| plan(&config, &request(&format!("attacker-{i}"))))
        .find(|p| slot_of(fingerprint(&p[0].check.key), config.local_slots) == slot)
        .unwrap();
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += usize::from(!layer(&config, &store).before_shim(&attacker, 1_000).refused);
        admitted += usize::from(!layer(&config, &store).before_shim(&victim, 1_000).refused);
    }
    assert_eq!(admitted, 3, "the two keys share one bucket of 3");
}

#[test]
fn a_denied_key_is_refused_locally_until_its_retry_time() {
    let rule = r#"{"name": "g", "key": [{"header": "x-api-key"}], "limit": 100, "period": "1m"}"#;
    let config = config(rule, "");
    let store = MapStore::with_slots(&config);
    let local = layer(&config, &store);
    let planned = plan(&config, &request("abuser"));
    let mut pass = local.before_shim(&planned, 1_000);
    assert_eq!(pass.checks, [ask(0)]);
    let refusal = CheckResult {
        reset_ms: 60_000,
        ..shim_result(false, 0, 5_000)
    };
    local
        .merge_answer(&planned, &mut pass, &[refusal], 1_000)
        .unwrap();
    assert_eq!(pass.checks, [CheckState::Known(refusal)]);
    let cached = local.before_shim(&planned, 1_500);
    assert!(cached.refused);
    assert_eq!(cached.counts, [count(Stat::DenyCacheHits)]);
    // The cached refusal reports the shim's retry time and reset (full at 61,000 ms).
    assert_eq!(known(&cached, 0).retry_after_ms, 4_500);
    assert_eq!(known(&cached, 0).reset_ms, 59_500);
    // A second after learning it, the shim is asked again (a reset or a raised limit
    // reaches this Envoy within that second); other keys never were cached.
    assert!(local.before_shim(&planned, 1_999).refused);
    let mut recheck = local.before_shim(&planned, 2_000);
    assert_eq!(recheck.checks, [ask(0)]);
    assert!(
        !local
            .before_shim(&plan(&config, &request("polite")), 1_500)
            .refused
    );
    // Still refused: cached for another second, with the retry time it reports.
    let refusal = CheckResult {
        reset_ms: 59_000,
        ..shim_result(false, 0, 4_000)
    };
    local
        .merge_answer(&planned, &mut recheck, &[refusal], 2_000)
        .unwrap();
    assert_eq!(
        known(&local.before_shim(&planned, 2_500), 0).retry_after_ms,
        3_500
    );
    assert_eq!(local.before_shim(&planned, 3_000).checks, [ask(0)]);
}

#[test]
fn a_lifted_refusal_sends_one_request_to_the_shim_and_holds_the_rest() {
    let rule = r#"{"name": "g", "key": [{"header": "x-api-key"}], "limit": 100, "period": "1s"}"#;
    let config = config(rule, r#""timeout": "200ms","#);
    let store = MapStore::with_slots(&config);
    let local = layer(&config, &store);
    let planned = plan(&config, &request("abuser"));
    let refuse = |pass: &mut LocalPass, now| {
        let refusal = shim_result(false, 0, 10);
        local.merge_answer(&planned, pass, &[refusal], now).unwrap();
    };
    let mut first = local.before_shim(&planned, 1_000);
    refuse(&mut first, 1_000);
    // The refusal lifts at 1,010: one request asks, the others are still refused.
    let mut probe = local.before_shim(&planned, 1_010);
    assert_eq!(probe.checks, [ask(0)]);
    let held = local.before_shim(&planned, 1_011);
    assert!(held.refused);
    assert_eq!(known(&held, 0).retry_after_ms, 199);
    // Refused again: cached anew for the answer's retry time, then one probe again.
    refuse(&mut probe, 1_012);
    assert!(local.before_shim(&planned, 1_021).refused);
    let mut probe = local.before_shim(&planned, 1_022);
    assert_eq!(probe.checks, [ask(0)]);
    // Admitted: the entry is cleared and every request goes to the shim again.
    local
        .merge_answer(&planned, &mut probe, &[shim_result(true, 1, 0)], 1_023)
        .unwrap();
    assert_eq!(local.before_shim(&planned, 1_024).checks, [ask(0)]);
    assert_eq!(local.before_shim(&planned, 1_024).checks, [ask(0)]);
    // A probe the shim could not answer ends too: the rule's failure mode then decides
    // the next requests, not a refusal cached before the shim went away.
    let mut first = local.before_shim(&planned, 2_000);
    refuse(&mut first, 2_000);
    let mut probe = local.before_shim(&planned, 2_010);
    assert_eq!(
        local.fall_back(&planned, &mut probe, 2_210),
        FallbackVerdict::Allow
    );
    assert_eq!(local.before_shim(&planned, 2_211).checks, [ask(0)]);
    // A refusal that lifted longer than a timeout ago holds nothing back.
    let mut first = local.before_shim(&planned, 3_000);
    refuse(&mut first, 3_000);
    assert_eq!(local.before_shim(&planned, 3_500).checks, [ask(0)]);
    assert_eq!(local.before_shim(&planned, 3_500).checks, [ask(0)]);
}

#[test]
fn an_admission_that_took_the_last_token_refuses_the_next_requests_until_one_refills() {
    // 100 per second: a token every 10 ms.
    let rule = r#"{"name": "g", "key": [{"header": "x-api-key"}], "limit": 100, "period": "1s"}"#;
    let config = config(rule, "");
    let store = MapStore::with_slots(&config);
    let local = layer(&config, &store);
    let planned = plan(&config, &request("busy"));
    let last_token = CheckResult {
        remaining: 0,
        reset_ms: 1_000,
        ..shim_result(true, 1, 0)
    };
    let mut pass = local.before_shim(&planned, 1_000);
    local
        .merge_answer(&planned, &mut pass, &[last_token], 1_000)
        .unwrap();
    assert_eq!(known(&pass, 0), last_token, "the admission itself stands");
    let cached = local.before_shim(&planned, 1_004);
    assert!(cached.refused);
    assert_eq!(known(&cached, 0).retry_after_ms, 6);
    assert_eq!(local.before_shim(&planned, 1_010).checks, [ask(0)]);
    // An admission that leaves a token caches nothing.
    let mut pass = local.before_shim(&planned, 5_000);
    local
        .merge_answer(&planned, &mut pass, &[shim_result(true, 1, 0)], 5_000)
        .unwrap();
    assert_eq!(local.before_shim(&planned, 5_001).checks, [ask(0)]);
}

#[test]
fn the_last_token_of_a_calendar_month_refuses_until_the_month_ends() {
    let rule = r#"{"name": "m", "key": [{"header": "x-api-key"}], "limit": 2, "calendar": "month"}"#;
    let config = config(rule, "");
    let store = MapStore::with_slots(&config);
    let local = layer(&config, &store);
    let planned = plan(&config, &request("monthly"));
    // Twenty days left in the month: not the 15.5 days of its period over its limit.
    let twenty_days_ms = 20 * 86_400_000;
    let last_token = CheckResult {
        remaining: 0,
        reset_ms: twenty_days_ms,
        ..shim_result(true, 1, 0)
    };
    let mut pass = local.before_shim(&planned, 1_000);
    local
        .merge_answer(&planned, &mut pass, &[last_token], 1_000)
        .unwrap();
    let cached = local.before_shim(&planned, 1_004);
    assert!(cached.refused);
    assert_eq!(known(&cached, 0).retry_after_ms, twenty_days_ms - 4);
}

#[test]
fn an_answer_that_does_not_match_the_checks_asked_changes_nothing() {
    let rule = r#"{"name": "g", "key": [{"header": "x-api-key"}], "limit": 100, "period": "1m"}"#;
    let config = config(rule, "");
    let store = MapStore::with_slots(&config);
    let local = layer(&config, &store);
    let planned = plan(&config, &request("k"));
    let mut pass = local.before_shim(&planned, 1_000);
    let two = [shim_result(true, 1, 0), shim_result(true, 1, 0)];
    assert_eq!(
        local.merge_answer(&planned, &mut pass, &two, 1_000),
        Err(MismatchedAnswer {
            expected: 1,
            received: 2
        })
    );
    assert_eq!(pass.checks, [ask(0)]);
}

#[test]
fn leases_serve_requests_locally_until_spent_or_expired() {
    let rule = r#"{"name": "g", "key": [{"header": "x-api-key"}], "limit": 100, "period": "1m",
                   "lease": {"size": 5, "ttl": "1s"}}"#;
    let config = config(rule, "");
    let store = MapStore::with_slots(&config);
    let local = layer(&config, &store);
    let planned = plan(&config, &request("k"));
    let mut pass = local.before_shim(&planned, 1_000);
    assert_eq!(pass.checks, [ask(5)], "asks for a lease of 5");
    local
        .merge_answer(&planned, &mut pass, &[shim_result(true, 5, 0)], 1_000)
        .unwrap();
    for _ in 0..4 {
        let leased = local.before_shim(&planned, 1_100);
        assert!(!leased.asks_shim());
        assert_eq!(leased.counts, [count(Stat::LeaseHits)]);
    }
    assert_eq!(local.before_shim(&planned, 1_100).checks, [ask(5)], "lease spent");
    let mut refill = local.before_shim(&planned, 1_200);
    local
        .merge_answer(&planned, &mut refill, &[shim_result(true, 5, 0)], 1_200)
        .unwrap();
    assert_eq!(
        local.before_shim(&planned, 2_500).checks,
        [ask(5)],
        "lease expired"
    );
}

#[test]
fn a_refusal_by_the_shim_gives_local_charges_back() {
    let rules = r#"{"name": "local", "scope": "local", "key": [{"header": "x-api-key"}], "limit": 1, "period": "1m"},
                   {"name": "global", "key": [{"header": "x-api-key"}], "limit": 10, "period": "1m"}"#;
    let config = config(rules, "");
    let store = MapStore::with_slots(&config);
    let local = layer(&config, &store);
    let planned = plan(&config, &request("k"));
    let mut pass = local.before_shim(&planned, 1_000);
    assert!(matches!(
        pass.checks[..],
        [CheckState::Known(_), CheckState::AskShim { lease: 0 }]
    ));
    local
        .merge_answer(&planned, &mut pass, &[shim_result(false, 0, 1)], 1_000)
        .unwrap();
    // The local token came back: once the deny cache lets the key through, the local
    // rule does not refuse it.
    assert!(!local.before_shim(&planned, 1_002).refused);
}

#[test]
fn failure_modes_per_rule() {
    let rule = |mode: &str| {
        format!(r#"{{"name": "g", "key": [{{"header": "x-api-key"}}], "limit": 100, "period": "1m"{mode}}}"#)
    };
    let store = MapStore::default();
    let run = |config: &FilterConfig| {
        create_slots(&store, config.local_slots).unwrap();
        let local = layer(config, &store);
        let planned = plan(config, &request("k"));
        let mut pass = local.before_shim(&planned, 1_000);
        local.fall_back(&planned, &mut pass, 1_000)
    };
    assert_eq!(
        run(&config(&rule(r#", "failure_mode": "open""#), "")),
        FallbackVerdict::Allow
    );
    assert_eq!(
        run(&config(&rule(r#", "failure_mode": "closed""#), "")),
        FallbackVerdict::Closed
    );
    assert_eq!(
        run(&config(&rule(""), r#""failure_mode": "closed","#)),
        FallbackVerdict::Closed
    );
    let local = config(
        &rule(r#", "failure_mode": "local", "fallback": {"limit": 2, "period": "1m"}"#),
        "",
    );
    let verdicts: Vec<FallbackVerdict> = (0..3).map(|_| run(&local)).collect();
    assert_eq!(
        verdicts,
        [
            FallbackVerdict::Allow,
            FallbackVerdict::Allow,
            FallbackVerdict::Refused
        ]
    );
}

const LEASED_RULE: &str = r#"{"name": "g", "key": [{"header": "x-api-key"}], "limit": 100, "period": "1m",
                              "lease": {"size": 5, "ttl": "1s"}}"#;

fn worker<'a>(config: &'a FilterConfig, store: &'a MapStore, worker: u64) -> LocalLayer<'a, MapStore> {
    LocalLayer {
        worker,
        ..layer(config, store)
    }
}

#[test]
fn one_lease_acquisition_per_counter_per_envoy_and_the_workers_requests_wait_for_it() {
    let config = config(LEASED_RULE, "");
    let store = MapStore::with_slots(&config);
    let (first_worker, second_worker) = (worker(&config, &store, 1), worker(&config, &store, 2));
    let planned = plan(&config, &request("k"));
    let mut acquiring = first_worker.before_shim(&planned, 1_000);
    assert_eq!(acquiring.checks, [ask(5)]);
    assert_eq!(acquiring.claims.len(), 1);
    // The same worker waits for that answer, charging nothing meanwhile.
    let waiting = first_worker.before_shim(&planned, 1_010);
    assert_eq!(waiting.awaits_lease, Some(fingerprint(&planned[0].check.key)));
    assert_eq!(waiting.checks, [CheckState::Unknown]);
    // Another worker cannot make the Envoy hold a second lease: it is checked exactly.
    assert_eq!(second_worker.before_shim(&planned, 1_010).checks, [ask(0)]);
    // Past its deadline a request does not wait: it too is checked exactly.
    let impatient = LocalLayer {
        may_await_lease: false,
        ..worker(&config, &store, 1)
    };
    assert_eq!(impatient.before_shim(&planned, 1_020).checks, [ask(0)]);
    first_worker
        .merge_answer(&planned, &mut acquiring, &[shim_result(true, 5, 0)], 1_050)
        .unwrap();
    // The waiting request, run again, spends the lease; so does the other worker.
    assert_eq!(
        first_worker.before_shim(&planned, 1_060).counts,
        [count(Stat::LeaseHits)]
    );
    assert_eq!(
        second_worker.before_shim(&planned, 1_060).counts,
        [count(Stat::LeaseHits)]
    );
}

#[test]
fn an_acquisition_that_will_not_be_answered_is_released() {
    const LOCAL: &str =
        r#"{"name": "l", "scope": "local", "key": [{"header": "x-api-key"}], "limit": 1, "period": "1h"}"#;
    let both = config(&format!("{LEASED_RULE}, {LOCAL}"), "");
    let local_only = config(LOCAL, "");
    let store = MapStore::with_slots(&both);
    // Spend the local rule's only token (same rule name and key: the same counter).
    assert!(
        !layer(&local_only, &store)
            .before_shim(&plan(&local_only, &request("k")), 1_000)
            .refused
    );
    // The leased rule claims the acquisition, then the local rule refuses: the claim
    // goes with the refusal, so nobody waits for an answer that will not come.
    let local = layer(&both, &store);
    let planned = plan(&both, &request("k"));
    let refused = local.before_shim(&planned, 1_001);
    assert!(refused.refused);
    assert!(refused.claims.is_empty());
    let leased_only = config(LEASED_RULE, "");
    let next = layer(&leased_only, &store).before_shim(&plan(&leased_only, &request("k")), 1_002);
    assert_eq!(next.awaits_lease, None);
    assert_eq!(next.checks, [ask(5)]);
}

#[test]
fn a_refusal_of_a_requests_only_check_is_served_from_the_envoys_lease() {
    let config = config(LEASED_RULE, "");
    let store = MapStore::with_slots(&config);
    let (first_worker, second_worker) = (worker(&config, &store, 1), worker(&config, &store, 2));
    let planned = plan(&config, &request("k"));
    let mut acquiring = first_worker.before_shim(&planned, 1_000);
    let mut exact = second_worker.before_shim(&planned, 1_000);
    // The grant comes back first, then the other worker's exact check is refused (the
    // grant took the counter's last tokens): the lease admits it instead.
    first_worker
        .merge_answer(&planned, &mut acquiring, &[shim_result(true, 5, 0)], 1_010)
        .unwrap();
    second_worker
        .merge_answer(&planned, &mut exact, &[shim_result(false, 0, 30_000)], 1_010)
        .unwrap();
    assert!(known(&exact, 0).allowed);
    assert_eq!(exact.counts, [count(Stat::LeaseHits)]);
    // The refusal is remembered, but never refuses what the lease can still admit.
    for _ in 0..3 {
        assert_eq!(
            first_worker.before_shim(&planned, 1_020).counts,
            [count(Stat::LeaseHits)]
        );
    }
    let refused = first_worker.before_shim(&planned, 1_020);
    assert_eq!(refused.counts, [count(Stat::DenyCacheHits)]);
}

#[test]
fn a_lease_never_outlives_the_window_it_was_charged_to() {
    let config = config(LEASED_RULE, "");
    let store = MapStore::with_slots(&config);
    let local = layer(&config, &store);
    let planned = plan(&config, &request("k"));
    let mut acquiring = local.before_shim(&planned, 1_000);
    let grant = CheckResult {
        lease_window_ms: 200,
        ..shim_result(true, 5, 0)
    };
    local
        .merge_answer(&planned, &mut acquiring, &[grant], 1_000)
        .unwrap();
    assert_eq!(
        local.before_shim(&planned, 1_199).counts,
        [count(Stat::LeaseHits)]
    );
    // The window ended at 1,200 ms, well before the rule's 1 s ttl.
    assert_eq!(local.before_shim(&planned, 1_200).checks, [ask(5)]);
}

#[test]
fn what_an_expired_lease_leaves_goes_back_once() {
    let config = config(LEASED_RULE, "");
    let store = MapStore::with_slots(&config);
    let local = layer(&config, &store);
    let planned = plan(&config, &request("k"));
    let mut acquiring = local.before_shim(&planned, 1_000);
    let grant = CheckResult {
        stamp: 42,
        ..shim_result(true, 5, 0)
    };
    local
        .merge_answer(&planned, &mut acquiring, &[grant], 1_000)
        .unwrap();
    let [held] = &acquiring.granted_leases[..] else {
        panic!("{:?}", acquiring.granted_leases)
    };
    assert_eq!(held.expires_ms, 2_000);
    assert_eq!(
        local.before_shim(&planned, 1_500).counts,
        [count(Stat::LeaseHits)]
    );
    assert_eq!(local.take_leftover(held, 1_999), None, "not expired yet");
    let back = local.take_leftover(held, 2_000).unwrap();
    assert_eq!(
        (back.key.as_str(), back.amount, back.stamp),
        (planned[0].check.key.as_str(), 3, 42)
    );
    assert_eq!(local.take_leftover(held, 2_001), None, "given back once");
}

#[test]
fn a_new_grant_gives_back_the_expired_leftover_it_replaces() {
    let config = config(LEASED_RULE, "");
    let store = MapStore::with_slots(&config);
    let local = layer(&config, &store);
    let planned = plan(&config, &request("k"));
    let mut first = local.before_shim(&planned, 1_000);
    local
        .merge_answer(&planned, &mut first, &[shim_result(true, 5, 0)], 1_000)
        .unwrap();
    let old = first.granted_leases[0].clone();
    let mut second = local.before_shim(&planned, 2_500);
    local
        .merge_answer(&planned, &mut second, &[shim_result(true, 5, 0)], 2_500)
        .unwrap();
    assert_eq!(second.returns.iter().map(|r| r.amount).collect::<Vec<_>>(), [4]);
    // The leftover went back with the new grant: the old lease's expiry finds nothing.
    assert_eq!(local.take_leftover(&old, 3_000), None);
}
