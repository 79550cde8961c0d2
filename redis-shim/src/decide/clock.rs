//! The shim's clock, in Unix milliseconds: what the rate-limit service's answers
//! (`duration_until_reset`) and the quota service's assignments and reports are timed by.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
