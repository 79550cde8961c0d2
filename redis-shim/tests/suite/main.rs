//! The shim's behaviour, one suite over every backend: each test runs on a standalone
//! Redis, on a three-master Redis Cluster and on the store in memory, as
//! `<module>::standalone::<test>`, `<module>::cluster::<test>` and
//! `<module>::memory::<test>` (Limitador's test-with-every-storage layout). One Redis and
//! one Cluster serve every test of this binary, each test's shim writing under a key
//! prefix of its own. `drift` runs one sequence on all three and compares every answer,
//! so the store in memory cannot drift from the Lua that Redis runs.
//!
//! What only Redis can show (the function library reloaded, expiries, ACLs, the scripts
//! a batch costs) is in `tests/redis.rs` and `tests/cluster.rs`; the HTTP service and the
//! process in `tests/hostile.rs` and `tests/ops.rs`.

#[path = "../support/mod.rs"]
mod support;

/// `#[test]`s running each named `fn(Backend)` of the module on every backend.
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod standalone {
            $(#[test]
            fn $name() {
                super::$name($crate::support::Backend::Standalone)
            })*
        }
        mod cluster {
            $(#[test]
            fn $name() {
                super::$name($crate::support::Backend::Cluster)
            })*
        }
        mod memory {
            $(#[test]
            fn $name() {
                super::$name($crate::support::Backend::Memory)
            })*
        }
    };
}

mod algorithms;
mod batch;
mod boundary;
mod calendar;
mod drift;
mod slots;
