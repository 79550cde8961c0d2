//! Safe wrappers over the ABI's callbacks, for one stream's filter ([`Stream`]) and for
//! the log. Every `unsafe` call into Envoy is here; each copies what Envoy lends before
//! the hook returns (Envoy's buffers are valid only until then).

use crate::abi::{
    self, ConfigSchedulerPtr, EnvoyBuffer, EnvoyHeader, FilterConfigEnvoyPtr, FilterEnvoyPtr, ModuleBuffer,
    ModuleHeader, SchedulerPtr,
};
use std::ffi::c_void;
use std::ptr;

/// Logs under Envoy's `dynamic_modules` component; best effort.
pub fn log(level: u32, message: &str) {
    let line = format!("ratelimit-native: {message}");
    // SAFETY: the buffer points to `line`, alive for the call.
    unsafe { abi::envoy_dynamic_module_callback_log(level, ModuleBuffer::of(line.as_bytes())) }
}

/// Envoy's side of a plugin configuration, valid in its `config_new` hook.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct EnvoyConfig(pub FilterConfigEnvoyPtr);

/// Envoy's side of one stream's filter, valid until that filter's destroy hook.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Stream(pub FilterEnvoyPtr);

impl Stream {
    /// Every header (or trailer) of the map, as (name, value bytes) pairs.
    pub fn headers(self, header_type: u32) -> Vec<(String, Vec<u8>)> {
        // SAFETY: `self.0` is a live filter (see the type); the array has the size Envoy
        // reported, and the buffers it fills are copied before returning.
        unsafe {
            let size = abi::envoy_dynamic_module_callback_http_get_headers_size(self.0, header_type);
            if size == 0 {
                return Vec::new();
            }
            let empty = EnvoyHeader {
                key_ptr: ptr::null(),
                key_length: 0,
                value_ptr: ptr::null(),
                value_length: 0,
            };
            let mut headers = vec![empty; size];
            if !abi::envoy_dynamic_module_callback_http_get_headers(self.0, header_type, headers.as_mut_ptr())
            {
                return Vec::new();
            }
            headers
                .iter()
                .map(|header| {
                    let name = abi::bytes(header.key_ptr, header.key_length);
                    let value = abi::bytes(header.value_ptr, header.value_length);
                    (String::from_utf8_lossy(name).into_owned(), value.to_vec())
                })
                .collect()
        }
    }

    /// Sets a header (replacing its values), or removes it with `None`.
    pub fn set_header(self, header_type: u32, name: &str, value: Option<&str>) -> bool {
        let value = value.map_or_else(ModuleBuffer::null, |value| ModuleBuffer::of(value.as_bytes()));
        // SAFETY: live filter; the buffers point to borrowed strings alive for the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_set_header(
                self.0,
                header_type,
                ModuleBuffer::of(name.as_bytes()),
                value,
            )
        }
    }

    /// Has Envoy choose the stream's route again, from its request headers as they are now.
    pub fn clear_route_cache(self) {
        // SAFETY: live filter; Envoy ignores the call outside the request's phase.
        unsafe { abi::envoy_dynamic_module_callback_http_clear_route_cache(self.0) }
    }

    pub fn add_header(self, header_type: u32, name: &str, value: &str) -> bool {
        // SAFETY: as `set_header`.
        unsafe {
            abi::envoy_dynamic_module_callback_http_add_header(
                self.0,
                header_type,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            )
        }
    }

    /// Answers the request with a local reply.
    pub fn send_response(self, status: u32, headers: &[(String, String)], body: &str) {
        let mut headers: Vec<ModuleHeader> = headers
            .iter()
            .map(|(name, value)| ModuleHeader::of(name, value))
            .collect();
        // SAFETY: live filter; the headers and body borrow strings alive for the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response(
                self.0,
                status,
                headers.as_mut_ptr(),
                headers.len(),
                ModuleBuffer::of(body.as_bytes()),
                ModuleBuffer::of(b"ratelimited"),
            )
        }
    }

    /// Lets the paused request go on.
    pub fn continue_decoding(self) {
        // SAFETY: live filter.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_decoding(self.0) }
    }

    /// Feeds `each` the chunks of the response body received in this hook.
    pub fn received_response_body(self, mut each: impl FnMut(&[u8])) {
        // SAFETY: live filter; the chunks are read only within this hook.
        unsafe {
            let count = abi::envoy_dynamic_module_callback_http_get_body_chunks_size(
                self.0,
                abi::RECEIVED_RESPONSE_BODY,
            );
            if count == 0 {
                return;
            }
            let empty = EnvoyBuffer {
                ptr: ptr::null(),
                length: 0,
            };
            let mut chunks = vec![empty; count];
            let body = abi::RECEIVED_RESPONSE_BODY;
            if abi::envoy_dynamic_module_callback_http_get_body_chunks(self.0, body, chunks.as_mut_ptr()) {
                for chunk in &chunks {
                    each(abi::bytes(chunk.ptr, chunk.length));
                }
            }
        }
    }

    /// A string attribute (e.g. `source.address`), if Envoy has it.
    pub fn attribute_text(self, attribute_id: u32) -> Option<String> {
        let mut result = EnvoyBuffer {
            ptr: ptr::null(),
            length: 0,
        };
        // SAFETY: live filter; the result buffer is copied at once.
        unsafe {
            if !abi::envoy_dynamic_module_callback_http_filter_get_attribute_string(
                self.0,
                attribute_id,
                &mut result,
            ) {
                return None;
            }
            String::from_utf8(abi::bytes(result.ptr, result.length).to_vec()).ok()
        }
    }

    /// Starts a callout carried by this stream; its id, or the init result refusing it.
    pub fn callout(
        self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u64, u32> {
        let start = abi::envoy_dynamic_module_callback_http_filter_http_callout;
        // SAFETY: a live filter.
        unsafe { start_callout(start, self.0, cluster, headers, body, timeout_ms) }
    }

    /// A scheduler that runs this stream's `scheduled` hook on its worker thread.
    pub fn new_scheduler(self) -> Option<Scheduler> {
        // SAFETY: live filter.
        let scheduler = unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_new(self.0) };
        (!scheduler.is_null()).then_some(Scheduler(scheduler))
    }
}

/// A stream's scheduler, from [`Stream::new_scheduler`], until [`Scheduler::delete`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Scheduler(SchedulerPtr);

impl Scheduler {
    /// Asks for the `scheduled` hook of the scheduler's stream.
    pub fn schedule(self) {
        // SAFETY: a scheduler Envoy gave, not yet deleted.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_commit(self.0, 0) }
    }

    pub fn delete(self) {
        // SAFETY: as `schedule`; the caller never uses it again.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_delete(self.0) }
    }
}

/// One of the ABI's two callout functions, a stream's or a configuration's: alike but
/// for whose pointer they take.
type StartCallout = unsafe extern "C" fn(
    *mut c_void,
    *mut u64,
    ModuleBuffer,
    *mut ModuleHeader,
    usize,
    ModuleBuffer,
    u64,
) -> u32;

/// Starts a callout through `start` for `owner`: its id, or the init result refusing it.
///
/// # Safety
/// `owner` is what `start` takes, alive (a stream's filter; a configuration, on the
/// main thread).
unsafe fn start_callout(
    start: StartCallout,
    owner: *mut c_void,
    cluster: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout_ms: u64,
) -> Result<u64, u32> {
    let mut headers: Vec<ModuleHeader> = headers
        .iter()
        .map(|(name, value)| ModuleHeader::of(name, value))
        .collect();
    let mut id = 0u64;
    // Every buffer borrows data alive for the call.
    let result = start(
        owner,
        &mut id,
        ModuleBuffer::of(cluster.as_bytes()),
        headers.as_mut_ptr(),
        headers.len(),
        ModuleBuffer::of(body),
        timeout_ms,
    );
    if result == abi::CALLOUT_INIT_SUCCESS {
        Ok(id)
    } else {
        Err(result)
    }
}

impl EnvoyConfig {
    /// A callout on Envoy's main thread (call it there): its id, or the init result.
    pub fn callout(
        self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u64, u32> {
        let start = abi::envoy_dynamic_module_callback_http_filter_config_http_callout;
        // SAFETY: a live configuration, on the main thread.
        unsafe { start_callout(start, self.0, cluster, headers, body, timeout_ms) }
    }

    /// A scheduler of main-thread events for this configuration (call it in its
    /// `config_new` hook).
    pub fn new_scheduler(self) -> Option<ConfigScheduler> {
        // SAFETY: a live configuration, in its hook.
        let scheduler =
            unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_new(self.0) };
        (!scheduler.is_null()).then_some(ConfigScheduler(scheduler))
    }
}

/// A configuration's scheduler: [`ConfigScheduler::schedule`] from any thread runs the
/// configuration's `scheduled` hook on the main thread.
#[derive(Clone, Copy, Debug)]
pub struct ConfigScheduler(ConfigSchedulerPtr);

// SAFETY: Envoy's configuration scheduler may be committed to from any thread (it
// posts to the main dispatcher); it is deleted once, under the owner's lock.
unsafe impl Send for ConfigScheduler {}

impl ConfigScheduler {
    pub fn schedule(self) {
        // SAFETY: not yet deleted (the owner's lock says so).
        unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_commit(self.0, 0) }
    }

    pub fn delete(self) {
        // SAFETY: as `schedule`; never used again.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(self.0) }
    }
}
