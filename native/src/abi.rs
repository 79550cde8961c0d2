//! The part of Envoy's dynamic-module ABI this filter uses, written here from its C
//! header, `source/extensions/dynamic_modules/abi/abi.h` of envoyproxy/envoy (read at
//! revision fe169c6; the pinned Envoy 1.40.0's binary says "ABI version v0.2.0 matched"
//! for [`ABI_VERSION`], docs/NATIVE.md). Only the types and the callbacks (functions Envoy implements) the
//! filter calls are declared; the event hooks (functions the module implements) are in
//! `crate::hooks`. `tests/native.rs` checks that the pinned Envoy binary exports every
//! callback declared here, and the module is linked with `-z now` (`build.rs`), so an
//! Envoy without one of them refuses to load it, naming the symbol.
//!
//! C enums are `int`-sized: they are `u32` here, with the values the header gives.

use std::ffi::{c_char, c_void};

/// What `envoy_dynamic_module_on_program_init` returns: the ABI version this module
/// was written against.
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// `envoy_dynamic_module_type_envoy_buffer`: bytes Envoy owns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

/// `envoy_dynamic_module_type_module_buffer`: bytes the module owns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

/// `envoy_dynamic_module_type_envoy_http_header`: a header Envoy owns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

/// `envoy_dynamic_module_type_module_http_header`: a header the module owns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

/// `envoy_dynamic_module_type_http_filter_envoy_ptr`: Envoy's side of one stream's filter.
pub type FilterEnvoyPtr = *mut c_void;
/// `envoy_dynamic_module_type_http_filter_config_envoy_ptr`: Envoy's side of a configuration.
pub type FilterConfigEnvoyPtr = *mut c_void;
/// `envoy_dynamic_module_type_http_filter_scheduler_module_ptr`.
pub type SchedulerPtr = *mut c_void;
/// `envoy_dynamic_module_type_http_filter_config_scheduler_module_ptr`.
pub type ConfigSchedulerPtr = *mut c_void;

// envoy_dynamic_module_type_http_header_type
pub const REQUEST_HEADERS: u32 = 0;
pub const RESPONSE_HEADERS: u32 = 2;
pub const RESPONSE_TRAILERS: u32 = 3;

// envoy_dynamic_module_type_http_body_type
pub const RECEIVED_RESPONSE_BODY: u32 = 2;

// envoy_dynamic_module_type_log_level
pub const LOG_INFO: u32 = 2;
pub const LOG_WARN: u32 = 3;
pub const LOG_ERROR: u32 = 4;

// envoy_dynamic_module_type_http_callout_init_result
pub const CALLOUT_INIT_SUCCESS: u32 = 0;
pub const CALLOUT_INIT_CLUSTER_NOT_FOUND: u32 = 2;

// envoy_dynamic_module_type_http_callout_result
pub const CALLOUT_SUCCESS: u32 = 0;

// envoy_dynamic_module_type_metrics_result
pub const METRICS_SUCCESS: u32 = 0;

// envoy_dynamic_module_type_attribute_id
pub const ATTRIBUTE_SOURCE_ADDRESS: u32 = 24;

// The statuses the filter's hooks return (each status enum of the header).
pub const HEADERS_CONTINUE: u32 = 0;
pub const HEADERS_STOP_ITERATION: u32 = 1;
pub const BODY_CONTINUE: u32 = 0;
pub const BODY_STOP_ITERATION_AND_BUFFER: u32 = 1;
pub const TRAILERS_CONTINUE: u32 = 0;
pub const TRAILERS_STOP_ITERATION: u32 = 1;
pub const LOCAL_REPLY_CONTINUE: u32 = 0;

extern "C" {
    pub fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);

    /// Stats are defined on the configuration, while Envoy loads it.
    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: FilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        counter_id: *mut usize,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: FilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        histogram_id: *mut usize,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: FilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
        filter: FilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;

    pub fn envoy_dynamic_module_callback_http_get_headers_size(
        filter: FilterEnvoyPtr,
        header_type: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterEnvoyPtr,
        header_type: u32,
        result: *mut EnvoyHeader,
    ) -> bool;
    /// Replaces every value of `key`; a null `value.ptr` removes the header.
    pub fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_add_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    pub fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: FilterEnvoyPtr);
    pub fn envoy_dynamic_module_callback_http_clear_route_cache(filter: FilterEnvoyPtr);

    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter: FilterEnvoyPtr,
        body_type: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterEnvoyPtr,
        body_type: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterEnvoyPtr,
        attribute_id: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// A callout of this stream's filter: it ends with the stream.
    pub fn envoy_dynamic_module_callback_http_filter_http_callout(
        filter: FilterEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> u32;

    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new(filter: FilterEnvoyPtr) -> SchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler: SchedulerPtr, event_id: u64);
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: SchedulerPtr);

    /// A callout of the configuration, made and answered on Envoy's main thread.
    pub fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: FilterConfigEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> u32;

    /// A scheduler whose events run on the main thread; committed from any thread.
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        config: FilterConfigEnvoyPtr,
    ) -> ConfigSchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: ConfigSchedulerPtr,
        event_id: u64,
    );
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler: ConfigSchedulerPtr);
}

impl ModuleBuffer {
    pub fn of(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr().cast(),
            length: bytes.len(),
        }
    }

    /// The null buffer (a header removed, no details).
    pub fn null() -> ModuleBuffer {
        ModuleBuffer {
            ptr: std::ptr::null(),
            length: 0,
        }
    }
}

impl ModuleHeader {
    pub fn of(name: &str, value: &str) -> ModuleHeader {
        ModuleHeader {
            key_ptr: name.as_ptr().cast(),
            key_length: name.len(),
            value_ptr: value.as_ptr().cast(),
            value_length: value.len(),
        }
    }
}

/// The bytes of an Envoy-owned buffer, valid for the current hook only.
///
/// # Safety
/// `ptr` must point to `length` readable bytes for `'a` (or be null).
pub unsafe fn bytes<'a>(ptr: *const c_char, length: usize) -> &'a [u8] {
    if ptr.is_null() || length == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr.cast(), length)
    }
}
