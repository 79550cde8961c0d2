//! One stream's request as the pure planner reads it: its headers (read once, on the
//! first lookup) and `source.address`. JWT claims are not read yet (docs/NATIVE.md): a
//! rule keyed on one sees it absent.

use crate::abi;
use crate::envoy::Stream;
use ratelimit_wasm::attributes::{combined_header, RequestAttributes};
use ratelimit_wasm::config::FilterConfig;
use ratelimit_wasm::plan::{plan, PlannedCheck};
use std::cell::OnceCell;

struct StreamRequest {
    stream: Stream,
    headers: OnceCell<Vec<(String, Vec<u8>)>>,
}

impl RequestAttributes for StreamRequest {
    fn header(&self, name: &str) -> Option<String> {
        let headers = self
            .headers
            .get_or_init(|| self.stream.headers(abi::REQUEST_HEADERS));
        combined_header(headers, name)
    }

    fn source_address(&self) -> Option<String> {
        self.stream.attribute_text(abi::ATTRIBUTE_SOURCE_ADDRESS)
    }

    fn jwt_claim(&self, _name: &str) -> Option<String> {
        None
    }
}

/// The checks `config` plans for the stream's request, read now.
pub fn plan_stream(config: &FilterConfig, stream: Stream) -> Vec<PlannedCheck> {
    let request = StreamRequest {
        stream,
        headers: OnceCell::new(),
    };
    plan(config, &request)
}
