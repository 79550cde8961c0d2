//! [`MemoryStore`]: the [`Store`] with its counters in this process's memory, the Lua
//! algorithms of `scripts/` written again in Rust, answering what Redis answers. For tests
//! and development only: it is one process's (two shims on it share nothing, a restart
//! forgets every count), so `redis-shim` itself never runs on it; `redis-shim/tests/`
//! runs the shim's suite on it, on a standalone Redis and on a Redis Cluster, and
//! compares its answers with Redis's, so the two cannot drift apart.
//!
//! It plays a standalone Redis: every key in reach of one call, and each call atomic (one
//! lock over the keyspace), all of its checks seeing one instant of the system clock,
//! which is the clock Redis's `TIME` reads on the same host.
//!
//! One file per concept: the Redis types and commands the scripts use ([`keyspace`]),
//! what they share and the dispatch to each algorithm (`algorithm`), one file per
//! algorithm, and the drivers (`request`).

mod algorithm;
mod concurrency;
mod fixed_window;
mod keyspace;
mod request;
mod sliding_window_counter;
mod sliding_window_log;
mod token_bucket;

use crate::store::scripts::{Charge, Mode, RequestChecks, Row};
use crate::store::{Answer, SharedScript, Store, StoreAdmin, StoreError};
use keyspace::Keyspace;
use ratelimit_wire::Check;
use request::{check_request, Keyed};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Calls between two sweeps of the expired keys.
const SWEEP_EVERY: u64 = 1024;

/// Counters in memory, decided as the shim's Lua functions decide them in Redis.
#[derive(Default)]
pub struct MemoryStore {
    keys: Mutex<Keyspace>,
    calls: AtomicU64,
}

/// The system clock in microseconds since the Unix epoch, as Redis's `TIME` gives it.
fn now_us() -> f64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    since_epoch.as_micros() as f64
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// The keyspace, for one call, and the call's instant (µs); expired keys are swept
    /// now and then.
    fn call(&self) -> (MutexGuard<'_, Keyspace>, f64) {
        let mut keys = self.keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = now_us();
        if self
            .calls
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(SWEEP_EVERY)
        {
            keys.sweep((now / 1000.0).floor());
        }
        (keys, now)
    }
}

fn keyed<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    checks: impl IntoIterator<Item = &'a Check>,
) -> Vec<Keyed<'a>> {
    keys.into_iter()
        .zip(checks)
        .map(|(key, check)| Keyed { key, check })
        .collect()
}

impl Store for MemoryStore {
    /// Every key is in reach: one group, as on a standalone Redis.
    fn group_by_slot(&self, keys: &[String]) -> Vec<Vec<usize>> {
        vec![(0..keys.len()).collect()]
    }

    async fn check(&self, mode: Mode, keys: &[&str], checks: &[&Check]) -> Result<Vec<Row>, StoreError> {
        let (mut keyspace, now) = self.call();
        let checks = keyed(keys.iter().copied(), checks.iter().copied());
        check_request(&mut keyspace, &checks, mode == Mode::Charge, now).map_err(StoreError::Script)
    }

    async fn refund(&self, charges: &[Charge<'_>]) -> Result<Vec<Row>, StoreError> {
        let (mut keyspace, now) = self.call();
        request::refund(&mut keyspace, charges, now).map_err(StoreError::Script)
    }

    fn shared_script(&self, _keys: &[String]) -> Option<SharedScript> {
        Some(SharedScript::Standalone)
    }

    /// check_batch.lua: each request on its own, all at one instant.
    async fn check_requests(&self, _script: SharedScript, requests: &[RequestChecks<'_>]) -> Answer {
        let (mut keyspace, now) = self.call();
        Ok(requests
            .iter()
            .map(|request| {
                let checks = keyed(request.keys.iter().map(String::as_str), request.checks);
                check_request(&mut keyspace, &checks, true, now)
            })
            .collect())
    }
}

impl StoreAdmin for MemoryStore {
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let (mut keyspace, now) = self.call();
        Ok(keyspace.del(key, (now / 1000.0).floor()))
    }

    async fn scan_near(&self, _near: &str, pattern: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        let (mut keyspace, now) = self.call();
        Ok(keyspace.scan(pattern, limit, (now / 1000.0).floor()))
    }
}
