//! The counting algorithms, each in one module saying what it is: its names, the largest
//! limit it holds, how it refills, and what the filter may do with it (settle a cost from
//! the response, run in Envoy alone, follow the calendar). Everything that differs
//! between algorithms outside their Lua scripts asks [`Algorithm::traits`]: a new
//! algorithm is a module here and a script in `redis-shim/scripts/` (named in the shim's
//! `scripts.rs`, whose tests fail until it is), each with its tests.

mod concurrency;
mod fixed_window;
mod sliding_window_counter;
mod sliding_window_log;
mod token_bucket;

pub use concurrency::MAX_CONCURRENCY_LIMIT;
pub use sliding_window_log::MAX_LOG_LIMIT;

use serde::{Deserialize, Serialize};

/// The counting algorithm a check runs in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Capacity `limit`, refilled continuously at `limit / period`.
    #[default]
    TokenBucket,
    /// At most `limit` per aligned window of `period`; a boundary burst of 2x passes.
    FixedWindow,
    /// At most `limit` in any trailing `period`, exactly; one entry per token.
    SlidingWindowLog,
    /// The previous window weighted by its overlap plus the current one: close to the
    /// sliding limit with two counters.
    SlidingWindowCounter,
    /// At most `limit` requests in flight; `period` is how long a slot whose release was
    /// lost stays taken.
    Concurrency,
}

/// When a counter that admitted gives its next unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refill {
    /// Evenly, one unit every `period / limit`.
    Continuously,
    /// All at once, when its aligned window ends.
    AtWindowEnd,
    /// As earlier admissions age out of the trailing period: when, the answer does not
    /// tell.
    AsEntriesAge,
    /// When a request in flight ends, whenever that is.
    WhenARequestEnds,
}

/// What an algorithm is, for every part that treats algorithms differently.
#[derive(Debug)]
pub struct Traits {
    /// Its name on the wire and in configurations.
    pub name: &'static str,
    /// Its tag in counter names (`per-user/tb60000`).
    pub counter_tag: &'static str,
    /// The largest limit its counter holds.
    pub max_limit: u64,
    pub refill: Refill,
    /// It counts requests in flight, not a rate: an admitted request holds a slot until
    /// its stream ends, a refusal lifts whenever one ends, there is no window, and the
    /// rule's `max_duration` (how long a lost slot stays taken) stands for its period.
    pub counts_in_flight: bool,
    /// Its windows are aligned to multiples of the period, so a tier must keep the
    /// rule's period (another would read the client's counter as another window).
    pub aligned_windows: bool,
    /// Its counter can be charged again once the response reports the real cost.
    pub settles: bool,
    /// A rule of it may run in each Envoy alone (`scope: local`).
    pub runs_locally: bool,
    /// Its windows can follow the calendar (a day, a week, a month at a UTC offset).
    pub follows_calendar: bool,
    /// Its count adds across regions, so a `replicated` check may run it (each region's
    /// spending is a component of the count).
    pub replicates: bool,
}

impl Algorithm {
    pub const ALL: [Algorithm; 5] = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::Concurrency,
    ];

    pub fn traits(self) -> &'static Traits {
        match self {
            Algorithm::TokenBucket => &token_bucket::TRAITS,
            Algorithm::FixedWindow => &fixed_window::TRAITS,
            Algorithm::SlidingWindowLog => &sliding_window_log::TRAITS,
            Algorithm::SlidingWindowCounter => &sliding_window_counter::TRAITS,
            Algorithm::Concurrency => &concurrency::TRAITS,
        }
    }

    pub fn as_str(self) -> &'static str {
        self.traits().name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn each_algorithm_is_named_on_the_wire_as_its_traits_say() {
        let mut tags = Vec::new();
        for algorithm in Algorithm::ALL {
            let traits = algorithm.traits();
            let json = format!("\"{}\"", traits.name);
            assert_eq!(serde_json::from_str::<Algorithm>(&json).unwrap(), algorithm);
            assert!(
                !tags.contains(&traits.counter_tag),
                "{} shares its tag",
                traits.name
            );
            tags.push(traits.counter_tag);
        }
    }
}
