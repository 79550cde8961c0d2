//! What the worker says about version skew with its shims (`crate::skew_log` decides
//! what, and that it is said once): a shim's stated version, and the returns and
//! settlements a shim could not apply, which are lost like a failed call's.

use super::hostcalls::log;
use super::Worker;
use crate::shim_call::{BatchRead, RequestAnswer, ShimFailure};
use crate::skew_log::SkewLine;
use proxy_wasm::types::LogLevel;

impl Worker {
    /// Takes note of what a shim's answer says beyond its requests' answers, and returns
    /// those.
    pub(super) fn note_shim_answer(
        &self,
        shim_version: Option<&str>,
        outcome: Result<BatchRead, ShimFailure>,
    ) -> Result<Vec<RequestAnswer>, ShimFailure> {
        let read = outcome?;
        // Only a shim's own answer says its version: Envoy's 503 or 504 says none.
        log_skew(self.skew_log.borrow_mut().shim_answered(shim_version));
        self.stats.adjustments_lost(read.not_applied.len());
        for what in &read.not_applied {
            log_skew(self.skew_log.borrow_mut().not_applied(what));
        }
        Ok(read.each)
    }
}

/// Logs what the worker's `SkewLog` says, when it says something.
pub(super) fn log_skew(line: Option<SkewLine>) {
    if let Some(line) = line {
        let level = if line.warning {
            LogLevel::Warn
        } else {
            LogLevel::Info
        };
        log(level, &line.text);
    }
}
