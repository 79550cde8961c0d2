//! Where a check's counter lives when the shim serves several regions (docs/REGIONS.md):
//! the rung of the design's ladder a rule stands on.

use crate::Algorithm;
use serde::{Deserialize, Serialize};

/// A check's rung of the ladder: how its count relates across regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Regions {
    /// Each region counts on its own Redis: R regions admit up to R times the limit.
    #[default]
    Independent,
    /// The key's one home region (a stable hash over the region names) counts it:
    /// exact, and a request pays the round trip to that region.
    Home,
    /// Each region counts on its own Redis and sends its spending to the others
    /// asynchronously, spending unconfirmed only its share of what it knew remained.
    Replicated,
}

impl Regions {
    pub fn is_independent(&self) -> bool {
        *self == Regions::Independent
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Regions::Independent => "independent",
            Regions::Home => "home",
            Regions::Replicated => "replicated",
        }
    }

    /// Why a counter of `algorithm` cannot stand on this rung (with `lease` tokens asked
    /// for at once), or `None` when it can. The message goes after the field's name.
    pub fn refuses(self, algorithm: Algorithm, lease: bool) -> Option<String> {
        let name = algorithm.as_str();
        match self {
            Regions::Independent => None,
            _ if lease => Some(format!(
                "a lease is not served on a {} counter (its unspent tokens would come back to the wrong region)",
                self.as_str()
            )),
            Regions::Home if algorithm.traits().counts_in_flight => Some(format!(
                "home does not serve {name} (a slot's release would reach the wrong region)"
            )),
            Regions::Home => None,
            Regions::Replicated if algorithm.traits().replicates => None,
            Regions::Replicated => Some(format!(
                "replicated serves a count that adds across regions ({}), not {name}",
                replicated_algorithms().join(", ")
            )),
        }
    }
}

/// The algorithms whose counts a `replicated` check serves.
pub fn replicated_algorithms() -> Vec<&'static str> {
    Algorithm::ALL
        .iter()
        .filter(|algorithm| algorithm.traits().replicates)
        .map(|algorithm| algorithm.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn replicated_serves_counts_only() {
        assert_eq!(Regions::Replicated.refuses(Algorithm::FixedWindow, false), None);
        let log = Regions::Replicated
            .refuses(Algorithm::SlidingWindowLog, false)
            .unwrap();
        assert!(
            log.contains("sliding_window_log") && log.contains("fixed_window"),
            "{log}"
        );
        assert!(Regions::Home.refuses(Algorithm::Concurrency, false).is_some());
        assert!(Regions::Home
            .refuses(Algorithm::SlidingWindowLog, false)
            .is_none());
        assert!(Regions::Home.refuses(Algorithm::FixedWindow, true).is_some());
        assert_eq!(Regions::Independent.refuses(Algorithm::Concurrency, true), None);
    }

    #[test]
    fn named_in_snake_case() {
        for regions in [Regions::Independent, Regions::Home, Regions::Replicated] {
            let json = format!("\"{}\"", regions.as_str());
            assert_eq!(serde_json::from_str::<Regions>(&json).unwrap(), regions);
        }
    }
}
