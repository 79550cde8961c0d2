//! The plugin configuration parser on arbitrary bytes: it refuses or compiles, never
//! panics, and what compiles is within its bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_wasm::config::FilterConfig;

fuzz_target!(|data: &[u8]| {
    if let Ok(config) = FilterConfig::from_json(data) {
        assert!(!config.rules.is_empty());
        for rule in &config.rules {
            assert!(rule.cost >= 1 && rule.cost <= rule.rate.limit());
        }
    }
});
