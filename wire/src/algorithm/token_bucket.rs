//! The token bucket: capacity `limit`, refilled continuously at `limit / period`. The
//! default: smooth, bursts up to the limit, exact with one number per key.

use super::{Refill, Traits};
use crate::rate::MAX_LIMIT;

pub(super) const TRAITS: Traits = Traits {
    name: "token_bucket",
    counter_tag: "tb",
    max_limit: MAX_LIMIT,
    refill: Refill::Continuously,
    counts_in_flight: false,
    aligned_windows: false,
    settles: true,
    runs_locally: true,
    follows_calendar: false,
    replicates: false,
};
