//! What one worker thread's host knows of its streams, free of Envoy: which are live
//! (and their Envoy pointers), whose hook is running (`own`) and which request the
//! worker entered (`current`), which are paused, which stream carries each shim call,
//! whether a wake-up is on its way, and the resumes and replies waiting to be carried
//! out once the worker is done (`crate::native_host` runs them outside any borrow, so
//! that Envoy may call back into the module while it carries one out).

use crate::envoy::{Scheduler, Stream};
use ratelimit_wasm::response::LocalReply;
use std::collections::{HashMap, VecDeque};

/// What the worker asked for a request, carried out after it returns.
pub enum Action {
    Resume,
    Reply(LocalReply),
}

pub struct StreamEntry {
    pub stream: Stream,
    /// Created the first time this stream wakes the worker.
    pub scheduler: Option<Scheduler>,
    /// When it paused (a sequence number), while it waits.
    paused_at: Option<u64>,
}

#[derive(Default)]
pub struct Streams {
    live: HashMap<u64, StreamEntry>,
    /// The stream whose hook is running.
    own: Option<u64>,
    /// The request the worker entered, if any (else `own`).
    current: Option<u64>,
    actions: VecDeque<(u64, Action)>,
    /// Call token to (carrying stream, Envoy's callout id).
    calls: HashMap<u32, (u64, u64)>,
    next_token: u32,
    pauses: u64,
    /// The stream whose scheduler will run the next wake-up.
    pub wake_via: Option<u64>,
    /// A wake-up the worker counts on had no stream to go through: the next stream
    /// delivers it.
    pub wake_owed: bool,
}

impl Streams {
    pub fn register(&mut self, id: u64, stream: Stream) {
        let entry = StreamEntry {
            stream,
            scheduler: None,
            paused_at: None,
        };
        self.live.insert(id, entry);
    }

    /// The stream is gone: its entry, the tokens of the calls it carried, and whether
    /// it was to deliver the next wake-up.
    pub fn unregister(&mut self, id: u64) -> (Option<StreamEntry>, Vec<u32>, bool) {
        let entry = self.live.remove(&id);
        let carried: Vec<u32> = self
            .calls
            .iter()
            .filter(|(_, (stream, _))| *stream == id)
            .map(|(token, _)| *token)
            .collect();
        for token in &carried {
            self.calls.remove(token);
        }
        let was_waking = self.wake_via == Some(id);
        if was_waking {
            self.wake_via = None;
        }
        (entry, carried, was_waking)
    }

    pub fn is_live(&self, id: u64) -> bool {
        self.live.contains_key(&id)
    }

    pub fn stream(&self, id: u64) -> Option<Stream> {
        self.live.get(&id).map(|entry| entry.stream)
    }

    pub fn entry_mut(&mut self, id: u64) -> Option<&mut StreamEntry> {
        self.live.get_mut(&id)
    }

    /// Any live stream, preferring `first`.
    pub fn any_live(&self, first: Option<u64>) -> Option<u64> {
        first
            .filter(|id| self.is_live(*id))
            .or_else(|| self.live.keys().next().copied())
    }

    /// Enters `id`'s hook; returns who ran before (hooks nest when Envoy calls back).
    pub fn enter_hook(&mut self, id: Option<u64>) -> (Option<u64>, Option<u64>) {
        let before = (self.own, self.current);
        self.own = id;
        self.current = None;
        before
    }

    pub fn leave_hook(&mut self, before: (Option<u64>, Option<u64>)) {
        (self.own, self.current) = before;
    }

    pub fn own(&self) -> Option<u64> {
        self.own
    }

    pub fn set_current(&mut self, id: Option<u64>) {
        self.current = id;
    }

    /// The request the worker acts on now: the entered one, else the hook's own.
    pub fn target(&self) -> Option<u64> {
        self.current.or(self.own)
    }

    pub fn paused(&mut self, id: u64) {
        self.pauses += 1;
        let at = self.pauses;
        if let Some(entry) = self.live.get_mut(&id) {
            entry.paused_at = Some(at);
        }
    }

    pub fn is_paused(&self, id: u64) -> bool {
        self.live.get(&id).is_some_and(|entry| entry.paused_at.is_some())
    }

    pub fn unpaused(&mut self, id: u64) {
        if let Some(entry) = self.live.get_mut(&id) {
            entry.paused_at = None;
        }
    }

    /// The stream to carry a call: a callout ends with its stream, so the one paused
    /// last (it waits the longest from now on), else the hook's own.
    pub fn carrier(&self) -> Option<(u64, Stream)> {
        let paused = self
            .live
            .iter()
            .filter_map(|(id, entry)| Some((entry.paused_at?, *id, entry.stream)))
            .max_by_key(|(at, _, _)| *at)
            .map(|(_, id, stream)| (id, stream));
        paused.or_else(|| {
            let own = self.own?;
            Some((own, self.stream(own)?))
        })
    }

    /// A call started on `stream`: the worker's token for it.
    pub fn call_sent(&mut self, stream: u64, callout: u64) -> u32 {
        self.next_token = self.next_token.wrapping_add(1);
        let token = self.next_token;
        self.calls.insert(token, (stream, callout));
        token
    }

    /// The token of the call `stream` carried as `callout`, now answered.
    pub fn call_answered(&mut self, stream: u64, callout: u64) -> Option<u32> {
        let token = self
            .calls
            .iter()
            .find(|(_, carried)| **carried == (stream, callout))
            .map(|(token, _)| *token)?;
        self.calls.remove(&token);
        Some(token)
    }

    pub fn push_action(&mut self, id: u64, action: Action) {
        self.actions.push_back((id, action));
    }

    /// The next action, with its stream if that is still live.
    pub fn next_action(&mut self) -> Option<(Option<Stream>, u64, Action)> {
        let (id, action) = self.actions.pop_front()?;
        Some((self.stream(id), id, action))
    }
}
