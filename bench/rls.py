#!/usr/bin/env python3
"""The native rate-limit filter through the shim against the Wasm filter's exact path
(`make bench`; bench/RESULTS.md, "Native filter").

Envoys in turn, each with one worker on core 0 and a route to a cluster (the native
filter applies rate limits only there; Envoy's fault filter answers in place of the
upstream), measured from core 1 in one run:

  - `baseline_cluster`: no limiter;
  - `wasm_exact_cluster`: the Wasm filter, one exact token-bucket rule on `x-api-key`;
  - `native_rls_cluster`: Envoy's `envoy.filters.http.ratelimit` with a `request_headers`
    action on `x-api-key`, calling the same shim's `--grpc-listen` (HTTP/2), whose
    `--rls-config` counts that descriptor in a token bucket of the same limit.

With `--peer PATH` (a `limitador-server` binary built by hand; nothing here builds it),
a fourth, the peer a user would pick instead: `peer_limitador_cluster`, the same native
filter and descriptor against Limitador with its Redis storage (the same Redis), whose
CPU then stands in the shim's column.

The same filter as an Envoy dynamic module (issue #45; `make native` builds
target/shim/libratelimit_native.so, which Envoy finds through
`ENVOY_DYNAMIC_MODULES_SEARCH_PATH`), with the Wasm filter's plugin JSON, beside the
Wasm filter's rows of the same rule:

  - `wasm_leased_cluster`, `module_exact_cluster`, `module_leased_cluster`: the exact rule,
    and the same rule with a lease (100, 1s), as bench/run.py's `rl_leased`;
  - `wasm_local_cluster`, `module_local_cluster`: the same rule with `scope: "local"`;
  - `local_ratelimit_cluster`: Envoy's own `local_ratelimit` admitting everything
    (bench/run.py's `native_local`), the yardstick of the local rows.

And two floors of the Wasm rows, from bench/passthrough: `wasm_passthrough_cluster`
(a Wasm filter doing nothing) and `probe_call_cluster` (pausing each request, one HTTP
call to the shim's /healthz per batch of paused requests, resuming them: the exact
path's host machinery without a rule, a body or Redis).

For each: closed-loop throughput (wrk, 32 connections) as a share of the baseline's, and at
a fixed rate (oha, 2,000 req/s, 32 connections) p50/p99 and CPU per request of Envoy, of the
limiter's service and of Redis. `--runs` repeats them (alternate runs reversed). Writes
bench/out/rls.json and bench/out/rls.md.
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (the sweep's processes, configs and counters)

CONNECTIONS = 32
LIMITS = f"""domain: bench
descriptors:
  - key: api_key
    rate_limit: {{ unit: second, requests_per_unit: {bench.ADMIT_ALL}, algorithm: token_bucket }}
"""


PEER_LIMITS = f"""- namespace: bench
  max_value: {bench.ADMIT_ALL}
  seconds: 1
  conditions: []
  variables:
    - descriptors[0]['api_key']
"""


class Peer:
    """Limitador serving Envoy's rate-limit service, counting in `redis`."""

    def __init__(self, procs, path, redis):
        self.port, http_port = bench.free_port(), bench.free_port()
        limits = bench.OUT / "peer-limits.yaml"
        limits.write_text(PEER_LIMITS)
        self.process = procs.start([path, "-b", "127.0.0.1", "-p", str(self.port), "-B", "127.0.0.1",
                                    "-P", str(http_port), str(limits), "redis", f"redis://127.0.0.1:{redis.port}"],
                                   bench.OUT / "peer.log", core=bench.LOAD_CORE)
        if not bench.wait_until("Limitador", lambda: bench.accepts(self.port), 20, self.process):
            sys.exit("bench: Limitador did not start; see bench/out/peer.log")


NATIVE_MODULE_DIR = bench.ROOT / "target" / "shim"  # `make native`'s libratelimit_native.so
LEASE = {"lease": {"size": 100, "ttl": "1s"}}  # as bench/run.py's rl_leased
LOCAL = {"scope": "local"}


def plugin(extra=None):
    """The plugin JSON of every limiter row here: one token-bucket rule on x-api-key."""
    rule = {"name": "bench", "key": [{"header": "x-api-key"}], "limit": bench.ADMIT_ALL, "period": "1s"}
    rule.update(extra or {})
    return {"shim_cluster": "ratelimit_shim", "rules": [rule]}


def wasm_exact(extra=None):
    return [bench.wasm_filter("ratelimit", bench.RATELIMIT_WASM, plugin(extra))]


def module(extra=None):
    """The filter as an Envoy dynamic module, with the Wasm row's plugin JSON."""
    return [{
        "name": "envoy.filters.http.dynamic_modules",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": {"name": "ratelimit_native"},
            "filter_name": "ratelimit",
            "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                              "value": json.dumps(plugin(extra))},
        },
    }]


NATIVE_FILTER = {
    "name": "envoy.filters.http.ratelimit",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": "bench",
        # As the Wasm filter's default timeout, and failing open like it.
        "timeout": "0.05s",
        "failure_mode_deny": False,
        "rate_limit_service": {"transport_api_version": "V3",
                               "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit_shim"}}},
    },
}


def to_grpc(grpc_port):
    """The route's rate-limit action, and the shim's cluster pointed at its gRPC listener."""
    def shape(bootstrap):
        manager = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        route = manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
        route["rate_limits"] = [{"actions": [{"request_headers": {"header_name": "x-api-key",
                                                                  "descriptor_key": "api_key"}}]}]
        cluster = next(c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "ratelimit_shim")
        cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] = bench.address(grpc_port)
        options = cluster.setdefault("typed_extension_protocol_options", {}).setdefault(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            {"@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"})
        options["explicit_http_config"] = {"http2_protocol_options": {}}
        options.pop("common_http_protocol_options", None)
    return shape


def measure(procs, name, filters, shim, redis, args, shape=None, service=None):
    """`service` is the limiter's process whose CPU is counted (the shim's by default)."""
    redis.flush()
    envoy = bench.Envoy(procs, name, filters, shim.port, shape)
    if not envoy.ready:
        sys.exit(f"bench: Envoy did not start for {name}: {envoy.why_not_ready()}")
    try:
        url = f"http://127.0.0.1:{envoy.port}/"
        headers = [f"x-api-key: {bench.API_KEY}"]
        limiter = service or shim
        bench.wrk(url, 1, headers=headers)  # warm-up: connections, JIT
        before = bench.Snapshot(envoy, limiter, redis)
        closed = bench.wrk(url, args.duration, connections=CONNECTIONS, headers=headers)
        closed.update(bench.delta(before, bench.Snapshot(envoy, limiter, redis)))
        before = bench.Snapshot(envoy, limiter, redis)
        fixed = bench.oha_fixed_rate(url, args.duration, args.rate, headers, CONNECTIONS)
        fixed.update(bench.delta(before, bench.Snapshot(envoy, limiter, redis)))
        stats = envoy.stats()
        fixed["native_errors"] = stats.get("cluster.ratelimit_shim.ratelimit.error", 0) + stats.get(
            "cluster.ratelimit_shim.ratelimit.failure_mode_allowed", 0)
    finally:
        envoy.stop()
    return {"closed": closed, "fixed": fixed}


ORDER = ["baseline_cluster", "wasm_passthrough_cluster", "probe_call_cluster", "wasm_exact_cluster",
         "wasm_leased_cluster", "wasm_local_cluster", "module_exact_cluster", "module_leased_cluster",
         "module_local_cluster", "local_ratelimit_cluster", "native_rls_cluster", "peer_limitador_cluster"]


def table(runs):
    lines = ["| configuration | share of baseline throughput | p50 ms | p99 ms | Envoy CPU µs/req "
             "(over baseline) | service µs/req | Redis µs/req | service calls/req | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        base = run["baseline_cluster"]
        for name in [n for n in ORDER if n in run]:
            row = run[name]
            fixed, closed = row["fixed"], row["closed"]
            p = fixed["latency_ms"]
            over = (fixed["envoy_cpu_us_per_req"] or 0) - (base["fixed"]["envoy_cpu_us_per_req"] or 0)
            errors = fixed["native_errors"] + fixed["shim_errors"] + fixed["failed_open"]
            lines.append(
                f"| {name} | {closed['rps'] / base['closed']['rps']:.2f} | {p.get('p50', 0):.3f} | "
                f"{p.get('p99', 0):.3f} | {fixed['envoy_cpu_us_per_req'] or 0:.1f} ({over:+.1f}) | "
                f"{fixed['shim_cpu_us_per_req'] or 0:.1f} | {fixed['redis_cpu_us_per_req'] or 0:.1f} | "
                f"{fixed['shim_calls_per_req'] or 0:.3f} | {errors} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=4, help="seconds per measurement")
    parser.add_argument("--rate", type=int, default=2000, help="fixed request rate")
    parser.add_argument("--runs", type=int, default=2, help="times the configurations are measured")
    parser.add_argument("--peer", help="a limitador-server binary: adds the peer's row")
    args = parser.parse_args()
    if not (NATIVE_MODULE_DIR / "libratelimit_native.so").exists():
        sys.exit("bench: target/shim/libratelimit_native.so is missing (run `make native`)")
    # Read by every Envoy started here (the Wasm rows ignore it).
    os.environ["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = str(NATIVE_MODULE_DIR)
    bench.OUT.mkdir(parents=True, exist_ok=True)
    limits = bench.OUT / "rls-limits.yaml"
    limits.write_text(LIMITS)
    procs = bench.Processes()
    runs = []
    try:
        redis = bench.Redis(procs)
        grpc_port = bench.free_port()
        shim = bench.Shim(procs, redis.port, extra=("--grpc-listen", f"127.0.0.1:{grpc_port}",
                                                    "--rls-config", str(limits)))
        passthrough = bench.PASSTHROUGH_WASM
        configs = [("baseline_cluster", [], None, None),
                   ("wasm_passthrough_cluster", [bench.wasm_filter("passthrough", passthrough, None)], None, None),
                   ("probe_call_cluster", [bench.wasm_filter("passthrough", passthrough, "call:1")], None, None),
                   ("wasm_exact_cluster", wasm_exact(), None, None),
                   ("wasm_leased_cluster", wasm_exact(LEASE), None, None),
                   ("wasm_local_cluster", wasm_exact(LOCAL), None, None),
                   ("module_exact_cluster", module(), None, None),
                   ("module_leased_cluster", module(LEASE), None, None),
                   ("module_local_cluster", module(LOCAL), None, None),
                   ("local_ratelimit_cluster", [bench.NATIVE_LOCAL_RATELIMIT], None, None),
                   ("native_rls_cluster", [NATIVE_FILTER], to_grpc(grpc_port), None)]
        if args.peer:
            peer = Peer(procs, args.peer, redis)
            configs.append(("peer_limitador_cluster", [NATIVE_FILTER], to_grpc(peer.port), peer))
        for run in range(args.runs):
            print(f"native filter: run {run + 1}", flush=True)
            results = {}
            for name, filters, shape, service in (configs if run % 2 == 0 else configs[::-1]):
                results[name] = measure(procs, name, filters, shim, redis, args, shape, service)
                fixed = results[name]["fixed"]
                print(f"  {name:24} {results[name]['closed']['rps']:8.0f} req/s  "
                      f"p50 {fixed['latency_ms'].get('p50', 0):.3f} ms  "
                      f"envoy {fixed['envoy_cpu_us_per_req'] or 0:.1f} us/req", flush=True)
            runs.append(results)
    finally:
        procs.stop_all()
    (bench.OUT / "rls.json").write_text(json.dumps(runs, indent=1))
    (bench.OUT / "rls.md").write_text(table(runs))
    print()
    print(table(runs))


if __name__ == "__main__":
    main()
