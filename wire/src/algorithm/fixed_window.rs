//! The fixed window: at most `limit` per window of `period` aligned to its multiples (or
//! to the calendar: a day, week or month at a UTC offset). A burst of twice the limit
//! passes across a boundary.

use super::{Refill, Traits};
use crate::rate::MAX_LIMIT;

pub(super) const TRAITS: Traits = Traits {
    name: "fixed_window",
    counter_tag: "fw",
    max_limit: MAX_LIMIT,
    refill: Refill::AtWindowEnd,
    counts_in_flight: false,
    aligned_windows: true,
    settles: true,
    runs_locally: false,
    follows_calendar: true,
    replicates: true,
};
