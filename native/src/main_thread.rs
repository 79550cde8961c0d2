//! Shim calls carried by Envoy's main thread, for a worker with no stream to carry them:
//! what a stream gives back or settles when it ends, on a worker where no other request
//! waits. A per-stream callout ends with its stream, so such a call would be lost with
//! the stream that ended (or wait for the next request); a configuration's callout
//! lives on the main thread instead. A worker queues the call here and schedules the
//! main thread, which sends it ([`MainThreadCalls::send_queued`]); its answer waits here
//! for the worker's next hook ([`MainThreadCalls::take_answers`]), on the worker's own
//! thread: nothing waits for it meanwhile but the worker's bookkeeping.

use crate::envoy::{ConfigScheduler, EnvoyConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A call a worker asked for, until the main thread sends it.
struct Queued {
    worker: u64,
    token: u32,
    cluster: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    timeout_ms: u64,
}

/// A call's answer, for its worker: `status` is `None` if the call failed.
pub struct Answer {
    pub token: u32,
    pub status: Option<String>,
    pub shim_version: Option<String>,
    pub body: Vec<u8>,
}

#[derive(Default)]
struct State {
    /// `None` once Envoy dropped the configuration: nothing more is scheduled.
    scheduler: Option<ConfigScheduler>,
    queued: Vec<Queued>,
    /// Envoy's callout id to the worker and its token.
    in_flight: HashMap<u64, (u64, u32)>,
    answers: HashMap<u64, Vec<Answer>>,
}

/// One configuration's main-thread calls, shared by its workers.
pub struct MainThreadCalls {
    state: Mutex<State>,
    /// Whether any answer waits: each hook looks, most without taking the lock.
    answers_wait: AtomicBool,
}

/// What a queued call needs, as the worker's host has it.
pub struct Call<'a> {
    pub cluster: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
    pub timeout_ms: u64,
}

impl MainThreadCalls {
    /// With the configuration's scheduler (`None`: no call can be carried).
    pub fn new(scheduler: Option<ConfigScheduler>) -> MainThreadCalls {
        MainThreadCalls {
            state: Mutex::new(State {
                scheduler,
                ..State::default()
            }),
            answers_wait: AtomicBool::new(false),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock (caught at the hook) leaves plain data.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `worker`'s call `token` for the main thread; false if the configuration
    /// is gone.
    pub fn queue(&self, worker: u64, token: u32, call: Call<'_>) -> bool {
        let mut state = self.state();
        let Some(scheduler) = state.scheduler else {
            return false;
        };
        state.queued.push(Queued {
            worker,
            token,
            cluster: call.cluster.to_string(),
            headers: call
                .headers
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            body: call.body.to_vec(),
            timeout_ms: call.timeout_ms,
        });
        // Under the lock, so that `close` cannot delete the scheduler meanwhile; one
        // event serves every call queued before it runs.
        if state.queued.len() == 1 {
            scheduler.schedule();
        }
        true
    }

    /// On the main thread: sends every queued call through `config`; one Envoy refuses
    /// is answered as failed at once.
    pub fn send_queued(&self, config: EnvoyConfig) {
        let queued = std::mem::take(&mut self.state().queued);
        for call in queued {
            let headers: Vec<(&str, &str)> = call
                .headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect();
            let sent = config.callout(&call.cluster, &headers, &call.body, call.timeout_ms);
            let mut state = self.state();
            match sent {
                Ok(callout) => {
                    state.in_flight.insert(callout, (call.worker, call.token));
                }
                Err(_) => {
                    state.answers.entry(call.worker).or_default().push(Answer {
                        token: call.token,
                        status: None,
                        shim_version: None,
                        body: Vec::new(),
                    });
                    self.answers_wait.store(true, Ordering::Release);
                }
            }
        }
    }

    /// On the main thread: the answer to `callout`, kept for its worker.
    pub fn answered(&self, callout: u64, answer: impl FnOnce(u32) -> Answer) {
        let mut state = self.state();
        if let Some((worker, token)) = state.in_flight.remove(&callout) {
            state.answers.entry(worker).or_default().push(answer(token));
            self.answers_wait.store(true, Ordering::Release);
        }
    }

    /// `worker`'s answers arrived since it last looked.
    pub fn take_answers(&self, worker: u64) -> Vec<Answer> {
        if !self.answers_wait.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut state = self.state();
        let answers = state.answers.remove(&worker).unwrap_or_default();
        self.answers_wait
            .store(!state.answers.is_empty(), Ordering::Release);
        answers
    }

    /// Envoy dropped the configuration: its scheduler goes, and no call is queued again.
    pub fn close(&self) {
        if let Some(scheduler) = self.state().scheduler.take() {
            scheduler.delete();
        }
    }
}
