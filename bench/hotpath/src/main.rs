//! Runs ratelimit-wasm's per-request logic natively, what the host layer runs between
//! host calls (the plan, the real `RequestDecision` pipeline over the local layer, the
//! JSON to and from the shim), and prints nanoseconds per request for each path. Host
//! calls (headers, clock, shared data, metrics, the HTTP call) are stand-ins here: shared
//! data is a map, and the shim's answer is a fixed body.
//! Usage: `bench-hotpath [local|global|both] [N]`.

use ratelimit_wasm::attributes::RequestAttributes;
use ratelimit_wasm::config::FilterConfig;
use ratelimit_wasm::local::{create_slots, LocalLayer, SlotError, SlotStore};
use ratelimit_wasm::plan::plan;
use ratelimit_wasm::request::{RequestDecision, Start, Transition};
use ratelimit_wasm::response::Outcome;
use ratelimit_wasm::shim_call::{batch_body, read_batch_answer};
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
    fn store(&self, slot: u32, bytes: &[u8], cas: Option<u32>) -> Result<bool, SlotError> {
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

fn outcome_size(transition: Transition<Outcome>) -> usize {
    black_box(&transition.events);
    match transition.next {
        Outcome::Allow { headers } => headers.len(),
        Outcome::Reply(reply) => reply.body.len(),
    }
}

fn one_request(local: &LocalLayer<'_, Store>, now: u64, answer_body: &[u8]) -> usize {
    let planned = plan(local.config, &Request);
    let (mut request, started) = RequestDecision::start(local, planned, now);
    let checks = match started.next {
        Start::Decided(outcome) => {
            return outcome_size(Transition {
                next: outcome,
                events: started.events,
            })
        }
        Start::AskShim { checks, .. } => checks,
        Start::AwaitLease(_) => unreachable!("one request at a time never waits for a lease"),
    };
    black_box(&started.events);
    let body = batch_body(vec![checks], Vec::new(), Vec::new()).unwrap();
    black_box(&body);
    // ... dispatch_http_call, the shim answers ...
    let mut answers = read_batch_answer(Some("200"), answer_body, 1).unwrap();
    let results = answers.pop().unwrap().unwrap();
    outcome_size(request.on_answer(local, &results, now))
}

fn run(path: &str, n: u64) {
    let global = path == "global";
    let config = config(if global { "global" } else { "local" });
    let store = Store::default();
    create_slots(&store, config.local_slots).unwrap();
    let local = LocalLayer {
        config: &config,
        store: &store,
        worker: 1,
        may_await_lease: true,
    };
    let answer = br#"{"responses":[{"decided":{"allowed":true,"results":[{"allowed":true,"limit":1000000,"remaining":999999,"reset_ms":1,"retry_after_ms":0,"granted":1}]}}]}"#;
    let mut now = 1_780_000_000_000u64;
    for _ in 0..1000 {
        black_box(one_request(&local, now, answer));
    }
    let start = Instant::now();
    for i in 0..n {
        now += i % 2; // the clock moves, as it does between requests
        black_box(one_request(&local, now, answer));
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
