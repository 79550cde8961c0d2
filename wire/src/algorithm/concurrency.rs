//! The concurrency limit: at most `limit` requests in flight, each holding a slot from
//! its admission to the end of its stream; `period` is how long a slot whose release was
//! lost stays taken (the rule's `max_duration`).

use super::{Refill, Traits};

/// Largest limit of a concurrency counter, which stores one entry per request in flight.
pub const MAX_CONCURRENCY_LIMIT: u64 = 100_000;

pub(super) const TRAITS: Traits = Traits {
    name: "concurrency",
    counter_tag: "cc",
    max_limit: MAX_CONCURRENCY_LIMIT,
    refill: Refill::WhenARequestEnds,
    counts_in_flight: true,
    aligned_windows: false,
    settles: false,
    runs_locally: true,
    follows_calendar: false,
    replicates: false,
};
