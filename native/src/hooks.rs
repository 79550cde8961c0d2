//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`), as the header declares
//! them: every HTTP-filter hook the pinned Envoy looks up is exported, those the filter
//! does not need as no-ops with the declared return. Each hook hands over to
//! `crate::config` or `crate::filter` inside [`guarded`]: a panic never unwinds into
//! Envoy (it is logged and the hook's neutral answer returned).

// Envoy is these functions' only caller, and the ABI makes its pointers valid for the
// hook (each dereference says which guarantee it relies on).
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use crate::abi::{self, EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr};
use crate::config::{self, ModuleConfig};
use crate::envoy::{self, EnvoyConfig, Stream};
use crate::filter::Filter;
use crate::main_thread::Answer;
use ratelimit_wasm::attributes::header_text;
use ratelimit_wasm::wire::VERSION_HEADER;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::Arc;

fn guarded<R>(neutral: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(_) => {
            envoy::log(abi::LOG_ERROR, "a hook panicked; its stream goes on unfiltered");
            neutral
        }
    }
}

/// The filter behind a module pointer this module returned from `filter_new`, held for
/// the hook: Envoy may destroy the filter from inside one of its own hooks (a local
/// reply that ends the stream at once), and the filter must outlive that hook.
///
/// # Safety
/// `filter` must come from [`envoy_dynamic_module_on_http_filter_new`] and not be
/// destroyed yet.
unsafe fn filter(filter: *const c_void) -> Rc<Filter> {
    let filter = filter.cast::<Filter>();
    Rc::increment_strong_count(filter);
    Rc::from_raw(filter)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    abi::ABI_VERSION.as_ptr().cast()
}

/// Compiles the plugin configuration; null (Envoy refuses the configuration) when it is
/// invalid, with the reason logged.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: *mut c_void,
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    guarded(std::ptr::null(), || {
        // SAFETY: Envoy lends the configuration's bytes for this hook.
        let bytes = unsafe { abi::bytes(config.ptr, config.length) };
        match config::load(EnvoyConfig(config_envoy), bytes) {
            Ok(loaded) => Arc::into_raw(Arc::new(loaded)).cast(),
            Err(reason) => {
                envoy::log(abi::LOG_ERROR, &reason);
                std::ptr::null()
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    guarded((), || {
        // SAFETY: the pointer `config_new` returned, given back once.
        let config = unsafe { Arc::from_raw(config.cast::<ModuleConfig>()) };
        config.close();
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    envoy: FilterEnvoyPtr,
) -> *const c_void {
    guarded(std::ptr::null(), || {
        // SAFETY: `config` is alive while Envoy creates filters from it; one more
        // strong count is taken for this thread's worker map.
        let config = unsafe {
            Arc::increment_strong_count(config.cast::<ModuleConfig>());
            Arc::from_raw(config.cast::<ModuleConfig>())
        };
        match config::worker_for(&config) {
            Some(worker) => Rc::into_raw(Rc::new(Filter::new(worker, Stream(envoy)))).cast(),
            None => std::ptr::null(),
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: a live filter of ours.
    guarded(abi::HEADERS_CONTINUE, || {
        unsafe { filter(module) }.on_request_headers()
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    guarded(abi::BODY_CONTINUE, || {
        // SAFETY: a live filter of ours.
        if unsafe { filter(module) }.waits() {
            abi::BODY_STOP_ITERATION_AND_BUFFER
        } else {
            abi::BODY_CONTINUE
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
) -> u32 {
    guarded(abi::TRAILERS_CONTINUE, || {
        // SAFETY: a live filter of ours.
        if unsafe { filter(module) }.waits() {
            abi::TRAILERS_STOP_ITERATION
        } else {
            abi::TRAILERS_CONTINUE
        }
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: a live filter of ours.
    guarded((), || unsafe { filter(module) }.on_response_headers());
    abi::HEADERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: a live filter of ours.
    guarded((), || unsafe { filter(module) }.on_response_body());
    abi::BODY_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
) -> u32 {
    // SAFETY: a live filter of ours.
    guarded((), || unsafe { filter(module) }.on_response_trailers());
    abi::TRAILERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
) {
    // SAFETY: a live filter of ours.
    guarded((), || unsafe { filter(module) }.on_stream_complete());
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    guarded((), || {
        // SAFETY: a filter of ours, given back once: Envoy's reference, dropped here
        // (a hook of it still running holds its own).
        let filter = unsafe { Rc::from_raw(module.cast::<Filter>()) };
        filter.on_destroy();
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
    _event: u64,
) {
    // SAFETY: a live filter of ours.
    guarded((), || unsafe { filter(module) }.on_scheduled());
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
    callout_id: u64,
    result: u32,
    headers: *mut EnvoyHeader,
    headers_size: usize,
    body_chunks: *mut EnvoyBuffer,
    body_chunks_size: usize,
) {
    guarded((), || {
        // SAFETY: Envoy lends the headers and chunks (arrays of the sizes given, or
        // null) for this hook; both are copied before the worker runs.
        let (headers, body) = unsafe { callout_answer(headers, headers_size, body_chunks, body_chunks_size) };
        // SAFETY: a live filter of ours.
        let filter = unsafe { filter(module) };
        filter.on_callout_done(callout_id, &headers, result == abi::CALLOUT_SUCCESS, &body);
    })
}

/// A callout's answer, copied: its headers and its body.
///
/// # Safety
/// The arrays hold the sizes given (or are null), each buffer valid for the hook.
unsafe fn callout_answer(
    headers: *mut EnvoyHeader,
    headers_size: usize,
    body_chunks: *mut EnvoyBuffer,
    body_chunks_size: usize,
) -> (Vec<(String, Vec<u8>)>, Vec<u8>) {
    let headers = array(headers, headers_size)
        .iter()
        .map(|header| {
            let name = abi::bytes(header.key_ptr, header.key_length);
            let value = abi::bytes(header.value_ptr, header.value_length);
            (String::from_utf8_lossy(name).into_owned(), value.to_vec())
        })
        .collect();
    let mut body = Vec::new();
    for chunk in array(body_chunks, body_chunks_size) {
        body.extend_from_slice(abi::bytes(chunk.ptr, chunk.length));
    }
    (headers, body)
}

/// # Safety
/// `items` points to `count` values, or is null.
unsafe fn array<'a, T>(items: *const T, count: usize) -> &'a [T] {
    if items.is_null() || count == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(items, count)
    }
}

/// Our own replies pass here too: they go out as sent.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _envoy: FilterEnvoyPtr,
    _module: *const c_void,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> u32 {
    abi::LOCAL_REPLY_CONTINUE
}

// Hooks of features the filter does not use: no-ops (all return nothing).

/// Per-route configuration is not supported: refused (null).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    envoy::log(abi::LOG_ERROR, "per-route configuration is not supported");
    std::ptr::null()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_config: *const c_void) {}

/// On the main thread: the calls workers queued for it (`crate::main_thread`).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    config_envoy: *mut c_void,
    config: *const c_void,
    _event: u64,
) {
    guarded((), || {
        // SAFETY: the configuration `config_new` returned; Envoy drops a scheduled
        // event of a configuration it destroyed.
        let config = unsafe { &*config.cast::<ModuleConfig>() };
        config.main_thread.send_queued(EnvoyConfig(config_envoy));
    })
}

/// On the main thread: the answer to a call it carried, kept for its worker.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy: *mut c_void,
    config: *const c_void,
    callout_id: u64,
    result: u32,
    headers: *mut EnvoyHeader,
    headers_size: usize,
    body_chunks: *mut EnvoyBuffer,
    body_chunks_size: usize,
) {
    guarded((), || {
        // SAFETY: as `on_http_filter_callout_done`'s; the configuration is alive while
        // Envoy answers its callouts.
        let (headers, body) = unsafe { callout_answer(headers, headers_size, body_chunks, body_chunks_size) };
        let config = unsafe { &*config.cast::<ModuleConfig>() };
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, value)| header_text(value.clone()))
        };
        config.main_thread.answered(callout_id, |token| Answer {
            token,
            status: header(":status").filter(|_| result == abi::CALLOUT_SUCCESS),
            shim_version: header(VERSION_HEADER),
            body,
        });
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _envoy: FilterEnvoyPtr,
    _module: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _envoy: FilterEnvoyPtr,
    _module: *const c_void,
) {
}

/// The streamable-callout and config-level-callout hooks: this filter starts neither,
/// so Envoy never calls them; exported (with no body) because Envoy looks them up.
macro_rules! unused_hooks {
    ($($name:ident),*) => {$(
        #[no_mangle]
        pub extern "C" fn $name() {}
    )*};
}

unused_hooks!(
    envoy_dynamic_module_on_http_filter_http_stream_headers,
    envoy_dynamic_module_on_http_filter_http_stream_data,
    envoy_dynamic_module_on_http_filter_http_stream_trailers,
    envoy_dynamic_module_on_http_filter_http_stream_complete,
    envoy_dynamic_module_on_http_filter_http_stream_reset,
    envoy_dynamic_module_on_http_filter_config_http_stream_headers,
    envoy_dynamic_module_on_http_filter_config_http_stream_data,
    envoy_dynamic_module_on_http_filter_config_http_stream_trailers,
    envoy_dynamic_module_on_http_filter_config_http_stream_complete,
    envoy_dynamic_module_on_http_filter_config_http_stream_reset
);
