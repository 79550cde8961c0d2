//! The sliding window counter: the previous window weighted by its overlap with the
//! trailing period, plus the current one. Close to the sliding limit with two counters
//! per key, its windows aligned to the period.

use super::{Refill, Traits};
use crate::rate::MAX_LIMIT;

pub(super) const TRAITS: Traits = Traits {
    name: "sliding_window_counter",
    counter_tag: "swc",
    max_limit: MAX_LIMIT,
    refill: Refill::AsEntriesAge,
    counts_in_flight: false,
    aligned_windows: true,
    settles: true,
    runs_locally: false,
    follows_calendar: false,
    replicates: true,
};
