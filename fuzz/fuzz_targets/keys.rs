//! Key extraction from arbitrary header and claim bytes: every request either has a key
//! of bounded, printable form or none, and never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimit_wasm::attributes::{claim_text, combined_header, RequestAttributes};
use ratelimit_wasm::config::FilterConfig;
use ratelimit_wasm::plan::plan;
use ratelimit_wire::MAX_KEY_LEN;

struct Request {
    headers: Vec<(String, Vec<u8>)>,
    claim: Vec<u8>,
}

impl RequestAttributes for Request {
    fn header(&self, name: &str) -> Option<String> {
        combined_header(&self.headers, name)
    }
    fn source_address(&self) -> Option<String> {
        self.header("x-source")
    }
    fn jwt_claim(&self, _name: &str) -> Option<String> {
        Some(claim_text(&self.claim))
    }
}

thread_local! {
    static CONFIG: FilterConfig = FilterConfig::from_json(
            br#"{"shim_cluster": "c", "xff_num_trusted_hops": 2, "rules": [
                {"name": "k", "key": [{"header": "x-api-key"}, "client_ip", "path", "method"], "limit": 5, "period": "1m",
                 "tiers": [{"name": "t", "when": {"header": "x-tier", "prefix": "p"}, "limit": 9}]},
                {"name": "j", "key": [{"jwt_claim": "uid"}], "limit": 5, "period": "1m"}]}"#,
    )
    .unwrap();
}

fuzz_target!(|data: &[u8]| {
    // Split the input into header values at 0xff bytes.
    let names = ["x-api-key", "x-forwarded-for", "x-source", ":path", ":method", "x-tier", "x-api-key"];
    let mut parts = data.split(|&b| b == 0xff);
    let headers = names
        .iter()
        .zip(&mut parts)
        .map(|(name, value)| (name.to_string(), value.to_vec()))
        .collect();
    let claim = parts.next().unwrap_or_default().to_vec();
    let request = Request { headers, claim };
    CONFIG.with(|config| {
        for planned in plan(config, &request) {
            let key = &planned.check.key;
            assert!(key.len() <= MAX_KEY_LEN && key.bytes().all(|b| b.is_ascii_graphic()), "{key:?}");
        }
    });
});
