//! The rate-limit service's switches that envoyproxy/ratelimit sets in its environment,
//! here flags of the shim (`crate::cli`), each applying to every domain: `SHADOW_MODE`,
//! `QUOTA_MODE`, `RESPONSE_DYNAMIC_METADATA`, and upstream's way of counting.

/// Service-wide behaviour of `ShouldRateLimit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    /// `--rls-shadow-mode` (SHADOW_MODE): every request is answered `OK` overall, each
    /// descriptor still with its own code; what would have refused is counted and logged.
    pub shadow_mode: bool,
    /// `--rls-quota-mode` (QUOTA_MODE): every descriptor is in quota mode.
    pub quota_mode: bool,
    /// `--rls-response-metadata` (RESPONSE_DYNAMIC_METADATA): each answer carries the
    /// request and the passed limits' `metadata` as dynamic metadata.
    pub response_metadata: bool,
    /// `--rls-upstream-counting`: each descriptor is charged on its own, whatever the
    /// others answer, and one refused fills its counter, as envoyproxy/ratelimit's
    /// counters (incremented before deciding) refuse the rest of their window. Without
    /// it, a request refused charges nothing.
    pub upstream_counting: bool,
}
