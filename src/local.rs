//! The per-Envoy layer in front of the shim, kept in Envoy shared data so that every
//! worker thread sees it: local token buckets, the deny cache and token leases.
//!
//! State lives in a fixed table of `local_slots` slots, created once at start-up; a
//! (rule, key) counter hashes to one slot, and a slot holding another key's state is
//! taken over (keeping its buckets, so colliding keys share them), so a flood of
//! distinct keys can neither grow memory nor refill anyone's bucket. Every write is a
//! compare-and-swap against the version read, retried on conflict, so two workers never
//! spend one token twice. (The host cannot guard the first insert of a key with CAS;
//! creating every slot at start-up, before traffic, is what makes every later write a
//! CAS.)
//!
//! The logic is pure over a [`SlotStore`]; the host layer implements it over shared data
//! and tests over a map.

use crate::config::{FilterConfig, LocalLimit, Rule, RuleFailureMode, Scope};
use crate::plan::PlannedCheck;
use crate::wire::{CheckResponse, CheckResult};

/// Encoded size of a slot.
pub const RECORD_LEN: usize = 10 * 8;
const MAX_ATTEMPTS: usize = 16;

/// Access to the slot table.
pub trait SlotStore {
    /// The slot's bytes and CAS version; `None` when the slot does not exist.
    fn load(&self, slot: u32) -> Option<(Vec<u8>, u32)>;
    /// Writes the slot if its version is still `cas` (unconditionally when `None`);
    /// `Ok(false)` on a version mismatch.
    fn store(&self, slot: u32, bytes: &[u8], cas: Option<u32>) -> Result<bool, StoreError>;
}

/// The store failed or stayed contended; callers treat it as "no local state".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    Host,
    Contended,
}

/// A token bucket's state; `updated_ms == 0` means untouched (full).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Bucket {
    pub tokens: f64,
    pub updated_ms: u64,
}

/// Everything this Envoy remembers about one (rule, key) counter.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SlotRecord {
    /// Which counter owns the slot; 0 is an empty slot.
    pub fingerprint: u64,
    pub bucket: Bucket,
    pub fallback: Bucket,
    pub deny_until_ms: u64,
    pub deny_cost: u64,
    /// When the refused counter is full again, as the shim reported it.
    pub deny_reset_at_ms: u64,
    pub lease_tokens: u64,
    pub lease_expires_ms: u64,
}

impl SlotRecord {
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let words = [
            self.fingerprint,
            self.bucket.tokens.to_bits(),
            self.bucket.updated_ms,
            self.fallback.tokens.to_bits(),
            self.fallback.updated_ms,
            self.deny_until_ms,
            self.deny_cost,
            self.deny_reset_at_ms,
            self.lease_tokens,
            self.lease_expires_ms,
        ];
        let mut bytes = [0u8; RECORD_LEN];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    /// Decodes a slot; anything malformed reads as an empty slot.
    pub fn decode(bytes: &[u8]) -> SlotRecord {
        if bytes.len() != RECORD_LEN {
            return SlotRecord::default();
        }
        let word = |i: usize| {
            let mut chunk = [0u8; 8];
            chunk.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_le_bytes(chunk)
        };
        SlotRecord {
            fingerprint: word(0),
            bucket: Bucket {
                tokens: f64::from_bits(word(1)),
                updated_ms: word(2),
            },
            fallback: Bucket {
                tokens: f64::from_bits(word(3)),
                updated_ms: word(4),
            },
            deny_until_ms: word(5),
            deny_cost: word(6),
            deny_reset_at_ms: word(7),
            lease_tokens: word(8),
            lease_expires_ms: word(9),
        }
    }
}

/// FNV-1a of the counter key, never 0 (0 marks an empty slot).
pub fn fingerprint(counter_key: &str) -> u64 {
    let hash = counter_key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash | 1
}

pub fn slot_of(fingerprint: u64, slots: u32) -> u32 {
    ((fingerprint >> 17) % u64::from(slots.max(1))) as u32
}

/// Creates every slot that does not exist yet. Run at start-up, before traffic.
pub fn create_slots(store: &impl SlotStore, slots: u32) -> Result<(), StoreError> {
    let empty = SlotRecord::default().encode();
    for slot in 0..slots {
        if store.load(slot).is_none() {
            store.store(slot, &empty, None)?;
        }
    }
    Ok(())
}

/// Reads the counter's record (fresh when the slot belongs to another counter), lets
/// `apply` change it, and writes it back with CAS, retrying on conflict. `apply` returns
/// its result and whether to write.
pub fn update<R>(
    store: &impl SlotStore,
    slots: u32,
    fingerprint: u64,
    mut apply: impl FnMut(&mut SlotRecord) -> (R, bool),
) -> Result<R, StoreError> {
    let slot = slot_of(fingerprint, slots);
    for _ in 0..MAX_ATTEMPTS {
        let (bytes, cas) = match store.load(slot) {
            Some((bytes, cas)) => (bytes, Some(cas)),
            None => (Vec::new(), None),
        };
        let mut record = SlotRecord::decode(&bytes);
        if record.fingerprint != fingerprint {
            // Another counter's slot. Its buckets are kept: counters sharing a slot share
            // their local buckets, so a flood of keys (or a key crafted to collide with a
            // victim's) fails towards refusing instead of starting from a full bucket.
            // Its deny entry and lease belong to its own global counter and are dropped.
            record = SlotRecord {
                fingerprint,
                bucket: record.bucket,
                fallback: record.fallback,
                ..SlotRecord::default()
            };
        }
        let (result, write) = apply(&mut record);
        if !write || store.store(slot, &record.encode(), cas)? {
            return Ok(result);
        }
    }
    Err(StoreError::Contended)
}

impl Bucket {
    fn refill(&mut self, now_ms: u64, limit: &LocalLimit) {
        let capacity = limit.limit as f64;
        if self.updated_ms == 0 {
            self.tokens = capacity;
        } else {
            // A wall clock stepping back refills nothing rather than going negative.
            let elapsed = now_ms.saturating_sub(self.updated_ms) as f64;
            self.tokens = (self.tokens + elapsed * capacity / limit.period_ms as f64).min(capacity);
        }
        self.updated_ms = now_ms.max(1);
    }

    /// Takes `cost` tokens if there are enough; returns the state as a check result.
    pub fn take(&mut self, now_ms: u64, limit: &LocalLimit, cost: u64) -> CheckResult {
        self.refill(now_ms, limit);
        let allowed = self.tokens + 1e-9 >= cost as f64;
        if allowed {
            self.tokens = (self.tokens - cost as f64).max(0.0);
        }
        let per_token_ms = limit.period_ms as f64 / limit.limit as f64;
        CheckResult {
            allowed,
            limit: limit.limit,
            remaining: (self.tokens + 1e-9).floor() as u64,
            reset_ms: ((limit.limit as f64 - self.tokens) * per_token_ms).ceil() as u64,
            retry_after_ms: if allowed {
                0
            } else {
                ((cost as f64 - self.tokens) * per_token_ms).ceil() as u64
            },
            granted: if allowed { cost } else { 0 },
        }
    }

    fn give_back(&mut self, limit: &LocalLimit, tokens: u64) {
        self.tokens = (self.tokens + tokens as f64).min(limit.limit as f64);
    }
}

/// Something counted, per rule, for the filter's stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    DeniedLocally,
    DenyCacheHit,
    LeaseHit,
}

/// A local charge to give back if the request ends up refused.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Charge {
    Bucket {
        planned: usize,
        limit: LocalLimit,
        cost: u64,
    },
    Fallback {
        planned: usize,
        limit: LocalLimit,
        cost: u64,
    },
    Lease {
        planned: usize,
        cost: u64,
    },
}

/// Where a request stands after the local layer.
#[derive(Debug, Default)]
pub struct LocalPass {
    /// Results decided locally, by position in the plan.
    pub results: Vec<Option<CheckResult>>,
    /// Positions in the plan still to send to the shim, with the lease size to ask for.
    pub to_shim: Vec<(usize, u64)>,
    /// The plan position of a rule that refused locally; nothing stays charged then.
    pub refused: Option<usize>,
    pub events: Vec<(usize, Event)>,
    charges: Vec<Charge>,
}

fn rule_of<'a>(config: &'a FilterConfig, planned: &[PlannedCheck], index: usize) -> &'a Rule {
    &config.rules[planned[index].rule_index]
}

fn fingerprint_at(planned: &[PlannedCheck], index: usize) -> u64 {
    fingerprint(&planned[index].check.key)
}

/// Runs the local layer for a planned request: deny cache, local buckets, leases.
pub fn before_shim(
    config: &FilterConfig,
    planned: &[PlannedCheck],
    store: &impl SlotStore,
    now_ms: u64,
) -> LocalPass {
    let mut pass = LocalPass {
        results: vec![None; planned.len()],
        ..LocalPass::default()
    };
    for (index, item) in planned.iter().enumerate() {
        let rule = rule_of(config, planned, index);
        let check = &item.check;
        let own_limit = LocalLimit {
            limit: check.limit,
            period_ms: check.period_ms,
        };
        let bucket_limit = match rule.scope {
            Scope::Local => Some(own_limit),
            Scope::Global => rule.local,
        };
        let use_lease = rule.scope == Scope::Global && rule.lease.is_some();
        let step = update(
            store,
            config.local_slots,
            fingerprint_at(planned, index),
            |record| {
                if config.deny_cache
                    && !rule.shadow
                    && record.deny_until_ms > now_ms
                    && check.cost >= record.deny_cost
                {
                    let refusal = CheckResult {
                        allowed: false,
                        limit: check.limit,
                        remaining: 0,
                        // The reset the shim's refusal reported, not the retry time.
                        reset_ms: record.deny_reset_at_ms.max(record.deny_until_ms) - now_ms,
                        retry_after_ms: record.deny_until_ms - now_ms,
                        granted: 0,
                    };
                    return (LocalStep::DenyCached(refusal), false);
                }
                let mut step = LocalStep::Continue;
                if let Some(limit) = &bucket_limit {
                    let result = record.bucket.take(now_ms, limit, check.cost);
                    step = LocalStep::Bucket(result, *limit);
                    if !result.allowed {
                        return (step, true);
                    }
                }
                if use_lease && record.lease_tokens >= check.cost && now_ms < record.lease_expires_ms {
                    record.lease_tokens -= check.cost;
                    let leased = CheckResult {
                        allowed: true,
                        limit: check.limit,
                        remaining: record.lease_tokens,
                        reset_ms: record.lease_expires_ms - now_ms,
                        retry_after_ms: 0,
                        granted: check.cost,
                    };
                    step = LocalStep::Leased(leased, bucket_limit);
                }
                let write = !matches!(step, LocalStep::Continue);
                (step, write)
            },
        );
        let step = match step {
            Ok(step) => step,
            // A local rule never calls the shim: without local state its failure mode
            // decides here.
            Err(_) if rule.scope == Scope::Local => {
                let allowed = rule.on_failure != RuleFailureMode::Closed;
                LocalStep::Bucket(
                    CheckResult {
                        allowed,
                        limit: check.limit,
                        retry_after_ms: if allowed { 0 } else { 1_000 },
                        granted: if allowed { check.cost } else { 0 },
                        ..CheckResult::default()
                    },
                    own_limit,
                )
            }
            // Without local state, the shim still decides a global rule.
            Err(_) => LocalStep::Continue,
        };
        match step {
            LocalStep::DenyCached(result) => {
                pass.events.push((index, Event::DenyCacheHit));
                pass.results[index] = Some(result);
                pass.refused = Some(index);
            }
            LocalStep::Bucket(result, _) if !result.allowed => {
                pass.events.push((index, Event::DeniedLocally));
                pass.results[index] = Some(result);
                if !rule.shadow {
                    pass.refused = Some(index);
                }
            }
            LocalStep::Bucket(result, limit_used) => {
                pass.charges.push(Charge::Bucket {
                    planned: index,
                    limit: limit_used,
                    cost: check.cost,
                });
                if rule.scope == Scope::Local {
                    pass.results[index] = Some(result);
                } else {
                    pass.to_shim.push((index, rule.lease.map_or(0, |l| l.size)));
                }
            }
            LocalStep::Leased(result, bucket) => {
                if let Some(limit) = bucket {
                    pass.charges.push(Charge::Bucket {
                        planned: index,
                        limit,
                        cost: check.cost,
                    });
                }
                pass.charges.push(Charge::Lease {
                    planned: index,
                    cost: check.cost,
                });
                pass.events.push((index, Event::LeaseHit));
                pass.results[index] = Some(result);
            }
            LocalStep::Continue => pass.to_shim.push((index, rule.lease.map_or(0, |l| l.size))),
        }
        if pass.refused.is_some() {
            break;
        }
    }
    if pass.refused.is_some() {
        give_back(config, planned, store, &pass.charges);
        pass.to_shim.clear();
    }
    pass
}

enum LocalStep {
    Continue,
    DenyCached(CheckResult),
    Bucket(CheckResult, LocalLimit),
    Leased(CheckResult, Option<LocalLimit>),
}

impl Charge {
    fn planned(&self) -> usize {
        match self {
            Charge::Bucket { planned, .. }
            | Charge::Fallback { planned, .. }
            | Charge::Lease { planned, .. } => *planned,
        }
    }

    fn refund(&self, record: &mut SlotRecord) {
        match self {
            Charge::Bucket { limit, cost, .. } => record.bucket.give_back(limit, *cost),
            Charge::Fallback { limit, cost, .. } => record.fallback.give_back(limit, *cost),
            Charge::Lease { cost, .. } => record.lease_tokens += *cost,
        }
    }
}

fn give_back(config: &FilterConfig, planned: &[PlannedCheck], store: &impl SlotStore, charges: &[Charge]) {
    for charge in charges {
        // Best effort: a lost refund only makes the local layer stricter.
        let _ = update(
            store,
            config.local_slots,
            fingerprint_at(planned, charge.planned()),
            |record| {
                charge.refund(record);
                ((), true)
            },
        );
    }
}

/// Merges the shim's answer (one result per `pass.to_shim` entry) into the plan's
/// results, then records what the answer teaches: leases granted, keys to deny until
/// their retry time. When the request is refused, local charges are given back.
pub fn after_answer(
    config: &FilterConfig,
    planned: &[PlannedCheck],
    store: &impl SlotStore,
    now_ms: u64,
    pass: &mut LocalPass,
    answer: &CheckResponse,
) -> Option<CheckResponse> {
    if answer.results.len() != pass.to_shim.len() {
        return None;
    }
    for ((index, _), result) in pass.to_shim.iter().zip(&answer.results) {
        pass.results[*index] = Some(*result);
    }
    let results: Vec<CheckResult> = pass.results.iter().map(|r| r.unwrap_or_default()).collect();
    let allowed = planned
        .iter()
        .enumerate()
        .all(|(i, _)| results[i].allowed || rule_of(config, planned, i).shadow);
    for ((index, lease_size), result) in pass.to_shim.iter().zip(&answer.results) {
        let rule = rule_of(config, planned, *index);
        let cost = planned[*index].check.cost;
        let remember_denial =
            config.deny_cache && !rule.shadow && !result.allowed && result.retry_after_ms > 0;
        let lease = rule
            .lease
            .filter(|_| allowed && *lease_size > 0 && result.granted > cost);
        if !remember_denial && lease.is_none() {
            continue;
        }
        let _ = update(
            store,
            config.local_slots,
            fingerprint_at(planned, *index),
            |record| {
                if remember_denial {
                    record.deny_until_ms = now_ms + result.retry_after_ms;
                    record.deny_cost = cost;
                    record.deny_reset_at_ms = now_ms + result.reset_ms;
                }
                if let Some(lease) = lease {
                    if now_ms >= record.lease_expires_ms {
                        record.lease_tokens = 0;
                    }
                    record.lease_tokens += result.granted - cost;
                    record.lease_expires_ms = now_ms + lease.ttl_ms;
                }
                ((), true)
            },
        );
    }
    if !allowed {
        give_back(config, planned, store, &pass.charges);
    }
    Some(CheckResponse { allowed, results })
}

/// What a failed shim call means for the request, rule by rule.
#[derive(Debug, Clone, PartialEq)]
pub enum FailureVerdict {
    /// Let it through; `results` hold what local fallbacks decided.
    Allow,
    /// A rule fails closed.
    Closed(usize),
    /// A local fallback bucket refused (the plan position).
    Refused(usize),
}

/// Applies each pending rule's failure mode after the shim gave no answer.
pub fn on_shim_failure(
    config: &FilterConfig,
    planned: &[PlannedCheck],
    store: &impl SlotStore,
    now_ms: u64,
    pass: &mut LocalPass,
) -> FailureVerdict {
    let mut verdict = FailureVerdict::Allow;
    for &(index, _) in &pass.to_shim {
        let rule = rule_of(config, planned, index);
        let cost = planned[index].check.cost;
        match rule.on_failure {
            RuleFailureMode::Open => {}
            RuleFailureMode::Closed if rule.shadow => {}
            RuleFailureMode::Closed => verdict = FailureVerdict::Closed(index),
            RuleFailureMode::Local(limit) => {
                let taken = update(
                    store,
                    config.local_slots,
                    fingerprint_at(planned, index),
                    |record| (record.fallback.take(now_ms, &limit, cost), true),
                );
                // No local state either: this rule cannot decide, so it lets the request through.
                if let Ok(result) = taken {
                    pass.results[index] = Some(result);
                    if result.allowed {
                        pass.charges.push(Charge::Fallback {
                            planned: index,
                            limit,
                            cost,
                        });
                    } else if !rule.shadow && verdict == FailureVerdict::Allow {
                        verdict = FailureVerdict::Refused(index);
                    }
                }
            }
        }
        if matches!(verdict, FailureVerdict::Closed(_)) {
            break;
        }
    }
    if verdict != FailureVerdict::Allow {
        give_back(config, planned, store, &pass.charges);
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    // On wasm32 the same tests run under wasm-bindgen-test (Node).
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use crate::keys::tests::FakeRequest;
    use crate::plan::plan;
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    /// Shared data as a map of slot -> (bytes, version), like Envoy's.
    #[derive(Default)]
    struct MapStore {
        slots: RefCell<HashMap<u32, (Vec<u8>, u32)>>,
        /// Writes to fail with a CAS mismatch, as if another worker wrote first.
        conflicts: Cell<usize>,
    }

    impl MapStore {
        /// A store with every slot of `config`'s table created, as `on_configure` does.
        fn with_slots(config: &FilterConfig) -> MapStore {
            let store = MapStore::default();
            create_slots(&store, config.local_slots).unwrap();
            store
        }
    }

    impl SlotStore for MapStore {
        fn load(&self, slot: u32) -> Option<(Vec<u8>, u32)> {
            self.slots.borrow().get(&slot).cloned()
        }
        fn store(&self, slot: u32, bytes: &[u8], cas: Option<u32>) -> Result<bool, StoreError> {
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

    fn request(key: &str) -> FakeRequest {
        FakeRequest::get("/").with_header("x-api-key", key)
    }

    fn shim_answer(results: Vec<CheckResult>) -> CheckResponse {
        CheckResponse {
            allowed: results.iter().all(|r| r.allowed),
            results,
        }
    }

    fn shim_result(allowed: bool, granted: u64, retry_after_ms: u64) -> CheckResult {
        CheckResult {
            allowed,
            limit: 100,
            remaining: 50,
            reset_ms: 1000,
            retry_after_ms,
            granted,
        }
    }

    const LOCAL_RULE: &str = r#"{"name": "local", "scope": "local", "key": [{"header": "x-api-key"}], "limit": 3, "period": "3s"}"#;

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
            .map(|_| before_shim(&config, &planned, &store, 1_000).refused.is_none())
            .collect();
        assert_eq!(outcomes, [true, true, true, false, false]);
        let refused = before_shim(&config, &planned, &store, 1_000);
        let result = refused.results[0].unwrap();
        assert_eq!((result.remaining, result.retry_after_ms), (0, 1_000));
        assert!(refused.to_shim.is_empty());
        // One token per second comes back.
        assert!(before_shim(&config, &planned, &store, 2_000).refused.is_none());
        assert!(before_shim(&config, &planned, &store, 2_000).refused.is_some());
    }

    #[test]
    fn a_conflicting_write_is_retried_and_never_spends_a_token_twice() {
        let config = config(LOCAL_RULE, "");
        let store = MapStore::with_slots(&config);
        let planned = plan(&config, &request("k"));
        store.conflicts.set(3);
        let admitted = (0..10)
            .filter(|_| before_shim(&config, &planned, &store, 1_000).refused.is_none())
            .count();
        assert_eq!(admitted, 3);
        store.conflicts.set(usize::MAX);
        // Endless contention: the local layer gives up, it does not spin or panic.
        assert_eq!(update(&store, 64, 5, |_| ((), true)), Err(StoreError::Contended));
    }

    #[test]
    fn the_table_stays_bounded_and_a_flood_of_keys_shares_its_buckets() {
        let config = config(LOCAL_RULE, "");
        let store = MapStore::with_slots(&config);
        let admitted = (0..1_000)
            .filter(|i| {
                let planned = plan(&config, &request(&format!("key-{i}")));
                before_shim(&config, &planned, &store, 1_000).refused.is_none()
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
            admitted += usize::from(before_shim(&config, &attacker, &store, 1_000).refused.is_none());
            admitted += usize::from(before_shim(&config, &victim, &store, 1_000).refused.is_none());
        }
        assert_eq!(admitted, 3, "the two keys share one bucket of 3");
    }

    #[test]
    fn a_denied_key_is_refused_locally_until_its_retry_time() {
        let rule = r#"{"name": "g", "key": [{"header": "x-api-key"}], "limit": 100, "period": "1m"}"#;
        let config = config(rule, "");
        let store = MapStore::with_slots(&config);
        let planned = plan(&config, &request("abuser"));
        let mut pass = before_shim(&config, &planned, &store, 1_000);
        assert_eq!(pass.to_shim, [(0, 0)]);
        let merged = after_answer(
            &config,
            &planned,
            &store,
            1_000,
            &mut pass,
            &shim_answer(vec![CheckResult {
                reset_ms: 60_000,
                ..shim_result(false, 0, 5_000)
            }]),
        );
        assert!(!merged.unwrap().allowed);
        let cached = before_shim(&config, &planned, &store, 3_000);
        assert_eq!(cached.refused, Some(0));
        assert_eq!(cached.events, [(0, Event::DenyCacheHit)]);
        assert_eq!(cached.results[0].unwrap().retry_after_ms, 3_000);
        // The cached refusal reports the shim's reset (full at 61,000 ms), as it did.
        assert_eq!(cached.results[0].unwrap().reset_ms, 58_000);
        // At the retry time the shim is asked again; other keys never were cached.
        assert_eq!(before_shim(&config, &planned, &store, 6_000).to_shim, [(0, 0)]);
        assert!(
            before_shim(&config, &plan(&config, &request("polite")), &store, 3_000)
                .refused
                .is_none()
        );
    }

    #[test]
    fn leases_serve_requests_locally_until_spent_or_expired() {
        let rule = r#"{"name": "g", "key": [{"header": "x-api-key"}], "limit": 100, "period": "1m",
                       "lease": {"size": 5, "ttl": "1s"}}"#;
        let config = config(rule, "");
        let store = MapStore::with_slots(&config);
        let planned = plan(&config, &request("k"));
        let mut pass = before_shim(&config, &planned, &store, 1_000);
        assert_eq!(pass.to_shim, [(0, 5)], "asks for a lease of 5");
        after_answer(
            &config,
            &planned,
            &store,
            1_000,
            &mut pass,
            &shim_answer(vec![shim_result(true, 5, 0)]),
        )
        .unwrap();
        for _ in 0..4 {
            let local = before_shim(&config, &planned, &store, 1_100);
            assert!(local.to_shim.is_empty());
            assert_eq!(local.events, [(0, Event::LeaseHit)]);
        }
        assert_eq!(
            before_shim(&config, &planned, &store, 1_100).to_shim,
            [(0, 5)],
            "lease spent"
        );
        let mut refill = before_shim(&config, &planned, &store, 1_200);
        after_answer(
            &config,
            &planned,
            &store,
            1_200,
            &mut refill,
            &shim_answer(vec![shim_result(true, 5, 0)]),
        )
        .unwrap();
        assert_eq!(
            before_shim(&config, &planned, &store, 2_500).to_shim,
            [(0, 5)],
            "lease expired"
        );
    }

    #[test]
    fn a_refusal_by_the_shim_gives_local_charges_back() {
        let rules = r#"{"name": "local", "scope": "local", "key": [{"header": "x-api-key"}], "limit": 1, "period": "1m"},
                       {"name": "global", "key": [{"header": "x-api-key"}], "limit": 10, "period": "1m"}"#;
        let config = config(rules, "");
        let store = MapStore::with_slots(&config);
        let planned = plan(&config, &request("k"));
        let mut pass = before_shim(&config, &planned, &store, 1_000);
        assert_eq!(pass.to_shim, [(1, 0)]);
        let merged = after_answer(
            &config,
            &planned,
            &store,
            1_000,
            &mut pass,
            &shim_answer(vec![shim_result(false, 0, 1)]),
        );
        assert!(!merged.unwrap().allowed);
        // The local token came back: once the deny cache lets the key through, the local
        // rule does not refuse it.
        let next = before_shim(&config, &planned, &store, 1_002);
        assert_eq!(next.refused, None);
    }

    #[test]
    fn failure_modes_per_rule() {
        let rule = |mode: &str| {
            format!(
                r#"{{"name": "g", "key": [{{"header": "x-api-key"}}], "limit": 100, "period": "1m"{mode}}}"#
            )
        };
        let store = MapStore::default();
        let run = |config: &FilterConfig| {
            create_slots(&store, config.local_slots).unwrap();
            let planned = plan(config, &request("k"));
            let mut pass = before_shim(config, &planned, &store, 1_000);
            on_shim_failure(config, &planned, &store, 1_000, &mut pass)
        };
        assert_eq!(
            run(&config(&rule(r#", "failure_mode": "open""#), "")),
            FailureVerdict::Allow
        );
        assert_eq!(
            run(&config(&rule(r#", "failure_mode": "closed""#), "")),
            FailureVerdict::Closed(0)
        );
        assert_eq!(
            run(&config(&rule(""), r#""failure_mode": "closed","#)),
            FailureVerdict::Closed(0)
        );
        let local = config(
            &rule(r#", "failure_mode": "local", "fallback": {"limit": 2, "period": "1m"}"#),
            "",
        );
        let verdicts: Vec<FailureVerdict> = (0..3).map(|_| run(&local)).collect();
        assert_eq!(
            verdicts,
            [
                FailureVerdict::Allow,
                FailureVerdict::Allow,
                FailureVerdict::Refused(0)
            ]
        );
    }
}
