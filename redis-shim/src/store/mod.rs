//! Where the counters live: the [`Store`] trait, everything deciding, refunding, adjusting,
//! peeking and a batch need from it (the functions of [`scripts`], each on the keys one
//! call reaches), [`StoreAdmin`], what readiness and the admin endpoints need, and why an
//! operation failed. [`redis_store`] is the store the shim runs on, a standalone Redis or
//! a Redis Cluster reached over [`redis_connection`], with the cluster's map of masters
//! (`cluster_nodes`) and concurrent callers' requests merged into one call per target
//! (`coalesce`). [`memory`] runs the same algorithms in Rust in one process, for tests
//! and development (`redis-shim/tests/` holds it to Redis's answers); [`any_store`] is
//! either, what the shim is served with. The unit tests of the decision layer run on a
//! fake that records its calls and fails on demand (`fake`).

pub mod any_store;
pub(crate) mod cluster_nodes;
mod coalesce;
#[cfg(test)]
pub(crate) mod fake;
pub mod memory;
pub mod redis_connection;
pub mod redis_store;
pub mod regions;
pub mod scripts;

use ratelimit_wire::Check;
use redis::cluster_routing::Slot;
use redis::RedisError;
use scripts::{Charge, Mode, RequestChecks, RequestRows, Row};
use std::fmt;
use std::future::Future;

/// Requests sharing one of these can be decided in one call (see
/// [`Store::shared_script`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedScript {
    /// A standalone Redis (or a store in memory): every key in reach.
    Standalone,
    /// The keys of one cluster slot.
    Slot(u16),
    /// The keys of one cluster master, named by its lowest slot.
    Node(u16),
}

/// What a batch call answers: per request, its rows or its error; or the failure of the
/// call.
pub type Answer = Result<Vec<RequestRows>, StoreError>;

/// The operations the checks need from the counters' store: the functions of
/// [`crate::store::scripts`], run on the keys one call reaches. Behind a trait so the
/// shim runs on Redis or in memory, and the decision across slots is tested against a
/// fake.
pub trait Store {
    /// Groups check indices by the cluster slot of their keys, in order of first
    /// appearance; every index in exactly one group.
    fn group_by_slot(&self, keys: &[String]) -> Vec<Vec<usize>>;

    /// Runs check.lua in `mode` over `checks`, whose keys (all in one slot) are `keys`:
    /// one row per check.
    fn check(
        &self,
        mode: Mode,
        keys: &[&str],
        checks: &[&Check],
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// Runs refund.lua over `charges` (all in one slot): one row per charge, its key's
    /// state after the refund.
    fn refund(&self, charges: &[Charge<'_>]) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// The call that can decide a request whose keys are `keys` along with other
    /// requests' (those answering the same), or `None` when no call reaches all of its
    /// keys: it is then decided slot by slot ([`crate::decide::decision::decide`]).
    fn shared_script(&self, keys: &[String]) -> Option<SharedScript>;

    /// Runs check_batch.lua over `requests`, whose keys all share `script`: each request
    /// charged on its own, as check.lua would charge it alone, possibly in one call with
    /// concurrent callers' requests. A request whose part failed has its error in its
    /// place ([`crate::store::cluster_nodes::moved_away`] when its keys left the call's
    /// reach, nothing written: decide it again slot by slot).
    fn check_requests(
        &self,
        script: SharedScript,
        requests: &[RequestChecks<'_>],
    ) -> impl Future<Output = Answer> + Send;
}

/// What readiness and the admin endpoints need from the store, besides the checks.
pub trait StoreAdmin {
    /// Whether the store answers (every master of a cluster).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes `key`; whether it was there.
    fn delete(&self, key: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Keys matching the glob `pattern` (Redis's MATCH) where `near`'s slot lies (every
    /// key sharing its hash tag lives there), at most `limit`.
    fn scan_near(
        &self,
        near: &str,
        pattern: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
}

/// Runs check.lua in `mode` over the checks at `group`'s indices of `keys` and `checks`
/// (keys all in one slot): one row per check of the group.
pub async fn check_group<S: Store>(
    store: &S,
    mode: Mode,
    group: &[usize],
    keys: &[String],
    checks: &[Check],
) -> Result<Vec<Row>, StoreError> {
    let group_keys: Vec<&str> = group.iter().map(|&i| keys[i].as_str()).collect();
    let group_checks: Vec<&Check> = group.iter().map(|&i| &checks[i]).collect();
    store.check(mode, &group_keys, &group_checks).await
}

/// Why a Redis operation failed.
#[derive(Debug)]
pub enum StoreError {
    /// No answer within the Redis timeout.
    Timeout,
    Redis(RedisError),
    /// The script answered something the shim does not understand.
    Malformed(String),
    /// One request's part of a batch script failed (its checks unusable, or a command
    /// failing on one of its keys); the other requests were decided.
    Script(String),
    /// This Redis cannot run the shim's functions.
    Unsupported(String),
}

impl StoreError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout => "timeout",
            StoreError::Redis(_) => "error",
            StoreError::Malformed(_) => "malformed_reply",
            StoreError::Script(_) | StoreError::Unsupported(_) => "error",
        }
    }

    /// The same failure, for another request that shared its script.
    pub fn duplicate(&self) -> StoreError {
        match self {
            StoreError::Timeout => StoreError::Timeout,
            StoreError::Redis(e) => StoreError::Script(e.to_string()),
            StoreError::Malformed(e) => StoreError::Malformed(e.clone()),
            StoreError::Script(e) => StoreError::Script(e.clone()),
            StoreError::Unsupported(e) => StoreError::Unsupported(e.clone()),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Timeout => f.write_str("timed out"),
            StoreError::Redis(e) => write!(f, "{e}"),
            StoreError::Malformed(e) => write!(f, "malformed script reply: {e}"),
            StoreError::Script(e) | StoreError::Unsupported(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// Check indices grouped by the Redis Cluster slot of their keys (hash tags honoured),
/// groups in order of their first key.
pub fn group_by_slot(keys: &[String]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
    for (index, key) in keys.iter().enumerate() {
        let slot = Slot::for_key(key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(index),
            None => groups.push((slot, vec![index])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

#[cfg(test)]
mod tests {
    use super::group_by_slot;

    #[test]
    fn keys_sharing_a_hash_tag_share_a_group() {
        let keys: Vec<String> = ["rl:per-minute:{abc}", "rl:per-ip:{zzz}", "rl:per-day:{abc}"]
            .map(String::from)
            .to_vec();
        assert_eq!(group_by_slot(&keys), vec![vec![0, 2], vec![1]]);
    }

    #[test]
    fn keys_without_tags_hash_whole() {
        // "foo" and "bar" are known to hash to different slots (12182 and 5061).
        let keys: Vec<String> = ["foo", "bar", "{foo}x"].map(String::from).to_vec();
        assert_eq!(group_by_slot(&keys), vec![vec![0, 2], vec![1]]);
    }
}
