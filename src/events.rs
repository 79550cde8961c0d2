//! What a step of the pure layers asks the host to record: a stat to count, a line to
//! log, a lease to hold, tokens to give back with the next shim call.

use crate::local::HeldLease;
use crate::shim_call::ShimFailure;
use crate::stats::Count;
use crate::wire::TokenReturn;

/// Something the host records for a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Count(Count),
    /// The named shadow rule would have refused this request (logged).
    ShadowRefusal(String),
    /// The shim gave no usable answer (logged as a warning).
    ShimFailed(ShimFailure),
    /// The shim did not decide this rule's check: it does not know `field` (an older
    /// shim); the rule's failure mode decided. Logged once per rule and field.
    Unsupported {
        rule: String,
        field: String,
    },
    /// The shim granted this Envoy a lease: what is left of it when it expires goes back.
    LeaseGranted(HeldLease),
    /// Tokens to give back to the shim with the next call: leased tokens left unspent,
    /// or a concurrency slot its request no longer holds.
    ReturnTokens(TokenReturn),
}
