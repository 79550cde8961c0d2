#!/usr/bin/env python3
"""The cost of distance (`make bench`, after the sweep; bench/RESULTS.md, "Distance").

Every other row runs on loopback, where a hop costs about 0.1 ms. In production the shim
and Redis are a network hop away. This puts bench/delay_proxy.rs, which delays each byte
by a fixed one-way time in both directions, on the hop from Envoy to the shim, the hop
from the shim to Redis, or both. The one-way delays are 0 (the proxy alone: the reference),
0.25 ms and 1 ms. For the exact, leased and local paths and the deny cache it measures, at
a fixed rate (oha, latency-corrected), the added p50/p99 against the reference and
against the injected round trip. It also reports shim calls per request, checks per call
(what batching does with the longer round trip), and the requests that timed out or
failed open.

The filter runs with its default `timeout` and batching (`shim_calls_in_flight`) in
every row, since those defaults have to be right at 1 ms each way. Writes
bench/out/distance.json and bench/out/distance.md.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (the sweep's processes, configs and counters)

PROXY_SOURCE = bench.ROOT / "bench" / "delay_proxy.rs"
PROXY_BIN = bench.OUT / "delay-proxy"
DELAYS_US = (0, 250, 1000)
# oha's connections: each holds one request at a time, so 16 carry 2,000 req/s only while
# a request takes under 8 ms; past that the load generator, not the limiter, queues.
CONNECTIONS = 64
HOPS = ("envoy-shim", "shim-redis", "both")


def plugin(rule_extra, limit=bench.ADMIT_ALL, **top):
    """The sweep's rule, with the filter's default timeout and batching unless `top` says."""
    rule = {"name": "bench", "key": [{"header": "x-api-key"}], "limit": limit, "period": "1s", **rule_extra}
    config = {"shim_cluster": "ratelimit_shim", "rules": [rule], **top}
    return [bench.wasm_filter("ratelimit", bench.RATELIMIT_WASM, config)]


PATHS = [
    ("exact", plugin({})),
    ("leased", plugin({"lease": {"size": 100, "ttl": "1s"}})),
    ("local", plugin({"scope": "local"})),
    # 10/s against 2,000 req/s: nearly every request is refused, most from the deny cache.
    ("deny_cache", plugin({}, limit=10)),
]
# The batching knob at a distance: more calls in flight send sooner, fewer batch more.
VARIANTS = [
    ("exact_8_calls", plugin({}, shim_calls_in_flight=8)),
    ("exact_16_calls", plugin({}, shim_calls_in_flight=16)),
]


def build_proxy():
    subprocess.run(["rustc", "-O", "--edition", "2021", str(PROXY_SOURCE), "-o", str(PROXY_BIN)], check=True)


def proxy(procs, upstream_port, delay_us, name):
    port = bench.free_port()
    process = procs.start([str(PROXY_BIN), f"127.0.0.1:{port}", f"127.0.0.1:{upstream_port}", str(delay_us)],
                          bench.OUT / f"delay-proxy-{name}.log", core=bench.LOAD_CORE)
    if not bench.wait_until("delay proxy", lambda: bench.accepts(port), 10, process):
        sys.exit("bench: the delay proxy did not start")
    return port


def measure(procs, name, filters, shim_port, shim, redis, args):
    redis.flush()
    envoy = bench.Envoy(procs, name, filters, shim_port)
    if not envoy.ready:
        sys.exit(f"bench: Envoy did not start for {name}: {envoy.why_not_ready()}")
    try:
        url = f"http://127.0.0.1:{envoy.port}/"
        headers = [f"x-api-key: {bench.API_KEY}"]
        bench.oha_fixed_rate(url, 1, args.rate, headers, CONNECTIONS)  # warm-up: connections, JIT, leases
        before = bench.Snapshot(envoy, shim, redis)
        result = bench.oha_fixed_rate(url, args.duration, args.rate, headers, CONNECTIONS)
        result.update(bench.delta(before, bench.Snapshot(envoy, shim, redis)))
    finally:
        envoy.stop()
    counters = result["filter_counters"]
    result["timeouts"] = sum(v for k, v in counters.items() if k.endswith("shim_timeouts"))
    return result


def topology(procs, redis, hop, delay_us, args):
    """A shim (behind a proxy to Redis when the hop includes it) and the port Envoy calls."""
    redis_port = proxy(procs, redis.port, delay_us, f"redis-{hop}-{delay_us}") if hop != "envoy-shim" else redis.port
    shim = bench.Shim(procs, redis_port)
    shim_port = proxy(procs, shim.port, delay_us, f"shim-{hop}-{delay_us}") if hop != "shim-redis" else shim.port
    return shim, shim_port


def table(results):
    lines = ["| hop | one-way delay | path | p50 ms | p99 ms | added p50 / injected RTT | added p99 | "
             "shim calls/req | checks/call | timeouts | failed open |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for hop in results:
        for delay in DELAYS_US:
            for path in results[hop][str(delay)]:
                row = results[hop][str(delay)][path]
                ref = results[hop]["0"][path]
                p50, p99 = row["latency_ms"].get("p50", 0), row["latency_ms"].get("p99", 0)
                added50 = p50 - ref["latency_ms"].get("p50", 0)
                added99 = p99 - ref["latency_ms"].get("p99", 0)
                # Each delayed hop is crossed twice per round trip, "both" delays two hops.
                injected_ms = 2 * delay / 1000 * (2 if hop == "both" else 1)
                share = f"{added50:.3f} / {injected_ms:.2f}" if delay else "reference"
                fmt = lambda v, f: format(v, f) if v is not None else "-"
                lines.append(f"| {hop} | {delay / 1000:.2f} ms | {path} | {p50:.3f} | {p99:.3f} | {share} | "
                             f"{added99 if delay else 0:+.3f} | {fmt(row['shim_calls_per_req'], '.3f')} | "
                             f"{fmt(row['checks_per_call'], '.2f')} | {row['timeouts']} | {row['failed_open']} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=4, help="seconds per measurement")
    parser.add_argument("--rate", type=int, default=2000, help="fixed request rate")
    parser.add_argument("--hops", default=",".join(HOPS), help="comma-separated: " + ", ".join(HOPS))
    parser.add_argument("--variants", action="store_true",
                        help="also the exact path with 8 and 16 shim calls in flight")
    args = parser.parse_args()
    hops = args.hops.split(",")
    paths = PATHS + (VARIANTS if args.variants else [])
    bench.OUT.mkdir(parents=True, exist_ok=True)
    build_proxy()
    procs = bench.Processes()
    results = {}
    try:
        redis = bench.Redis(procs)
        for hop in hops:
            results[hop] = {}
            for delay in DELAYS_US:
                print(f"distance: {hop}, {delay} us each way", flush=True)
                shim, shim_port = topology(procs, redis, hop, delay, args)
                results[hop][str(delay)] = {}
                for path, filters in paths:
                    row = measure(procs, f"distance-{path}", filters, shim_port, shim, redis, args)
                    results[hop][str(delay)][path] = row
                    p = row["latency_ms"]
                    print(f"  {path:10} p50 {p.get('p50', 0):.3f} ms  p99 {p.get('p99', 0):.3f} ms  "
                          f"shim calls/req {row['shim_calls_per_req'] or 0:.3f}  "
                          f"checks/call {row['checks_per_call'] or 0:.2f}  timeouts {row['timeouts']}", flush=True)
                # This topology's shim and proxies go; Redis stays for the next.
                for child in list(procs.children):
                    if child is not redis.process:
                        procs.stop(child)
    finally:
        procs.stop_all()
    (bench.OUT / "distance.json").write_text(json.dumps(results, indent=1))
    (bench.OUT / "distance.md").write_text(table(results))
    print()
    print(table(results))


if __name__ == "__main__":
    main()
