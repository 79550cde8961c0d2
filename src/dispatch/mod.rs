//! A worker's requests and its calls to the shim, over any host: the [`host::Host`]
//! trait says what a host does for the filter (proxy-wasm's is `crate::host`), and
//! everything here is written against it, so `cargo test` runs it whole with a fake.
//!
//! In order, each importing only from those below it (`tests/layers.rs` checks):
//! 1. `fake_host`: the unit tests' host (tests only);
//! 2. [`rounds`]: the calls, round by round, their answers applied in each request's
//!    context, the lease waiters run again, and the plugin's end (`fail_all`);
//! 3. [`steps`]: one request's steps (started, run again, answered, its stream's end);
//! 4. [`worker`]: what one plugin instance on one worker shares ([`worker::Worker`]);
//! 5. [`metrics`]: the stats, defined through the host;
//! 6. [`paused`]: a request while the worker holds it, and its handle;
//! 7. [`state`]: what the dispatch decides, free of the host: the queue, calls in
//!    flight and who runs again ([`state::DispatchState`]);
//! 8. [`call`]: one call's headers and body, and each request's answer from it;
//! 9. [`queued`]: a request queued for the shim, and what the end of its wait frees;
//! 10. [`leases`]: lease waiters, and the leases held until they expire;
//! 11. [`adjustments`]: tokens to give back and costs to settle, waiting for a call;
//! 12. [`host`]: the trait.

pub mod adjustments;
pub mod call;
pub mod host;
pub mod leases;
pub mod metrics;
pub mod paused;
pub mod queued;
pub mod rounds;
pub mod state;
pub mod steps;
pub mod worker;

#[cfg(test)]
pub(crate) mod fake_host;
