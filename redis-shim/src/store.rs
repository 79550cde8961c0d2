//! Where the counters live: one standalone Redis or a Redis Cluster, chosen by
//! configuration, behind one type.
//!
//! Both are multiplexed: every concurrent check shares one connection (one per cluster
//! node), its commands pipelined, and a handle is a cheap clone, so no lock is held
//! across a Redis call. Both connect lazily and reconnect by themselves, so the shim
//! starts (and reports not ready) while Redis is still coming up. Every operation is
//! bounded by the Redis timeout, whatever the client library does.

use crate::scripts::{parse_rows, Row};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{RedisError, ScriptInvocation};
use std::fmt;
use std::time::Duration;

/// How the shim reaches Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// One URL (standalone), or the seed nodes of a cluster: `redis://` or `rediss://`
    /// (TLS), with `user:password@` for AUTH.
    pub urls: Vec<String>,
    pub cluster: bool,
    /// Longest a single Redis operation may take.
    pub timeout: Duration,
}

#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A handle on the counters' Redis.
#[derive(Clone)]
pub struct Store {
    connection: Connection,
    timeout: Duration,
}

/// Why a Redis operation failed.
#[derive(Debug)]
pub enum StoreError {
    /// No answer within the Redis timeout.
    Timeout,
    Redis(RedisError),
    /// The script answered something the shim does not understand.
    Malformed(String),
}

impl StoreError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout => "timeout",
            StoreError::Redis(_) => "error",
            StoreError::Malformed(_) => "malformed_reply",
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Timeout => f.write_str("timed out"),
            StoreError::Redis(e) => write!(f, "{e}"),
            StoreError::Malformed(e) => write!(f, "malformed script reply: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl Store {
    /// A lazily connecting store; fails only on a configuration the client refuses (a
    /// malformed URL, say).
    pub fn connect(config: &RedisConfig) -> Result<Store, RedisError> {
        let connection = if config.cluster {
            let client = ClusterClient::builder(config.urls.iter().map(String::as_str))
                .connection_timeout(config.timeout)
                .response_timeout(config.timeout)
                .retries(1)
                .build()?;
            let cluster_config = ClusterConfig::new()
                .set_connection_timeout(config.timeout)
                .set_response_timeout(config.timeout);
            Connection::Cluster(client.get_pending_async_connection_with_config(cluster_config))
        } else {
            let [url] = &config.urls[..] else {
                return Err(RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "a standalone Redis takes exactly one URL",
                )));
            };
            let client = redis::Client::open(url.as_str())?;
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.timeout))
                .set_response_timeout(Some(config.timeout))
                .set_number_of_retries(1);
            Connection::Standalone(ConnectionManager::new_lazy_with_config(client, manager_config)?)
        };
        Ok(Store {
            connection,
            timeout: config.timeout,
        })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.connection, Connection::Cluster(_))
    }

    /// Groups check indices by the cluster slot of their keys, in order of first
    /// appearance; a standalone Redis is one group.
    pub fn group_by_slot(&self, keys: &[String]) -> Vec<Vec<usize>> {
        if self.is_cluster() {
            group_by_slot(keys)
        } else {
            vec![(0..keys.len()).collect()]
        }
    }

    /// Runs a script whose reply is `expected` rows.
    pub async fn run(
        &self,
        invocation: &ScriptInvocation<'_>,
        expected: usize,
    ) -> Result<Vec<Row>, StoreError> {
        let reply = match &self.connection {
            Connection::Standalone(manager) => {
                let mut manager = manager.clone();
                self.bounded(invocation.invoke_async::<Vec<Vec<i64>>>(&mut manager))
                    .await?
            }
            Connection::Cluster(cluster) => {
                let mut cluster = cluster.clone();
                self.bounded(invocation.invoke_async::<Vec<Vec<i64>>>(&mut cluster))
                    .await?
            }
        };
        parse_rows(reply, expected).map_err(|e| StoreError::Malformed(e.0))
    }

    /// PING (every master of a cluster).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let ping = redis::cmd("PING");
        match &self.connection {
            Connection::Standalone(manager) => {
                let mut manager = manager.clone();
                self.bounded(ping.query_async::<String>(&mut manager)).await?;
            }
            Connection::Cluster(cluster) => {
                let mut cluster = cluster.clone();
                self.bounded(ping.query_async::<redis::Value>(&mut cluster))
                    .await?;
            }
        }
        Ok(())
    }

    async fn bounded<T>(
        &self,
        operation: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, operation).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if e.is_timeout() => Err(StoreError::Timeout),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout),
        }
    }
}

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
