//! Runs ratelimit-wasm's per-request logic natively, the calls `host.rs` makes between
//! host calls, and prints nanoseconds per request for each path. Host calls (headers,
//! clock, shared data, metrics, the HTTP call) are stand-ins here: shared data is a map,
//! and the shim's answer is a fixed body. Usage: `bench-hotpath [local|global|both] [N]`.

use ratelimit_wasm::config::FilterConfig;
use ratelimit_wasm::keys::RequestAttributes;
use ratelimit_wasm::local::{self, SlotStore, StoreError};
use ratelimit_wasm::plan::plan;
use ratelimit_wasm::response::{decide, shadow_refusals, Applied};
use ratelimit_wasm::wire::{Check, CheckRequest, CheckResponse, CheckResult};
use std::cell::RefCell;
use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

struct Request;

impl RequestAttributes for Request {
    fn header(&self, name: &str) -> Option<String> {
        (name == "x-api-key").then(|| "bench-client".to_string())
    }
    fn source_address(&self) -> Option<String> {
        Some("127.0.0.1:40000".into())
    }
    fn jwt_claim(&self, _name: &str) -> Option<String> {
        None
    }
}

#[derive(Default)]
struct Store(RefCell<HashMap<u32, (Vec<u8>, u32)>>);

impl SlotStore for Store {
    fn load(&self, slot: u32) -> Option<(Vec<u8>, u32)> {
        self.0.borrow().get(&slot).cloned()
    }
    fn store(&self, slot: u32, bytes: &[u8], cas: Option<u32>) -> Result<bool, StoreError> {
        let mut map = self.0.borrow_mut();
        let version = map.get(&slot).map_or(0, |(_, v)| *v);
        if cas.is_some_and(|c| c != version) {
            return Ok(false);
        }
        map.insert(slot, (bytes.to_vec(), version + 1));
        Ok(true)
    }
}

fn config(scope: &str) -> FilterConfig {
    let rule = if scope == "local" {
        r#"{"name":"bench","key":[{"header":"x-api-key"}],"limit":1000000,"period":"1s","scope":"local"}"#
    } else {
        r#"{"name":"bench","key":[{"header":"x-api-key"}],"limit":1000000,"period":"1s"}"#
    };
    let json =
        format!(r#"{{"shim_cluster":"ratelimit_shim","timeout":"1s","local_slots":1024,"rules":[{rule}]}}"#);
    FilterConfig::from_json(json.as_bytes()).expect("bench config")
}

/// Decide from known results, as host.rs's `decide_known` does.
fn decide_known(
    config: &FilterConfig,
    planned: &[ratelimit_wasm::plan::PlannedCheck],
    results: &[Option<CheckResult>],
    now: u64,
) -> usize {
    let known: Vec<(usize, CheckResult)> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.map(|r| (i, r)))
        .collect();
    let applied: Vec<Applied<'_>> = known
        .iter()
        .map(|(i, _)| (&config.rules[planned[*i].rule_index], &planned[*i].check))
        .collect();
    let known_results: Vec<CheckResult> = known.iter().map(|(_, r)| *r).collect();
    black_box(shadow_refusals(&applied, &known_results));
    match decide(&applied, &known_results, now, &config.response).unwrap() {
        ratelimit_wasm::response::Outcome::Allow { headers } => headers.len(),
        ratelimit_wasm::response::Outcome::Reply(reply) => reply.body.len(),
    }
}

fn one_request(config: &FilterConfig, store: &Store, now: u64, global: bool, answer_body: &[u8]) -> usize {
    let planned = plan(config, &Request);
    let mut pass = local::before_shim(config, &planned, store, now);
    if !global || pass.refused.is_some() || pass.to_shim.is_empty() {
        let results = pass.results.clone();
        return decide_known(config, &planned, &results, now);
    }
    let checks: Vec<Check> = pass
        .to_shim
        .iter()
        .map(|&(index, lease)| Check {
            lease,
            ..planned[index].check.clone()
        })
        .collect();
    let body = serde_json::to_vec(&CheckRequest { checks }).unwrap();
    black_box(&body);
    // ... dispatch_http_call, the shim answers ...
    let answer: CheckResponse = serde_json::from_slice(answer_body).unwrap();
    let merged = local::after_answer(config, &planned, store, now, &mut pass, &answer).unwrap();
    let results: Vec<Option<CheckResult>> = merged.results.into_iter().map(Some).collect();
    decide_known(config, &planned, &results, now)
}

fn run(path: &str, n: u64) {
    let global = path == "global";
    let config = config(if global { "global" } else { "local" });
    let store = Store::default();
    local::create_slots(&store, config.local_slots).unwrap();
    let answer = br#"{"allowed":true,"results":[{"allowed":true,"limit":1000000,"remaining":999999,"reset_ms":1,"retry_after_ms":0,"granted":1}]}"#;
    let mut now = 1_780_000_000_000u64;
    for _ in 0..1000 {
        black_box(one_request(&config, &store, now, global, answer));
    }
    let start = Instant::now();
    for i in 0..n {
        now += i % 2; // the clock moves, as it does between requests
        black_box(one_request(&config, &store, now, global, answer));
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    let target = if cfg!(target_arch = "wasm32") {
        "wasm32"
    } else {
        "native"
    };
    println!("{path:6} path: {ns:8.0} ns per request ({target}, logic only, {n} requests)");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map_or("both", String::as_str);
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    for path in ["local", "global"] {
        if which == "both" || which == path {
            run(path, n);
        }
    }
}
