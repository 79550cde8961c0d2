//! The current request as Envoy shows it, header map and properties, to the pure
//! planner: both the request's context and the worker's re-planning after a spill-over
//! read it here.

use super::hostcalls::{property_bytes, property_text, request_headers};
use crate::attributes::{claim_text, combined_header, RequestAttributes};
use crate::config::FilterConfig;
use crate::plan::{plan, PlannedCheck};
use std::cell::OnceCell;

/// The current request as seen through Envoy's header map and properties.
struct HostRequest<'a> {
    jwt_payload_in_metadata: &'a str,
    /// Every header, read once (one host call) on the first lookup.
    headers: OnceCell<Vec<(String, Vec<u8>)>>,
}

impl RequestAttributes for HostRequest<'_> {
    fn header(&self, name: &str) -> Option<String> {
        combined_header(self.headers.get_or_init(request_headers), name)
    }

    fn source_address(&self) -> Option<String> {
        property_text(vec!["source", "address"])
    }

    /// Only what `jwt_authn` verified and wrote to dynamic metadata; the Authorization
    /// header itself is never read.
    fn jwt_claim(&self, name: &str) -> Option<String> {
        property_bytes(vec![
            "metadata",
            "filter_metadata",
            "envoy.filters.http.jwt_authn",
            self.jwt_payload_in_metadata,
            name,
        ])
        .map(|bytes| claim_text(&bytes))
    }
}

/// The checks `config` plans for the current request, its headers read now.
pub fn plan_current(config: &FilterConfig) -> Vec<PlannedCheck> {
    let request = HostRequest {
        jwt_payload_in_metadata: &config.jwt_payload_in_metadata,
        headers: OnceCell::new(),
    };
    plan(config, &request)
}
