//! How the shim reaches Redis: [`RedisConfig`], and the client connection it opens
//! from it, to a standalone Redis or a Redis Cluster, always lazily (the shim starts,
//! and reports not ready, while Redis is still coming up).

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{IntoConnectionInfo, RedisError};
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
    /// Most commands awaiting an answer on one connection. Past it, commands wait (and
    /// time out) in the shim instead of piling up behind a Redis that does not answer:
    /// this is what keeps memory flat when Redis is blackholed.
    pub max_pending: usize,
}

/// One multiplexed connection: a standalone Redis, or every node of a cluster.
#[derive(Clone)]
pub enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

/// `TCP_NODELAY` on: the client's default leaves Nagle's algorithm on, which holds a
/// script written while another's reply is due until that reply comes back.
fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// A new, lazily connecting connection.
pub fn open(config: &RedisConfig) -> Result<Connection, RedisError> {
    if config.cluster {
        let client = ClusterClient::builder(config.urls.iter().map(String::as_str))
            .tcp_settings(tcp_settings())
            .connection_timeout(config.timeout)
            .response_timeout(config.timeout)
            // No retry: a charging script that ran but whose reply was lost would charge
            // twice; the filter's failure mode handles the error instead.
            .retries(0)
            .connection_concurrency_limit(config.max_pending)
            .build()?;
        let cluster_config = ClusterConfig::new()
            .set_connection_timeout(config.timeout)
            .set_response_timeout(config.timeout);
        return Ok(Connection::Cluster(
            client.get_pending_async_connection_with_config(cluster_config),
        ));
    }
    let [url] = &config.urls[..] else {
        return Err(RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a standalone Redis takes exactly one URL",
        )));
    };
    let client = redis::Client::open(
        url.as_str()
            .into_connection_info()?
            .set_tcp_settings(tcp_settings()),
    )?;
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.timeout))
        .set_response_timeout(Some(config.timeout))
        .set_number_of_retries(1)
        .set_concurrency_limit(config.max_pending);
    Ok(Connection::Standalone(ConnectionManager::new_lazy_with_config(
        client,
        manager_config,
    )?))
}
