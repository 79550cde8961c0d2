//! The sliding window log: at most `limit` in any trailing `period`, exactly, at the cost
//! of one stored entry per admitted token (hence its smaller largest limit; and no
//! settlement, which would have to invent entries).

use super::{Refill, Traits};

/// Largest limit of a sliding window log, which stores one entry per admitted token.
pub const MAX_LOG_LIMIT: u64 = 10_000;

pub(super) const TRAITS: Traits = Traits {
    name: "sliding_window_log",
    counter_tag: "swl",
    max_limit: MAX_LOG_LIMIT,
    refill: Refill::AsEntriesAge,
    counts_in_flight: false,
    aligned_windows: false,
    settles: false,
    runs_locally: false,
    follows_calendar: false,
    replicates: false,
};
