//! Saying something once per key: the first time a key comes, and never again for the
//! life of the process. The keys kept are bounded, since they can come from callers.

use std::collections::HashSet;
use std::sync::Mutex;

/// The keys already said, at most `max` of them (past that, nothing more is said).
pub struct OncePerKey {
    said: Mutex<Option<HashSet<String>>>,
    max: usize,
}

impl OncePerKey {
    pub const fn new(max: usize) -> OncePerKey {
        OncePerKey {
            said: Mutex::new(None),
            max,
        }
    }

    /// Whether `key` comes for the first time (and there is room to remember it).
    pub fn first(&self, key: &str) -> bool {
        let mut said = self.said.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let said = said.get_or_insert_with(HashSet::new);
        said.len() < self.max && said.insert(key.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_once_and_no_more_keys_than_the_bound() {
        let once = OncePerKey::new(2);
        assert!(once.first("a") && !once.first("a"));
        assert!(once.first("b"));
        assert!(!once.first("c"), "past the bound");
    }
}
