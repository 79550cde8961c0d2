//! [`AnyStore`]: the store the shim is served with, Redis or the one in memory, each
//! operation handed to the one it holds (a `match`, not a virtual call: the trait's
//! futures are generic, and the hot path stays as direct as on a `RedisStore` alone).

use crate::store::memory::MemoryStore;
use crate::store::redis_store::RedisStore;
use crate::store::scripts::{Charge, Mode, RequestChecks, Row};
use crate::store::{Answer, SharedScript, Store, StoreAdmin, StoreError};
use ratelimit_wire::Check;

/// Redis (what `redis-shim` runs on), or counters in this process's memory (tests and
/// development only: two shims on it share nothing, and a restart forgets every count).
// One per process, made once: the size of the Redis variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum AnyStore {
    Redis(RedisStore),
    Memory(MemoryStore),
}

impl Store for AnyStore {
    fn group_by_slot(&self, keys: &[String]) -> Vec<Vec<usize>> {
        match self {
            AnyStore::Redis(store) => store.group_by_slot(keys),
            AnyStore::Memory(store) => store.group_by_slot(keys),
        }
    }

    async fn check(&self, mode: Mode, keys: &[&str], checks: &[&Check]) -> Result<Vec<Row>, StoreError> {
        match self {
            AnyStore::Redis(store) => store.check(mode, keys, checks).await,
            AnyStore::Memory(store) => store.check(mode, keys, checks).await,
        }
    }

    async fn refund(&self, charges: &[Charge<'_>]) -> Result<Vec<Row>, StoreError> {
        match self {
            AnyStore::Redis(store) => store.refund(charges).await,
            AnyStore::Memory(store) => store.refund(charges).await,
        }
    }

    fn shared_script(&self, keys: &[String]) -> Option<SharedScript> {
        match self {
            AnyStore::Redis(store) => store.shared_script(keys),
            AnyStore::Memory(store) => store.shared_script(keys),
        }
    }

    async fn check_requests(&self, script: SharedScript, requests: &[RequestChecks<'_>]) -> Answer {
        match self {
            AnyStore::Redis(store) => store.check_requests(script, requests).await,
            AnyStore::Memory(store) => store.check_requests(script, requests).await,
        }
    }
}

impl StoreAdmin for AnyStore {
    async fn ping(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Redis(store) => store.ping().await,
            AnyStore::Memory(store) => store.ping().await,
        }
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        match self {
            AnyStore::Redis(store) => store.delete(key).await,
            AnyStore::Memory(store) => store.delete(key).await,
        }
    }

    async fn scan_near(&self, near: &str, pattern: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        match self {
            AnyStore::Redis(store) => store.scan_near(near, pattern, limit).await,
            AnyStore::Memory(store) => store.scan_near(near, pattern, limit).await,
        }
    }
}
