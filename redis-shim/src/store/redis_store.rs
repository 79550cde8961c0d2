//! [`RedisStore`]: the [`Store`] on a standalone Redis or a Redis Cluster, chosen by
//! configuration (the operations readiness and the admin endpoints need are in
//! `admin_ops`, the plain commands the replication between regions needs in
//! `plain_commands`).
//!
//! Standalone or cluster, the connection is multiplexed: every concurrent check shares
//! one connection (one per cluster node), its commands pipelined, and a handle is a
//! cheap clone, so no lock is held across a Redis call. Both connect lazily and
//! reconnect by themselves. Every operation is bounded by the Redis timeout, whatever
//! the client library does.

use crate::metrics::Metrics;
use crate::store::cluster_nodes::{moved_away, slot_of, NodeMap};
use crate::store::coalesce::{BatchRunner, Coalescer};
use crate::store::redis_connection::{open, Connection, RedisConfig};
use crate::store::scripts::{
    check_batch_call, check_call, check_node_call, parse_batch_reply, parse_rows, refund_call, Charge,
    FunctionCall, Library, Mode, RequestChecks, RequestRows, Row,
};
use crate::store::{group_by_slot, Answer, SharedScript, Store, StoreError};
use ratelimit_wire::Check;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, FromRedisValue, RedisError, Value};
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

mod admin_ops;
mod plain_commands;

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
    /// A cluster's masters by slot, as last read.
    nodes: Arc<NodeMap>,
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
            nodes: Arc::default(),
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

    /// Reads the cluster's map of masters in a task of its own when it is due.
    fn read_nodes_if_due(&self) {
        if !self.nodes.claim_reading() {
            return;
        }
        let nodes = self.nodes.clone();
        let (Connection::Cluster(mut cluster), Ok(runtime)) =
            (self.connection().0, tokio::runtime::Handle::try_current())
        else {
            nodes.read(Err("not a cluster connection in a runtime".into()));
            return;
        };
        let timeout = self.config.timeout;
        runtime.spawn(async move {
            let slots = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
            let reply = match tokio::time::timeout(timeout, slots.query_async::<Value>(&mut cluster)).await {
                Ok(reply) => reply.map_err(|e| e.to_string()),
                Err(_) => Err("CLUSTER SLOTS timed out".into()),
            };
            nodes.read(reply);
        });
    }

    /// One check_batch.lua call over `requests` (check_node.lua to a master).
    async fn call_check_batch(
        &self,
        script: SharedScript,
        requests: &[RequestChecks<'_>],
    ) -> Result<Vec<RequestRows>, StoreError> {
        let expected: Vec<usize> = requests.iter().map(|request| request.checks.len()).collect();
        let reply = match script {
            SharedScript::Node(master) => {
                let on = SingleNodeRoutingInfo::SpecificNode(Route::new(master, SlotAddr::Master));
                self.invoke_on(&check_node_call(&self.library, requests), Some(on))
                    .await?
            }
            _ => self.invoke(&check_batch_call(&self.library, requests)).await?,
        };
        parse_batch_reply(reply, &expected).map_err(|e| StoreError::Malformed(e.0))
    }

    /// Calls a function whose reply is `expected` rows.
    async fn run(&self, call: &FunctionCall<'_>, expected: usize) -> Result<Vec<Row>, StoreError> {
        parse_rows(self.invoke(call).await?, expected).map_err(|e| StoreError::Malformed(e.0))
    }

    /// Calls a function, once more on a connection found dropped (see below).
    async fn invoke<T: FromRedisValue + Send>(&self, call: &FunctionCall<'_>) -> Result<T, StoreError> {
        self.invoke_on(call, None).await
    }

    /// [`Self::invoke`], on a cluster sent to the node `on` when given (a call without
    /// declared keys), else where its keys lie.
    async fn invoke_on<T: FromRedisValue + Send>(
        &self,
        call: &FunctionCall<'_>,
        on: Option<SingleNodeRoutingInfo>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let mut reply = self.run_once(call, on.clone(), self.config.timeout).await;
        // A connection Redis closed while the shim was idle (a restart) shows only when
        // the next command is written to it: that command never ran, so it is sent once
        // more, on the reconnected connection, within what is left of the same timeout.
        if let Err(StoreError::Redis(error)) = &reply {
            let left = self.config.timeout.saturating_sub(started.elapsed());
            if (error.is_connection_dropped() || error.is_io_error()) && !left.is_zero() {
                reply = self.run_once(call, on, left).await;
            }
        }
        // A slot that moved: Redis answered MOVED without running anything, so the call
        // goes once more, to the node named (the cluster client, which does not retry,
        // reads the cluster's new map meanwhile).
        if let Err(StoreError::Redis(error)) = &reply {
            let left = self.config.timeout.saturating_sub(started.elapsed());
            if let (Some(to), false) = (moved_to(error), left.is_zero()) {
                reply = self.run_once(call, Some(to), left).await;
            }
        }
        self.metrics.redis_call(started.elapsed());
        reply
    }

    async fn run_once<T: FromRedisValue + Send>(
        &self,
        call: &FunctionCall<'_>,
        on: Option<SingleNodeRoutingInfo>,
        timeout: Duration,
    ) -> Result<T, StoreError> {
        let (connection, generation) = self.connection();
        let reply = match (connection, on) {
            (Connection::Standalone(manager), _) => {
                let send = |command: Cmd| {
                    let mut manager = manager.clone();
                    async move { command.query_async(&mut manager).await }
                };
                self.bounded(generation, timeout, self.call_loading(call, send))
                    .await
            }
            (Connection::Cluster(cluster), None) => {
                let send = |command: Cmd| {
                    let mut cluster = cluster.clone();
                    async move { command.query_async(&mut cluster).await }
                };
                self.bounded(generation, timeout, self.call_loading(call, send))
                    .await
            }
            (Connection::Cluster(cluster), Some(on)) => {
                let send = |command: Cmd| {
                    let (mut cluster, on) = (cluster.clone(), RoutingInfo::SingleNode(on.clone()));
                    async move { cluster.route_command(command, on).await }
                };
                self.bounded(generation, timeout, self.call_loading(call, send))
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

    /// FCALL through `send`, after loading the library if Redis does not have it (`send`
    /// takes `FUNCTION LOAD` where it takes the call: on a cluster, to every master, or
    /// to the one node a routed call goes to).
    async fn call_loading<T: FromRedisValue, Sent: Future<Output = redis::RedisResult<Value>>>(
        &self,
        call: &FunctionCall<'_>,
        mut send: impl FnMut(Cmd) -> Sent,
    ) -> redis::RedisResult<T> {
        let reply = match send(call.command()).await {
            Err(error) if error_detail_starts(&error, "Function not found") => {
                send(self.library.load_command()).await?;
                send(call.command()).await?
            }
            reply => reply?,
        };
        Ok(T::from_redis_value(reply)?)
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

impl BatchRunner<SharedScript> for RedisStore {
    async fn run_batch(&self, script: SharedScript, requests: &[RequestChecks<'_>]) -> Answer {
        self.call_check_batch(script, requests).await
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

    /// The script that can decide a request whose keys are `keys` along with other
    /// requests: on a standalone Redis, one for every request; on a cluster, one per
    /// master, for requests whose keys all lie on it, as far as the shim's map of the
    /// cluster knows ([`crate::store::cluster_nodes`]); without a map, one per slot for requests
    /// whose keys all lie in it (one client's rules keyed alike). `None` for a request
    /// whose keys span masters (or slots, without a map): it is decided slot by slot
    /// ([`crate::decide::decision::decide`]).
    fn shared_script(&self, keys: &[String]) -> Option<SharedScript> {
        if !self.is_cluster() {
            return Some(SharedScript::Standalone);
        }
        self.read_nodes_if_due();
        if let Some(master) = self.nodes.master_of(keys) {
            return Some(SharedScript::Node(master));
        }
        let slot = slot_of(keys.first()?);
        keys.iter()
            .all(|key| slot_of(key) == slot)
            .then_some(SharedScript::Slot(slot))
    }

    /// Runs check_batch.lua (check_node.lua for a master): each of `requests` charged
    /// on its own, as check.lua would charge it alone, in one call, which may carry other
    /// concurrent callers' requests on the same target ([`crate::store::coalesce`]). Every
    /// request's keys share `script` ([`Self::shared_script`]). A request that met a key
    /// no longer on the master fails with nothing written ([`moved_away`]), and the map
    /// is read again.
    async fn check_requests(&self, script: SharedScript, requests: &[RequestChecks<'_>]) -> Answer {
        let answer = self.coalescer.check_requests(self, script, requests).await;
        if let Ok(rows) = &answer {
            if rows
                .iter()
                .any(|rows| rows.as_ref().is_err_and(|e| moved_away(e)))
            {
                self.nodes.mark_stale();
            }
        }
        answer
    }
}

/// The node a MOVED answer names, a command that did not run.
fn moved_to(error: &RedisError) -> Option<SingleNodeRoutingInfo> {
    if error.code() != Some("MOVED") {
        return None;
    }
    let (host, port) = error.redirect_node()?.0.rsplit_once(':')?;
    Some(SingleNodeRoutingInfo::ByAddress {
        host: host.to_string(),
        port: port.parse().ok()?,
    })
}

/// Whether Redis answered `ERR <detail>`, the detail starting with `prefix`.
fn error_detail_starts(error: &RedisError, prefix: &str) -> bool {
    error.code() == Some("ERR") && error.detail().is_some_and(|detail| detail.starts_with(prefix))
}
