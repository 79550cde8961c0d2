//! A store in memory for the unit tests of what runs on a [`Store`] (deciding across
//! slots, refunds, peeks): no Redis, and every call it was asked recorded.

use crate::store::scripts::{Charge, Mode, RequestChecks, Row};
use crate::store::{Answer, SharedScript, Store, StoreError};
use ratelimit_wire::{Algorithm, Check};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// What the fake store was asked, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Check(Mode, Vec<String>),
    Refund(Vec<String>),
}

/// Counters in memory, one number of tokens taken per key, each charge taking its
/// check's cost; a key's slot is its hash tag. Any script touching a key of
/// `failing` fails with a timeout, as would a Redis node that stopped answering.
#[derive(Default)]
pub struct FakeStore {
    state: Mutex<FakeState>,
}

#[derive(Default)]
pub struct FakeState {
    pub taken: HashMap<String, u64>,
    pub calls: Vec<Call>,
    pub failing_checks: HashSet<String>,
    pub failing_refunds: HashSet<String>,
    /// Keys `group_by_slot` leaves out, to play a store that breaks its contract.
    pub ungrouped: HashSet<String>,
}

/// The hash tag of `key` (the whole key without one), as Redis Cluster reads it.
fn hash_tag(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let close = key[open + 1..].find('}')?;
            Some(&key[open + 1..open + 1 + close]).filter(|tag| !tag.is_empty())
        })
        .unwrap_or(key)
}

impl FakeStore {
    pub fn with(setup: impl FnOnce(&mut FakeState)) -> FakeStore {
        let store = FakeStore::default();
        setup(&mut store.state.lock().unwrap());
        store
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn taken(&self, key: &str) -> u64 {
        self.state.lock().unwrap().taken.get(key).copied().unwrap_or(0)
    }
}

impl Store for FakeStore {
    fn group_by_slot(&self, keys: &[String]) -> Vec<Vec<usize>> {
        let state = self.state.lock().unwrap();
        let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            if state.ungrouped.contains(key) {
                continue;
            }
            let tag = hash_tag(key);
            match groups.iter_mut().find(|(t, _)| *t == tag) {
                Some((_, members)) => members.push(index),
                None => groups.push((tag, vec![index])),
            }
        }
        groups.into_iter().map(|(_, members)| members).collect()
    }

    /// check.lua's contract: all or nothing over the enforcing checks.
    async fn check(&self, mode: Mode, keys: &[&str], checks: &[&Check]) -> Result<Vec<Row>, StoreError> {
        let mut state = self.state.lock().unwrap();
        state
            .calls
            .push(Call::Check(mode, keys.iter().map(|k| k.to_string()).collect()));
        if keys.iter().any(|key| state.failing_checks.contains(*key)) {
            return Err(StoreError::Timeout);
        }
        let available: Vec<u64> = keys
            .iter()
            .zip(checks)
            .map(|(key, check)| {
                check
                    .limit
                    .saturating_sub(state.taken.get(*key).copied().unwrap_or(0))
            })
            .collect();
        let admits: Vec<bool> = checks.iter().zip(&available).map(|(c, &a)| a >= c.cost).collect();
        let charging = mode == Mode::Charge
            && checks
                .iter()
                .zip(&admits)
                .all(|(check, &admits)| admits || check.shadow);
        let mut rows = Vec::new();
        for ((key, check), (&admits, &available)) in
            keys.iter().zip(checks).zip(admits.iter().zip(&available))
        {
            let granted = if charging && admits { check.cost } else { 0 };
            *state.taken.entry(key.to_string()).or_default() += granted;
            rows.push(Row {
                admits,
                remaining: available - granted,
                reset_ms: 0,
                retry_after_ms: u64::from(!admits),
                granted,
                stamp: if granted > 0 { 7 } else { 0 },
                lease_window_ms: 0,
            });
        }
        Ok(rows)
    }

    async fn refund(&self, charges: &[Charge<'_>]) -> Result<Vec<Row>, StoreError> {
        let mut state = self.state.lock().unwrap();
        state
            .calls
            .push(Call::Refund(charges.iter().map(|c| c.key.to_string()).collect()));
        if charges.iter().any(|c| state.failing_refunds.contains(c.key)) {
            return Err(StoreError::Timeout);
        }
        let mut rows = Vec::new();
        for charge in charges {
            assert_eq!(charge.stamp, 7, "a refund carries its charge's stamp");
            let taken = state.taken.entry(charge.key.to_string()).or_default();
            *taken = taken.saturating_add_signed(-charge.amount);
            rows.push(Row {
                admits: true,
                remaining: charge.check.limit - *taken,
                reset_ms: 0,
                retry_after_ms: 0,
                granted: 0,
                stamp: 0,
                lease_window_ms: 0,
            });
        }
        Ok(rows)
    }

    /// No call reaches two slots' keys: every request is decided slot by slot.
    fn shared_script(&self, _keys: &[String]) -> Option<SharedScript> {
        None
    }

    /// Each request as one check call.
    async fn check_requests(&self, _script: SharedScript, requests: &[RequestChecks<'_>]) -> Answer {
        let mut answers = Vec::with_capacity(requests.len());
        for request in requests {
            let keys: Vec<&str> = request.keys.iter().map(String::as_str).collect();
            let checks: Vec<&Check> = request.checks.iter().collect();
            let rows = self.check(Mode::Charge, &keys, &checks).await;
            answers.push(rows.map_err(|error| error.to_string()));
        }
        Ok(answers)
    }
}

pub fn check(key: &str, limit: u64) -> Check {
    Check {
        key: key.into(),
        algorithm: Algorithm::TokenBucket,
        limit,
        period_ms: 60_000,
        cost: 1,
        shadow: false,
        lease: 0,
        calendar: None,
        regions: Default::default(),
    }
}

pub fn shadow(key: &str, limit: u64) -> Check {
    Check {
        shadow: true,
        ..check(key, limit)
    }
}

pub fn keys(checks: &[Check]) -> Vec<String> {
    checks.iter().map(|c| c.key.clone()).collect()
}

pub fn charge(keys: &[&str]) -> Call {
    Call::Check(Mode::Charge, keys.iter().map(|k| k.to_string()).collect())
}

pub fn peek(keys: &[&str]) -> Call {
    Call::Check(Mode::Peek, keys.iter().map(|k| k.to_string()).collect())
}

pub fn refund(keys: &[&str]) -> Call {
    Call::Refund(keys.iter().map(|k| k.to_string()).collect())
}
