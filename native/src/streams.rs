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
    /// Its end is being handled: neither a call nor a wake-up goes through it now.
    ended: bool,
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
            ended: false,
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
    /// The stream is over (its end is being handled), though Envoy still has it.
    pub fn ended(&mut self, id: u64) {
        if let Some(entry) = self.live.get_mut(&id) {
            entry.ended = true;
        }
    }

    /// A stream that has not ended, `first` if it is one: one to wake the worker
    /// through.
    pub fn any_lasting(&self, first: Option<u64>) -> Option<u64> {
        let lasting = |id: &u64| self.live.get(id).is_some_and(|entry| !entry.ended);
        first
            .filter(lasting)
            .or_else(|| self.live.keys().copied().find(lasting))
    }

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
    /// last (it waits the longest from now on), never one that ended. `None` when no
    /// request waits: the call holds only what streams gave back or settled, and the
    /// main thread carries it (a stream merely passing by may end before its answer).
    pub fn carrier(&self) -> Option<(u64, Stream)> {
        self.live
            .iter()
            .filter(|(_, entry)| !entry.ended)
            .filter_map(|(id, entry)| Some((entry.paused_at?, *id, entry.stream)))
            .max_by_key(|(at, _, _)| *at)
            .map(|(_, id, stream)| (id, stream))
    }

    /// A token for a call, unique on this worker's host whoever carries it.
    pub fn next_token(&mut self) -> u32 {
        self.next_token = self.next_token.wrapping_add(1);
        self.next_token
    }

    /// A call started on `stream`: the worker's token for it.
    pub fn call_sent(&mut self, stream: u64, callout: u64) -> u32 {
        let token = self.next_token();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream pointer for bookkeeping only (never dereferenced here).
    fn stream(n: usize) -> Stream {
        Stream(n as *mut std::ffi::c_void)
    }

    #[test]
    fn the_stream_paused_last_carries_a_call_else_the_main_thread() {
        let mut streams = Streams::default();
        for id in 1..=3 {
            streams.register(id, stream(id as usize));
        }
        streams.enter_hook(Some(2));
        assert_eq!(
            streams.carrier().map(|(id, _)| id),
            None,
            "none paused, not even the hook's own"
        );
        streams.paused(1);
        streams.paused(3);
        assert_eq!(streams.carrier().map(|(id, _)| id), Some(3));
        streams.unpaused(3);
        assert_eq!(streams.carrier().map(|(id, _)| id), Some(1));
    }

    #[test]
    fn an_ended_stream_carries_no_call_and_no_wake_up() {
        let mut streams = Streams::default();
        streams.register(1, stream(1));
        streams.register(2, stream(2));
        streams.paused(1);
        streams.paused(2);
        streams.enter_hook(Some(2));
        streams.ended(2);
        assert_eq!(
            streams.carrier().map(|(id, _)| id),
            Some(1),
            "paused earlier, not ended"
        );
        streams.ended(1);
        assert_eq!(streams.carrier().map(|(id, _)| id), None, "the main thread's");
        assert_eq!(streams.any_lasting(Some(2)), None);
        streams.register(3, stream(3));
        assert_eq!(streams.any_lasting(Some(2)), Some(3));
        assert_eq!(
            streams.any_live(Some(2)),
            Some(2),
            "stats may still go through it"
        );
        let (a, b) = (streams.next_token(), streams.call_sent(3, 7));
        assert_ne!(a, b, "one token space whoever carries the call");
    }

    #[test]
    fn a_gone_stream_gives_up_the_calls_it_carried_and_its_wake_up() {
        let mut streams = Streams::default();
        streams.register(1, stream(1));
        streams.register(2, stream(2));
        let carried = streams.call_sent(1, 40);
        let other = streams.call_sent(2, 40);
        streams.wake_via = Some(1);
        let (entry, tokens, was_waking) = streams.unregister(1);
        assert!(entry.is_some() && was_waking);
        assert_eq!(tokens, vec![carried]);
        assert_eq!(streams.wake_via, None);
        assert_eq!(streams.call_answered(1, 40), None, "its calls are gone");
        assert_eq!(
            streams.call_answered(2, 40),
            Some(other),
            "callout ids are per stream"
        );
    }

    #[test]
    fn actions_wait_in_order_and_name_a_gone_stream_as_gone() {
        let mut streams = Streams::default();
        streams.register(1, stream(1));
        streams.register(2, stream(2));
        streams.enter_hook(Some(1));
        streams.set_current(Some(2));
        assert_eq!(streams.target(), Some(2), "the entered request");
        streams.push_action(2, Action::Resume);
        streams.set_current(None);
        assert_eq!(streams.target(), Some(1), "back to the hook's own");
        streams.push_action(1, Action::Resume);
        streams.unregister(2);
        let (first, id, _) = streams.next_action().unwrap();
        assert_eq!((first, id), (None, 2));
        let (second, id, _) = streams.next_action().unwrap();
        assert_eq!((second, id), (Some(stream(1)), 1));
        assert!(streams.next_action().is_none());
    }
}
