//! The calls into the proxy-wasm host that a request's and the root's callbacks make
//! (the worker's are [`super::wasm_host`]'s), each returning a typed [`HostError`] or a
//! default instead of the SDK trait defaults that `unwrap()` (a panic would kill the VM
//! for every request on this worker). Nothing but these two files imports
//! `proxy_wasm::hostcalls`.

use crate::attributes::header_text;
use crate::local::{SlotError, SlotStore};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, LogLevel, MapType, Status};
use std::fmt;
use std::time::Duration;

/// A host call that failed, with the status the host returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError(pub Status);

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

pub fn log(level: LogLevel, message: &str) {
    // Logging is best effort; there is nowhere to report its own failure.
    let _ = hostcalls::log(level, &format!("ratelimit-wasm: {message}"));
}

/// The whole plugin configuration (empty when there is none).
pub fn plugin_configuration() -> Vec<u8> {
    match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
        Ok(Some(bytes)) => bytes,
        _ => Vec::new(),
    }
}

/// A header's value. Read as bytes: the SDK's `get_map_value` panics on a value that is
/// not UTF-8, which any client can send ([`header_text`] keeps such values distinct).
pub fn header(map: MapType, name: &str) -> Option<String> {
    let bytes = hostcalls::get_map_value_bytes(map, name).ok().flatten()?;
    Some(header_text(bytes))
}

/// Every header (or trailer) of `map`, as (name, value bytes) pairs.
pub fn header_map(map: MapType) -> Vec<(String, Vec<u8>)> {
    hostcalls::get_map_bytes(map).unwrap_or_default()
}

/// Sets a request header (replacing every value it had), or removes it with `None`.
pub fn set_request_header(name: &str, value: Option<&str>) -> Result<(), HostError> {
    hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value).map_err(HostError)
}

/// Every request header, as (name, value bytes) pairs, pseudo-headers included.
pub fn request_headers() -> Vec<(String, Vec<u8>)> {
    header_map(MapType::HttpRequestHeaders)
}

pub fn add_response_header(name: &str, value: &str) -> Result<(), HostError> {
    hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value).map_err(HostError)
}

/// A property as text; `None` when absent or not UTF-8.
pub fn property_text(path: Vec<&str>) -> Option<String> {
    String::from_utf8(property_bytes(path)?).ok()
}

/// A property's bytes; `None` when absent.
pub fn property_bytes(path: Vec<&str>) -> Option<Vec<u8>> {
    hostcalls::get_property(path).ok().flatten()
}

/// The body of the answer to an HTTP call, in the call's response callback.
pub fn http_call_response_body(size: usize) -> Vec<u8> {
    hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, size)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Part of the chunk of the response body passing through this callback.
pub fn response_body_part(start: usize, size: usize) -> Vec<u8> {
    hostcalls::get_buffer(BufferType::HttpResponseBody, start, size)
        .ok()
        .flatten()
        .unwrap_or_default()
}

pub fn register_shared_queue(name: &str) -> Result<u32, HostError> {
    hostcalls::register_shared_queue(name).map_err(HostError)
}

/// Empties the queue: a wake-up says "look", not what to look at.
pub fn drain_shared_queue(queue_id: u32) {
    while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue_id) {}
}

pub fn set_tick_period(period: Duration) -> Result<(), HostError> {
    hostcalls::set_tick_period(period).map_err(HostError)
}

/// The slot table in Envoy shared data, shared by every worker of this VM.
pub struct SharedData;

fn slot_key(slot: u32) -> String {
    format!("ratelimit-wasm.slot.{slot}")
}

impl SlotStore for SharedData {
    fn load(&self, slot: u32) -> Option<(Vec<u8>, u32)> {
        match hostcalls::get_shared_data(&slot_key(slot)) {
            Ok((Some(bytes), Some(cas))) => Some((bytes, cas)),
            _ => None,
        }
    }

    fn store(&self, slot: u32, bytes: &[u8], cas: Option<u32>) -> Result<bool, SlotError> {
        match hostcalls::set_shared_data(&slot_key(slot), Some(bytes), cas) {
            Ok(()) => Ok(true),
            Err(Status::CasMismatch) => Ok(false),
            Err(_) => Err(SlotError::Host),
        }
    }
}
