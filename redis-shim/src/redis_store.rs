//! [`RedisStore`]: the [`Store`] on a standalone Redis or a Redis Cluster, chosen by
//! configuration, and the Redis operations the admin endpoints and readiness need.
//!
//! Standalone or cluster, the connection is multiplexed: every concurrent check shares
//! one connection (one per cluster node), its commands pipelined, and a handle is a
//! cheap clone, so no lock is held across a Redis call. Both connect lazily and
//! reconnect by themselves. Every operation is bounded by the Redis timeout, whatever
//! the client library does.

use crate::coalesce::{Answer, BatchRunner, Coalescer};
use crate::metrics::Metrics;
use crate::redis_connection::{open, Connection, RedisConfig};
use crate::scripts::{
    check_batch_call, check_call, parse_batch_reply, parse_rows, refund_call, Charge, FunctionCall, Library,
    Mode, RequestChecks, RequestRows, Row,
};
use crate::store::{group_by_slot, Store, StoreError};
use ratelimit_wire::Check;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{FromRedisValue, RedisError};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Requests sharing one of these can be decided in one script (see
/// [`RedisStore::shared_script`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedScript {
    /// A standalone Redis: every key in reach.
    Standalone,
    /// The keys of one cluster slot.
    Slot(Slot),
}

/// The connection in use and when it was opened.
struct Current {
    connection: Connection,
    generation: u64,
    opened: Instant,
    /// Whether the connection has answered once: only the first replacement of an
    /// outage is worth a warning.
    answered: bool,
}

/// A handle on the counters' Redis.
pub struct RedisStore {
    config: RedisConfig,
    /// Times each function call.
    metrics: Arc<Metrics>,
    library: Library,
    /// Merges concurrent batches per target.
    coalescer: Coalescer<SharedScript>,
    // Held only to clone the connection or swap it, never across a Redis call.
    current: RwLock<Current>,
}

impl RedisStore {
    /// A lazily connecting store; fails only on a configuration the client refuses (a
    /// malformed URL, say).
    pub fn connect(config: &RedisConfig, metrics: Arc<Metrics>) -> Result<RedisStore, RedisError> {
        Ok(RedisStore {
            config: config.clone(),
            metrics,
            library: Library::new(),
            coalescer: Coalescer::default(),
            current: RwLock::new(Current {
                connection: open(config)?,
                generation: 0,
                opened: Instant::now(),
                answered: false,
            }),
        })
    }

    fn connection(&self) -> (Connection, u64) {
        let current = self
            .current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        (current.connection.clone(), current.generation)
    }

    /// After a timeout, the connection it happened on is replaced by a new one (at most
    /// once per timeout period). A multiplexed connection to a Redis that stopped
    /// answering would otherwise keep every command sent to it queued, waiting for
    /// answers that never come: memory would grow with each check, and a peer that
    /// vanished would never be noticed. Calls still running on the old connection keep
    /// it until they end; then it is dropped with its queue.
    fn replace_after_timeout(&self, generation: u64) {
        let mut current = self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.generation != generation || current.opened.elapsed() < self.config.timeout {
            return;
        }
        match open(&self.config) {
            Ok(connection) => {
                let generation = current.generation + 1;
                if current.answered {
                    tracing::warn!(generation, "redis timed out: opening a new connection");
                } else {
                    tracing::debug!(generation, "redis timed out again: opening a new connection");
                }
                *current = Current {
                    connection,
                    generation,
                    opened: Instant::now(),
                    answered: false,
                };
            }
            Err(e) => tracing::error!(error = %e, "cannot open a new redis connection"),
        }
    }

    pub fn is_cluster(&self) -> bool {
        self.config.cluster
    }

    /// The script that can decide a request whose keys are `keys` along with other
    /// requests: on a standalone Redis, one for every request; on a cluster, one per slot,
    /// for requests whose keys all lie in that slot (one client's rules keyed alike).
    /// `None` for a request whose keys span slots: it is decided slot by slot
    /// ([`crate::decision::decide`]).
    pub fn shared_script(&self, keys: &[String]) -> Option<SharedScript> {
        if !self.is_cluster() {
            return Some(SharedScript::Standalone);
        }
        let slot = Slot::for_key(keys.first()?);
        keys.iter()
            .all(|key| Slot::for_key(key) == slot)
            .then_some(SharedScript::Slot(slot))
    }

    /// Runs check_batch.lua: each of `requests` charged on its own, as check.lua would
    /// charge it alone, in one call, which may carry other concurrent callers' requests
    /// on the same target ([`crate::coalesce`]). Every request's keys share `script`
    /// ([`Self::shared_script`]).
    pub async fn check_requests(&self, script: SharedScript, requests: &[RequestChecks<'_>]) -> Answer {
        self.coalescer.check_requests(self, script, requests).await
    }

    /// One check_batch.lua call over `requests`.
    async fn call_check_batch(&self, requests: &[RequestChecks<'_>]) -> Result<Vec<RequestRows>, StoreError> {
        let expected: Vec<usize> = requests.iter().map(|request| request.checks.len()).collect();
        let reply = self.invoke(&check_batch_call(&self.library, requests)).await?;
        parse_batch_reply(reply, &expected).map_err(|e| StoreError::Malformed(e.0))
    }

    /// Calls a function whose reply is `expected` rows.
    async fn run(&self, call: &FunctionCall<'_>, expected: usize) -> Result<Vec<Row>, StoreError> {
        parse_rows(self.invoke(call).await?, expected).map_err(|e| StoreError::Malformed(e.0))
    }

    /// Calls a function, once more on a connection found dropped (see below).
    async fn invoke<T: FromRedisValue + Send>(&self, call: &FunctionCall<'_>) -> Result<T, StoreError> {
        let started = Instant::now();
        let mut reply = self.run_once(call, self.config.timeout).await;
        // A connection Redis closed while the shim was idle (a restart) shows only when
        // the next command is written to it: that command never ran, so it is sent once
        // more, on the reconnected connection, within what is left of the same timeout.
        if let Err(StoreError::Redis(error)) = &reply {
            let left = self.config.timeout.saturating_sub(started.elapsed());
            if (error.is_connection_dropped() || error.is_io_error()) && !left.is_zero() {
                reply = self.run_once(call, left).await;
            }
        }
        self.metrics.redis_call(started.elapsed());
        reply
    }

    async fn run_once<T: FromRedisValue + Send>(
        &self,
        call: &FunctionCall<'_>,
        timeout: Duration,
    ) -> Result<T, StoreError> {
        let (connection, generation) = self.connection();
        let reply = match connection {
            Connection::Standalone(mut manager) => {
                self.bounded(generation, timeout, self.call_loading(call, &mut manager))
                    .await
            }
            Connection::Cluster(mut cluster) => {
                self.bounded(generation, timeout, self.call_loading(call, &mut cluster))
                    .await
            }
        };
        match reply {
            Err(StoreError::Redis(e)) if error_detail_starts(&e, "unknown command") => {
                Err(StoreError::Unsupported(format!(
                    "Redis 7.0 or later is required (the shim runs Redis functions): {e}"
                )))
            }
            reply => reply,
        }
    }

    /// FCALL, after loading the library if Redis does not have it (on a cluster,
    /// `FUNCTION LOAD` goes to every master).
    async fn call_loading<T: FromRedisValue>(
        &self,
        call: &FunctionCall<'_>,
        connection: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<T> {
        match call.command().query_async(connection).await {
            Err(error) if error_detail_starts(&error, "Function not found") => {
                self.library
                    .load_command()
                    .query_async::<redis::Value>(connection)
                    .await?;
                call.command().query_async(connection).await
            }
            reply => reply,
        }
    }

    /// PING (every master of a cluster).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let ping = redis::cmd("PING");
        let (connection, generation) = self.connection();
        match connection {
            Connection::Standalone(mut manager) => {
                self.bounded(
                    generation,
                    self.config.timeout,
                    ping.query_async::<String>(&mut manager),
                )
                .await?;
            }
            Connection::Cluster(mut cluster) => {
                self.bounded(
                    generation,
                    self.config.timeout,
                    ping.query_async::<redis::Value>(&mut cluster),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Deletes `key`; whether it was there. One key per command, so on a cluster it goes
    /// to the node holding its slot.
    pub async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let mut del = redis::cmd("DEL");
        del.arg(key);
        let (connection, generation) = self.connection();
        let deleted: i64 = match connection {
            Connection::Standalone(mut manager) => {
                self.bounded(generation, self.config.timeout, del.query_async(&mut manager))
                    .await?
            }
            Connection::Cluster(mut cluster) => {
                self.bounded(generation, self.config.timeout, del.query_async(&mut cluster))
                    .await?
            }
        };
        Ok(deleted > 0)
    }

    /// Keys matching `pattern` on the node holding `near`'s slot (every key sharing its
    /// hash tag lives there), by SCAN, at most `limit`; each SCAN call is bounded by the
    /// timeout, and Redis serves others between them.
    pub async fn scan_near(
        &self,
        near: &str,
        pattern: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let mut found = Vec::new();
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000);
            let (connection, generation) = self.connection();
            let (next, keys): (u64, Vec<String>) = match connection {
                Connection::Standalone(mut manager) => {
                    self.bounded(generation, self.config.timeout, scan.query_async(&mut manager))
                        .await?
                }
                Connection::Cluster(mut cluster) => {
                    let route = Route::with_slot(Slot::for_key(near), SlotAddr::Master);
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                    let reply = self
                        .bounded(
                            generation,
                            self.config.timeout,
                            cluster.route_command(scan, routing),
                        )
                        .await?;
                    FromRedisValue::from_redis_value(reply).map_err(|e| StoreError::Redis(e.into()))?
                }
            };
            found.extend(keys);
            cursor = next;
            if cursor == 0 || found.len() >= limit {
                found.truncate(limit);
                return Ok(found);
            }
        }
    }

    fn mark_answered(&self, generation: u64) {
        let answered = {
            let current = self
                .current
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            current.answered || current.generation != generation
        };
        if !answered {
            let mut current = self
                .current
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if current.generation == generation {
                current.answered = true;
            }
        }
    }

    async fn bounded<T>(
        &self,
        generation: u64,
        timeout: Duration,
        operation: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let error = match tokio::time::timeout(timeout, operation).await {
            Ok(Ok(value)) => {
                self.mark_answered(generation);
                return Ok(value);
            }
            Ok(Err(e)) if !e.is_timeout() => return Err(StoreError::Redis(e)),
            Ok(Err(_)) | Err(_) => StoreError::Timeout,
        };
        self.replace_after_timeout(generation);
        Err(error)
    }
}

impl BatchRunner for RedisStore {
    async fn run_batch(&self, requests: &[RequestChecks<'_>]) -> Answer {
        self.call_check_batch(requests).await
    }
}

impl Store for RedisStore {
    /// A standalone Redis is one group.
    fn group_by_slot(&self, keys: &[String]) -> Vec<Vec<usize>> {
        if self.is_cluster() {
            group_by_slot(keys)
        } else {
            vec![(0..keys.len()).collect()]
        }
    }

    async fn check(&self, mode: Mode, keys: &[&str], checks: &[&Check]) -> Result<Vec<Row>, StoreError> {
        self.run(&check_call(&self.library, mode, keys, checks), keys.len())
            .await
    }

    async fn refund(&self, charges: &[Charge<'_>]) -> Result<Vec<Row>, StoreError> {
        self.run(&refund_call(&self.library, charges), charges.len())
            .await
    }
}

/// Whether Redis answered `ERR <detail>`, the detail starting with `prefix`.
fn error_detail_starts(error: &RedisError, prefix: &str) -> bool {
    error.code() == Some("ERR") && error.detail().is_some_and(|detail| detail.starts_with(prefix))
}
