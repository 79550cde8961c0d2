//! The connection cap: at most `max_connections` connections open at once, so that a
//! flood of connections that never send a request cannot take the file descriptors (and
//! the memory) that legitimate callers need.
//!
//! Refusing every new connection past the cap would let such a flood lock callers out
//! for as long as it lasts, so at the cap a new connection instead closes the open one
//! that has waited longest without a request in progress, preferring one that never
//! sent a request at all (what a flood looks like; a caller's first request follows its
//! connection at once). Only when every open connection is busy with a request is the
//! new one closed at once. Each closing is counted in the metrics and logged, at most
//! once a second.

use crate::metrics::{ConnectionClose, Metrics};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Notify;

/// The open connections, in the order they were accepted.
pub struct ConnectionCap {
    max: usize,
    /// Counts the closings, and the open connections (exactly those in `open`).
    metrics: Arc<Metrics>,
    open: Mutex<BTreeMap<u64, Arc<ConnectionState>>>,
    next_id: AtomicU64,
    started: Instant,
    /// When a closing was last logged, in seconds since `started` (plus one: 0 is never).
    last_logged: AtomicU64,
}

/// What the cap knows of one connection.
pub struct ConnectionState {
    /// Requests being answered on it now (several at once over HTTP/2).
    requests: AtomicUsize,
    /// Whether a request ever started on it.
    served: AtomicBool,
    /// When a request last started or ended, in milliseconds since the table's start.
    last_active_ms: AtomicU64,
    /// Notified when a newer connection takes its place.
    evicted: Notify,
}

impl ConnectionState {
    /// Whether a request has started on this connection.
    pub fn served(&self) -> bool {
        self.served.load(Ordering::SeqCst)
    }

    /// Completes when the cap closes this connection for a newer one.
    pub async fn evicted(&self) {
        self.evicted.notified().await
    }
}

/// Held by a connection's task for as long as it is open.
pub struct ConnectionGuard {
    id: u64,
    pub state: Arc<ConnectionState>,
    table: Arc<ConnectionCap>,
}

/// Held while a request is being answered on a connection.
pub struct RequestGuard {
    state: Arc<ConnectionState>,
    table: Arc<ConnectionCap>,
}

impl ConnectionCap {
    pub fn new(max: usize, metrics: Arc<Metrics>) -> Arc<ConnectionCap> {
        Arc::new(ConnectionCap {
            max,
            metrics,
            open: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            started: Instant::now(),
            last_logged: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Makes room for a new connection (closing an idle one if the cap is reached) and
    /// registers it; `None` when every open connection is busy and the new one must be
    /// closed.
    pub fn admit(self: &Arc<Self>) -> Option<ConnectionGuard> {
        let metrics = &self.metrics;
        // A poisoned lock only means a thread panicked while holding it; the map is
        // still consistent (every change is one insert or remove).
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= self.max {
            let idle = |state: &ConnectionState| state.requests.load(Ordering::SeqCst) == 0;
            let never_served = open
                .iter()
                .find(|(_, state)| !state.served() && idle(state))
                .map(|(id, _)| *id);
            let victim = never_served.or_else(|| {
                open.iter()
                    .filter(|(_, state)| idle(state))
                    .min_by_key(|(_, state)| state.last_active_ms.load(Ordering::SeqCst))
                    .map(|(id, _)| *id)
            });
            match victim.and_then(|id| open.remove(&id)) {
                Some(evicted) => {
                    metrics.connection_ended();
                    // notify_one keeps the wakeup if the task is not waiting yet.
                    evicted.evicted.notify_one();
                    metrics.connection_closed(ConnectionClose::Evicted);
                    self.log_closing("connection cap reached: closed the longest idle connection");
                }
                None => {
                    metrics.connection_closed(ConnectionClose::Refused);
                    self.log_closing("connection cap reached and every connection busy: refused a new one");
                    return None;
                }
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let state = Arc::new(ConnectionState {
            requests: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            last_active_ms: AtomicU64::new(self.now_ms()),
            evicted: Notify::new(),
        });
        open.insert(id, state.clone());
        metrics.connection_opened();
        Some(ConnectionGuard {
            id,
            state,
            table: self.clone(),
        })
    }

    /// Logs a closing by the cap, at most once a second: a flood must not flood the logs.
    fn log_closing(&self, message: &'static str) {
        let now = self.started.elapsed().as_secs() + 1;
        let last = self.last_logged.load(Ordering::SeqCst);
        if now > last
            && self
                .last_logged
                .compare_exchange(last, now, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            tracing::warn!(
                max_connections = self.max,
                "{message} (rlshim_connections_closed_total counts them)"
            );
        }
    }

    /// Open connections now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl ConnectionGuard {
    /// Marks a request in progress on this connection until the guard is dropped.
    pub fn request(&self) -> RequestGuard {
        self.state.requests.fetch_add(1, Ordering::SeqCst);
        self.state.served.store(true, Ordering::SeqCst);
        self.state
            .last_active_ms
            .store(self.table.now_ms(), Ordering::SeqCst);
        RequestGuard {
            state: self.state.clone(),
            table: self.table.clone(),
        }
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|e| e.into_inner());
        // Gone already if it was evicted (and counted as closed then).
        if open.remove(&self.id).is_some() {
            self.table.metrics.connection_ended();
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.state
            .last_active_ms
            .store(self.table.now_ms(), Ordering::SeqCst);
        self.state.requests.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_closes_idle_connections_first_and_refuses_when_all_are_busy() {
        let metrics = Arc::new(Metrics::default());
        let table = ConnectionCap::new(2, metrics.clone());
        let served = table.admit().unwrap();
        let _request = served.request();
        let idle = table.admit().unwrap();
        // The idle one goes, not the older one with a request in progress.
        let newest = table.admit().unwrap();
        assert_eq!(table.len(), 2);
        assert!(futures_util::FutureExt::now_or_never(idle.state.evicted()).is_some());
        let _busy = newest.request();
        assert!(table.admit().is_none(), "every connection is busy");
        let text = metrics.render();
        assert!(
            text.contains("rlshim_connections_closed_total{reason=\"evicted\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("rlshim_connections_closed_total{reason=\"refused\"} 1"),
            "{text}"
        );
        assert!(metrics.render().contains("rlshim_connections_open 2\n"));
        drop(idle);
        assert_eq!(
            table.len(),
            2,
            "an evicted connection's guard removes nothing else"
        );
        assert!(metrics.render().contains("rlshim_connections_open 2\n"));
        drop(newest);
        assert!(metrics.render().contains("rlshim_connections_open 1\n"));
    }
}
