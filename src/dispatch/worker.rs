//! What every request of one plugin instance on one worker shares, over its host: the
//! configuration, the stats, the dispatch state (queue, calls in flight, lease waiters,
//! adjustments) and what it has said about version skew. Here are the worker's small
//! duties (recording a step's events, queueing returns and settlements, waking the
//! host); `rounds` sends the calls and applies their answers, `steps` moves one request
//! through its decision.

use super::host::{Host, LogLevel};
use super::metrics::Metrics;
use super::paused::RequestHandle;
use super::state::DispatchState;
use crate::config::FilterConfig;
use crate::events::Event;
use crate::local::LocalLayer;
use crate::settlement::BodyBudget;
use crate::shim_call::{BatchRead, RequestAnswer, ShimFailure};
use crate::skew_log::{SkewLine, SkewLog};
use crate::stats::Count;
use crate::wire::{Settlement, TokenReturn};
use std::cell::{Cell, RefCell};

pub struct Worker<H: Host> {
    pub host: H,
    /// Tells this worker's lease acquisitions from other workers' in shared data.
    id: u64,
    pub config: FilterConfig,
    pub(super) metrics: Metrics,
    /// Borrowed only between host calls, never across one that applies an answer:
    /// applying re-enters the worker (tokens given back, a woken waiter queued).
    pub(super) state: RefCell<DispatchState<RequestHandle<H::RequestId>>>,
    /// The plugin is going away: nothing waits any more (see `fail_all`).
    closing: Cell<bool>,
    /// What this worker's readers of response bodies may hold, together.
    pub body_budget: BodyBudget,
    /// What it has said about version skew with the shims, said once.
    skew_log: RefCell<SkewLog>,
}

impl<H: Host> Worker<H> {
    /// `id`: unique within the Envoy, never 0 (which no lease acquisition holds).
    pub fn new(host: H, id: u64, config: FilterConfig) -> Worker<H> {
        let state = DispatchState::new(config.shim.calls_in_flight as usize, config.shim.timeout_ms());
        Worker {
            metrics: Metrics::define(&host, &config),
            host,
            id,
            state: RefCell::new(state),
            closing: Cell::new(false),
            body_budget: BodyBudget::new(config.cost_body_budget_bytes),
            config,
            skew_log: RefCell::new(SkewLog::default()),
        }
    }

    /// The local layer as this worker sees it; `may_await_lease`: whether a request may
    /// wait for this worker's lease acquisition.
    pub(super) fn local(&self, may_await_lease: bool) -> LocalLayer<'_, H::Slots> {
        LocalLayer {
            config: &self.config,
            store: self.host.slots(),
            worker: self.id,
            may_await_lease,
        }
    }

    pub(super) fn closing(&self) -> bool {
        self.closing.get()
    }

    pub(super) fn close(&self) {
        self.closing.set(true);
    }

    pub(super) fn count(&self, counts: Vec<Count>) {
        for count in counts {
            self.metrics.count(&self.host, count);
        }
    }

    /// Counts and logs what a step of a request's decision reported.
    pub(super) fn record(&self, events: Vec<Event>) {
        for event in events {
            match event {
                Event::Count(count) => self.metrics.count(&self.host, count),
                Event::ShadowRefusal(rule) => self.host.log(
                    LogLevel::Info,
                    &format!("shadow rule {rule} would refuse this request"),
                ),
                Event::ShimFailed(failure) => self
                    .host
                    .log(LogLevel::Warn, &format!("shim check failed: {failure}")),
                Event::Unsupported { rule, field } => {
                    let line = self.skew_log.borrow_mut().unsupported(&rule, &field);
                    self.log_skew(line);
                }
                Event::LeaseGranted(lease) => self.state.borrow_mut().hold_lease(lease),
                Event::ReturnTokens(back) => self.state.borrow_mut().give_back(back),
            }
        }
    }

    /// Queues requests' real costs to settle, sent soon (see `flush_adjustments`).
    pub(super) fn settle(&self, settlements: Vec<Settlement>) {
        let wake = self.state.borrow_mut().settle(settlements);
        if wake {
            self.wake();
        }
    }

    /// Makes the queued returns and settlements leave now rather than with the next
    /// request's call. Any callback may call this; the call itself is made on a wake-up.
    pub(super) fn flush_adjustments(&self) {
        let wake = self.state.borrow_mut().flush_adjustments();
        if wake {
            self.wake();
        }
    }

    /// Wakes the host to send what waits.
    pub(super) fn wake(&self) {
        if let Err(error) = self.host.wake() {
            // The tick sends it (or fails it past its deadline) instead.
            self.state.borrow_mut().woken();
            self.host.log(
                LogLevel::Warn,
                &format!("cannot wake the worker's dispatcher: {error}"),
            );
        }
    }

    /// Queues what expired leases left, to go back (see `on_tick`).
    pub(super) fn return_expired_leases(&self, now: u64) {
        let expired = self.state.borrow_mut().take_expired_leases(now);
        let local = self.local(false);
        for lease in &expired {
            if let Some(back) = local.take_leftover(lease, now) {
                self.give_back(back);
            }
        }
    }

    fn give_back(&self, back: TokenReturn) {
        self.state.borrow_mut().give_back(back);
    }

    /// Takes note of what a shim's answer says beyond its requests' answers (its stated
    /// version, the returns and settlements it could not apply, lost like a failed
    /// call's), and returns those.
    pub(super) fn note_shim_answer(
        &self,
        shim_version: Option<&str>,
        outcome: Result<BatchRead, ShimFailure>,
    ) -> Result<Vec<RequestAnswer>, ShimFailure> {
        let read = outcome?;
        // Only a shim's own answer says its version: Envoy's 503 or 504 says none.
        let line = self.skew_log.borrow_mut().shim_answered(shim_version);
        self.log_skew(line);
        self.metrics.adjustments_lost(&self.host, read.not_applied.len());
        for what in &read.not_applied {
            let line = self.skew_log.borrow_mut().not_applied(what);
            self.log_skew(line);
        }
        Ok(read.each)
    }

    fn log_skew(&self, line: Option<SkewLine>) {
        if let Some(line) = line {
            let level = if line.warning {
                LogLevel::Warn
            } else {
                LogLevel::Info
            };
            self.host.log(level, &line.text);
        }
    }
}
