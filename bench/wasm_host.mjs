// Runs a proxy-wasm filter's .wasm under Node's V8 (the engine Envoy embeds) against a
// stub host: every request gets a context, its request headers, its response headers, its
// log and its end, as Envoy delivers them, and the host answers from memory. Prints the
// VM's time per request and the host calls each request made, by name: what the filter
// itself costs on a path, without Envoy (bench/RESULTS.md, "The local path in V8").
//
//   node bench/wasm_host.mjs FILTER.wasm PLUGIN_CONFIG [REQUESTS]
//
// The stub answers what the local path asks: headers, the clock, shared data (with CAS),
// metrics, queues, ticks. An HTTP call is refused (Envoy's "no cluster"), so a rule that
// asks the shim takes its failure mode. Run with --cpu-prof for a profile by function
// (the .wasm's name section names them).
import { readFileSync } from "node:fs";
import { randomFillSync } from "node:crypto";

const [wasmPath, pluginConfig, requestsArg] = process.argv.slice(2);
if (!wasmPath || pluginConfig === undefined) {
  console.error("usage: node bench/wasm_host.mjs FILTER.wasm PLUGIN_CONFIG [REQUESTS]");
  process.exit(2);
}
const REQUESTS = Number(requestsArg || 200000);
const OK = 0, NOT_FOUND = 1, BAD_ARGUMENT = 2, CAS_MISMATCH = 8;
const REQUEST_HEADERS = [
  [":authority", "127.0.0.1:10000"], [":path", "/"], [":method", "GET"], [":scheme", "http"],
  ["user-agent", "wrk"], ["x-api-key", "bench-key-0123456789"], ["x-forwarded-proto", "http"],
  ["x-request-id", "6f2b5c1e-3d4a-4b8e-9c7d-0a1b2c3d4e5f"],
];
const RESPONSE_HEADERS = [[":status", "200"], ["content-length", "0"], ["date", "Sun, 06 Dec 2026 03:00:00 GMT"]];

const calls = new Map();
let instance, memory;
const shared = new Map(); // key -> { bytes, cas }
const queues = new Map();
let casCounter = 1, metricIds = 0, queueIds = 0;
const enc = new TextEncoder(), dec = new TextDecoder();

const mem = () => new DataView(memory.buffer);
const bytesAt = (ptr, len) => new Uint8Array(memory.buffer, ptr, len);
const text = (ptr, len) => dec.decode(bytesAt(ptr, len));
// Copies `bytes` into memory the module allocates, as Envoy does, and writes where.
function give(bytes, retPtr, retLen) {
  const at = bytes.length ? instance.exports.proxy_on_memory_allocate(bytes.length) : 0;
  if (bytes.length) bytesAt(at, bytes.length).set(bytes);
  mem().setUint32(retPtr, at, true);
  mem().setUint32(retLen, bytes.length, true);
}
function serializePairs(pairs) {
  const encoded = pairs.map(([k, v]) => [enc.encode(k), enc.encode(v)]);
  let size = 4 + encoded.length * 8;
  for (const [k, v] of encoded) size += k.length + v.length + 2;
  const out = new Uint8Array(size), view = new DataView(out.buffer);
  view.setUint32(0, encoded.length, true);
  let at = 4;
  for (const [k, v] of encoded) { view.setUint32(at, k.length, true); view.setUint32(at + 4, v.length, true); at += 8; }
  for (const [k, v] of encoded) { out.set(k, at); at += k.length + 1; out.set(v, at); at += v.length + 1; }
  return out;
}
const requestPairs = serializePairs(REQUEST_HEADERS), responsePairs = serializePairs(RESPONSE_HEADERS);
const maps = { 0: REQUEST_HEADERS, 2: RESPONSE_HEADERS };
const pairsOf = { 0: requestPairs, 2: responsePairs };
let configBytes = enc.encode(pluginConfig);

const host = {
  proxy_log: () => OK,
  proxy_get_buffer_bytes: (type, start, max, retPtr, retLen) => {
    if (type !== 7 && type !== 6) return NOT_FOUND;
    give(type === 7 ? configBytes : new Uint8Array(0), retPtr, retLen);
    return OK;
  },
  proxy_set_buffer_bytes: () => OK,
  proxy_get_property: () => NOT_FOUND,
  proxy_set_property: () => OK,
  proxy_get_header_map_pairs: (map, retPtr, retLen) => { give(pairsOf[map] || serializePairs([]), retPtr, retLen); return OK; },
  proxy_get_header_map_value: (map, kp, kl, retPtr, retLen) => {
    const name = text(kp, kl), found = (maps[map] || []).find(([k]) => k === name);
    if (!found) return NOT_FOUND;
    give(enc.encode(found[1]), retPtr, retLen);
    return OK;
  },
  proxy_add_header_map_value: () => OK,
  proxy_set_header_map_pairs: () => OK,
  proxy_replace_header_map_value: () => OK,
  proxy_remove_header_map_value: () => OK,
  proxy_get_current_time_nanoseconds: (retPtr) => {
    mem().setBigUint64(retPtr, process.hrtime.bigint() + 1_796_000_000_000_000_000n, true);
    return OK;
  },
  proxy_get_shared_data: (kp, kl, retPtr, retLen, retCas) => {
    const entry = shared.get(text(kp, kl));
    if (!entry) return NOT_FOUND;
    give(entry.bytes, retPtr, retLen);
    mem().setUint32(retCas, entry.cas, true);
    return OK;
  },
  proxy_set_shared_data: (kp, kl, vp, vl, cas) => {
    const key = text(kp, kl), entry = shared.get(key);
    if (cas !== 0 && entry && entry.cas !== cas) return CAS_MISMATCH;
    shared.set(key, { bytes: bytesAt(vp, vl).slice(), cas: casCounter++ });
    return OK;
  },
  proxy_define_metric: (type, np, nl, retId) => { mem().setUint32(retId, ++metricIds, true); return OK; },
  proxy_increment_metric: () => OK,
  proxy_record_metric: () => OK,
  proxy_get_metric: () => OK,
  proxy_set_tick_period_milliseconds: () => OK,
  proxy_register_shared_queue: (np, nl, retId) => { const id = ++queueIds; queues.set(id, []); mem().setUint32(retId, id, true); return OK; },
  proxy_resolve_shared_queue: (vp, vl, np, nl, retId) => NOT_FOUND,
  proxy_enqueue_shared_queue: (id, vp, vl) => { (queues.get(id) || []).push(bytesAt(vp, vl).slice()); return OK; },
  proxy_dequeue_shared_queue: (id, retPtr, retLen) => {
    const item = (queues.get(id) || []).shift();
    if (!item) return 7; // Empty
    give(item, retPtr, retLen);
    return OK;
  },
  proxy_http_call: () => BAD_ARGUMENT,
  proxy_grpc_call: () => BAD_ARGUMENT, proxy_grpc_stream: () => BAD_ARGUMENT, proxy_grpc_send: () => BAD_ARGUMENT,
  proxy_grpc_cancel: () => OK, proxy_grpc_close: () => OK,
  proxy_continue_stream: () => OK, proxy_close_stream: () => OK, proxy_send_local_response: () => OK,
  proxy_get_status: () => NOT_FOUND, proxy_set_effective_context: () => OK, proxy_done: () => OK,
  proxy_call_foreign_function: () => NOT_FOUND,
  environ_sizes_get: (retCount, retSize) => { mem().setUint32(retCount, 0, true); mem().setUint32(retSize, 0, true); return 0; },
  environ_get: () => 0,
  proc_exit: (code) => { throw new Error(`proc_exit(${code})`); },
  random_get: (ptr, len) => { randomFillSync(bytesAt(ptr, len)); return 0; },
  fd_write: (fd, iovs, iovsLen, retWritten) => {
    let total = 0;
    for (let i = 0; i < iovsLen; i++) total += mem().getUint32(iovs + 8 * i + 4, true);
    mem().setUint32(retWritten, total, true);
    return 0;
  },
};
// Every import counted by name; one not stubbed fails loudly.
const module = new WebAssembly.Module(readFileSync(wasmPath));
const imports = {};
for (const { module: from, name } of WebAssembly.Module.imports(module)) {
  const stub = host[name];
  if (!stub) throw new Error(`no stub for ${from}.${name}`);
  imports[from] ||= {};
  imports[from][name] = (...args) => { calls.set(name, (calls.get(name) || 0) + 1); return stub(...args); };
}
instance = new WebAssembly.Instance(module, imports);
memory = instance.exports.memory;
const x = instance.exports;
if (x._initialize) x._initialize();
const ROOT = 1;
x.proxy_on_context_create(ROOT, 0);
if (!x.proxy_on_vm_start(ROOT, 0)) throw new Error("proxy_on_vm_start refused");
if (!x.proxy_on_configure(ROOT, configBytes.length)) throw new Error("proxy_on_configure refused the configuration");

function request(id) {
  x.proxy_on_context_create(id, ROOT);
  x.proxy_on_request_headers(id, REQUEST_HEADERS.length, 1);
  x.proxy_on_response_headers(id, RESPONSE_HEADERS.length, 1);
  x.proxy_on_log(id);
  x.proxy_on_done(id);
  x.proxy_on_delete(id);
}
let id = ROOT + 1;
for (let i = 0; i < 20000; i++) request(id++); // warm-up: V8 tiers up
calls.clear();
const started = process.hrtime.bigint();
for (let i = 0; i < REQUESTS; i++) request(id++);
const ns = Number(process.hrtime.bigint() - started);
console.log(`${wasmPath}: ${(ns / REQUESTS / 1000).toFixed(3)} µs per request (${REQUESTS} requests, host stubs included)`);
for (const [name, count] of [...calls].sort()) console.log(`  ${name}: ${(count / REQUESTS).toFixed(2)} per request`);
