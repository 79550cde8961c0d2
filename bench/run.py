#!/usr/bin/env python3
"""The benchmark sweep behind `make bench` (see bench/RESULTS.md for how to read it).

Starts Redis and the shim, then, for each configuration in turn, an Envoy with one
worker pinned to core 0 (`--concurrency 1`, `taskset -c 0`) whose route answers 200
itself, and measures it from core 1:

  - max throughput: wrk, closed loop, 32 connections;
  - latency at a fixed rate (2,000 req/s): oha with latency correction;
  - CPU per request of Envoy, and per shim check of the shim and of Redis: on-CPU time
    of every thread (/proc/<pid>/task/*/schedstat) before and after, over requests
    served (Envoy's own counters) or checks made (Envoy's shim-cluster counters);
  - shim calls and Redis commands per request (Envoy's cluster stats, Redis
    INFO commandstats; commands run inside a script count too).

Every configuration is measured back to back in one run, and the whole sweep runs
`--runs` times (alternate runs in reverse order) so the table can show the spread.
Then the shim against its ceiling (wrk through the shim vs redis-benchmark FCALL of
the same script) and Redis bytes per key for each algorithm. Writes
bench/out/results.json and bench/out/table.md; bench/plot.py draws the latency plot.

Everything listens on 127.0.0.1 only; every load is bounded by --duration seconds.
"""

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
# Relative to the repository root, where Envoy runs: no machine path in any config.
RATELIMIT_WASM = "target/wasm32-wasip1/release/ratelimit_wasm.wasm"
PASSTHROUGH_WASM = "bench/passthrough/target/passthrough.wasm"
SHIM_BIN = os.environ.get("SHIM_BIN", "target/shim/redis-shim")  # another build: before/after
ENVOY_BIN = os.environ.get("ENVOY_BIN", str(ROOT / ".venv" / "bin" / "envoy"))
SCRIPTS = ROOT / "redis-shim" / "scripts"

ENVOY_CORE, LOAD_CORE = "0", "1"
API_KEY = "bench-client"
# Admits everything: the rows measure the cost of deciding, not of refusing.
HUGE = 1_000_000_000
# The rules' "admit everything" limit, per second. Not HUGE: the token-bucket script
# fails above ~8 million tokens per second (see bench/RESULTS.md, "Found on the way").
ADMIT_ALL = 1_000_000


# --------------------------------------------------------------------------- configs

def wasm_filter(name, filename, plugin_config):
    config = {
        "name": name,
        "root_id": name,
        "vm_config": {"runtime": "envoy.wasm.runtime.v8", "code": {"local": {"filename": filename}}},
    }
    if plugin_config is not None:
        config["configuration"] = {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": json.dumps(plugin_config),
        }
    return {
        "name": "envoy.filters.http.wasm",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                         "config": config},
    }


def ratelimit(rule_extra, limit=ADMIT_ALL, period="1s", wasm=RATELIMIT_WASM, **top):
    rule = {"name": "bench", "key": [{"header": "x-api-key"}], "limit": limit, "period": period}
    rule.update(rule_extra)
    # A generous timeout: a slow answer under closed-loop load must show as latency, not
    # as a fail-open admission that skips the shim.
    plugin = {"shim_cluster": "ratelimit_shim", "timeout": "1s", "rules": [rule], **top}
    return [wasm_filter("ratelimit", wasm, plugin)]


NATIVE_LOCAL_RATELIMIT = {
    "name": "envoy.filters.http.local_ratelimit",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
        "stat_prefix": "local_rl",
        "token_bucket": {"max_tokens": HUGE, "tokens_per_fill": HUGE, "fill_interval": "1s"},
        "filter_enabled": {"runtime_key": "local_rl_enabled",
                           "default_value": {"numerator": 100, "denominator": "HUNDRED"}},
        "filter_enforced": {"runtime_key": "local_rl_enforced",
                            "default_value": {"numerator": 100, "denominator": "HUNDRED"}},
    },
}

# Envoy's fault filter answering every request itself (200), after the route to a cluster
# was chosen: the topology of a limiter in front of an upstream, without the upstream.
FAULT_RESPONDS = {
    "name": "envoy.filters.http.fault",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
        "abort": {"http_status": 200, "percentage": {"numerator": 100, "denominator": "HUNDRED"}},
    },
}

SHIM_HOP = "baseline_shim_hop"

# name, description, HTTP filters ahead of the router. Names ending in `_cluster` route to
# a cluster and are answered by FAULT_RESPONDS (compared with `baseline_cluster`); the others
# answer from the route (`direct_response`, compared with `baseline`).
CONFIGS = [
    ("baseline", "no rate-limit filter", []),
    ("baseline_cluster", "no rate-limit filter, route to a cluster", []),
    # What one hop from Envoy to the shim costs with no limiter at all: every request
    # forwarded by the router, over the shipped shim cluster, to the shim's /healthz.
    (SHIM_HOP, "no rate-limit filter, every request proxied to the shim's /healthz", []),
    ("native_local", "Envoy local_ratelimit (admits all)", [NATIVE_LOCAL_RATELIMIT]),
    ("wasm_passthrough", "pass-through wasm filter", [wasm_filter("passthrough", PASSTHROUGH_WASM, None)]),
    ("rl_local", "ratelimit-wasm, scope local", ratelimit({"scope": "local"})),
    ("rl_global", "ratelimit-wasm, exact global", ratelimit({})),
    ("rl_leased", "ratelimit-wasm, leased (100, 1s)", ratelimit({"lease": {"size": 100, "ttl": "1s"}})),
    ("rl_global_cluster", "ratelimit-wasm, exact global, route to a cluster", ratelimit({})),
    ("rl_abusive", "ratelimit-wasm, abusive client (10/s)", ratelimit({}, limit=10, period="1s")),
    ("rl_abusive_100", "ratelimit-wasm, abusive client (100/s)", ratelimit({}, limit=100, period="1s")),
]
# Variants for the profile-and-improve step (`--only NAME,...`): same rules, one thing
# changed in the deployment, not in the code.
EXPERIMENTS = [
    ("rl_global_h2", "exact global, HTTP/2 to the shim", ratelimit({})),
    ("rl_global_h2_cluster", "exact global, HTTP/2 to the shim, route to a cluster", ratelimit({})),
    ("rl_global_noheaders", "exact global, no rate-limit headers", ratelimit({}, response={"headers": "none"})),
    ("rl_local_noheaders", "ratelimit-wasm local, no rate-limit headers",
     ratelimit({"scope": "local"}, response={"headers": "none"})),
    ("rl_global_1call", "exact global, shim_calls_in_flight 1", ratelimit({}, shim_calls_in_flight=1)),
    ("rl_global_16calls", "exact global, shim_calls_in_flight 16", ratelimit({}, shim_calls_in_flight=16)),
    # The price of a host call: the pass-through filter making 8 of one kind per request.
    *[(f"probe_{kind}8", f"pass-through + 8 host calls: {kind}",
       [wasm_filter("passthrough", PASSTHROUGH_WASM, f"{kind}:8")])
      for kind in ("time", "header", "headers", "shared", "set", "metric", "add_header")],
    # A local rule's host calls and nothing else: the floor of the local path.
    ("probe_floor", "pass-through + a local rule's host calls (headers, clock, shared read + CAS write, "
                    "counter, 3 response headers)", [wasm_filter("passthrough", PASSTHROUGH_WASM, "floor:1")]),
    ("probe_pause", "pass-through, paused and resumed by the root",
     [wasm_filter("passthrough", PASSTHROUGH_WASM, "pause:1")]),
    ("probe_call", "pass-through, paused, one call to the shim's /healthz per batch, resumed",
     [wasm_filter("passthrough", PASSTHROUGH_WASM, "call:1")]),
]
CLUSTER_ROW = "rl_global_3_masters"  # not "_cluster": that suffix means the route-to-a-cluster topology
CLUSTER_ROW_DESCRIPTION = "exact global, Redis Cluster (3 masters)"

# Rows that change the shipped shim cluster's protocol (HTTP/1.1) to HTTP/2.
H2_TO_SHIM = {"rl_global_h2", "rl_global_h2_cluster"}


def address(port):
    return {"socket_address": {"address": "127.0.0.1", "port_value": port}}


def shipped_shim_cluster(shim_port, http2=False):
    """The shim's cluster exactly as the shipped envoy.yaml defines it (protocol, timeouts,
    connection options), pointed at this run's shim."""
    import yaml  # bench/bench.sh runs this script from bench/.venv, which has PyYAML
    shipped = yaml.safe_load((ROOT / "envoy.yaml").read_text())
    cluster = next(c for c in shipped["static_resources"]["clusters"] if c["name"] == "ratelimit_shim")
    cluster["load_assignment"] = {"cluster_name": "ratelimit_shim",
                                  "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address(shim_port)}}]}]}
    if http2:
        options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        options["explicit_http_config"] = {"http2_protocol_options": {}}
    return cluster


def envoy_config(port, admin_port, shim_port, filters, name=""):
    to_cluster = name.endswith("_cluster")
    route = ({"route": {"cluster": "upstream"}} if to_cluster
             else {"route": {"cluster": "ratelimit_shim", "prefix_rewrite": "/healthz"}} if name == SHIM_HOP
             else {"direct_response": {"status": 200, "body": {"inline_string": "ok"}}})
    upstream = {"name": "upstream", "type": "STATIC", "connect_timeout": "0.25s",
                "load_assignment": {"cluster_name": "upstream",
                                    "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address(9)}}]}]}}
    return {
        "static_resources": {
            "listeners": [{
                "name": "bench",
                "address": address(port),
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                 "http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "bench",
                        "route_config": {"virtual_hosts": [{
                            "name": "bench", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"}, **route}],
                        }]},
                        "http_filters": filters + ([FAULT_RESPONDS] if to_cluster else []) + [{
                            "name": "envoy.filters.http.router",
                            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                        }],
                    },
                }]}],
            }],
            "clusters": [shipped_shim_cluster(shim_port, http2=name in H2_TO_SHIM), upstream],
        },
        "admin": {"address": address(admin_port)},
    }


# --------------------------------------------------------------------------- processes

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, predicate, timeout=30.0, process=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process is not None and process.poll() is not None:
            return False
        try:
            if predicate():
                return True
        except OSError:
            pass
        time.sleep(0.05)
    print(f"bench: {what} not ready after {timeout}s", file=sys.stderr)
    return False


def accepts(port):
    """Whether something listens on `port` (raises OSError when not: see wait_until)."""
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def http_get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


class Processes:
    """Children started here, stopped by pid (each one we started, nothing else)."""

    def __init__(self):
        self.children = []

    def start(self, args, log, core=None, env=None):
        if core is not None:
            args = ["taskset", "-c", core] + args  # taskset execs: the pid is the program's
        out = open(log, "w")
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 cwd=ROOT, env=env)
        self.children.append(child)
        return child

    def stop(self, child):
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if child in self.children:
            self.children.remove(child)

    def stop_all(self):
        for child in list(reversed(self.children)):
            self.stop(child)


def cpu_ns(pid):
    """On-CPU nanoseconds of every thread of `pid` so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    return total


def pin(pid, core):
    subprocess.run(["taskset", "-a", "-p", "-c", core, str(pid)], check=True, stdout=subprocess.DEVNULL)


class Redis:
    def __init__(self, procs):
        self.port = free_port()
        self.process = procs.start(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                    "--save", "", "--appendonly", "no"], OUT / "redis.log", core=LOAD_CORE)
        if not wait_until("Redis", lambda: self.cli("PING") == "PONG", 10, self.process):
            sys.exit("bench: Redis did not start; see bench/out/redis.log")

    def cli(self, *args):
        result = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True)
        return result.stdout.strip()

    def pids(self):
        return [self.process.pid]

    def flush(self):
        self.cli("FLUSHALL")

    def commands(self):
        """Calls per command since start, without the ones this harness sends."""
        ours = {"info", "ping", "flushall", "config", "memory", "script", "function", "scan", "command", "dbsize"}
        calls = {}
        for line in self.cli("INFO", "commandstats").splitlines():
            m = re.match(r"cmdstat_([^:]+):calls=(\d+)", line)
            if m and m.group(1).split("|")[0] not in ours:
                calls[m.group(1)] = int(m.group(2))
        return calls


class RedisCluster:
    """Three masters, no replicas, on the load core, as one Redis Cluster."""

    def __init__(self, procs, masters=3, replicas=0):
        self.nodes = []
        # Distinct: free_port() can hand out a port twice once its socket is closed.
        ports = []
        while len(ports) < 2 * masters * (1 + replicas):
            port = free_port()
            if port not in ports:
                ports.append(port)
        for i in range(masters * (1 + replicas)):
            port, bus = ports[2 * i], ports[2 * i + 1]
            config = OUT / f"redis-cluster-{i}-nodes.conf"
            config.unlink(missing_ok=True)
            process = procs.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", str(OUT), "--dbfilename", f"dump-{port}.rdb", "--cluster-enabled", "yes", "--cluster-port", str(bus),
                                   "--cluster-config-file", str(config), "--cluster-node-timeout", "1000"],
                                  OUT / f"redis-cluster-{i}.log", core=LOAD_CORE)
            self.nodes.append(Redis.__new__(Redis))
            self.nodes[-1].port, self.nodes[-1].process = port, process
        for node in self.nodes:
            if not wait_until("Redis Cluster node", lambda: node.cli("PING") == "PONG", 10, node.process):
                sys.exit("bench: a Redis Cluster node did not start; see bench/out/redis-cluster-*.log")
        created = subprocess.run(["redis-cli", "--cluster", "create", *self.addresses(), "--cluster-replicas", str(replicas),
                                  "--cluster-yes"], capture_output=True, text=True)
        if created.returncode != 0:
            sys.exit(f"bench: redis-cli --cluster create failed: {created.stdout[-300:]}")
        for node in self.nodes:
            if not wait_until("cluster_state:ok", lambda: "cluster_state:ok" in node.cli("CLUSTER", "INFO"), 30):
                sys.exit("bench: the Redis Cluster did not become ready")
            # A replica's first sync, or its promotion would start from nothing.
            if node.cli("ROLE").startswith("slave") and not wait_until(
                    "replica in sync", lambda: "master_link_status:up" in node.cli("INFO", "replication"), 30):
                sys.exit("bench: a Redis Cluster replica did not sync with its master")

    def addresses(self):
        return [f"127.0.0.1:{node.port}" for node in self.nodes]

    def pids(self):
        return [node.process.pid for node in self.nodes]

    def flush(self):
        for node in self.nodes:
            node.cli("FLUSHALL")

    def commands(self):
        calls = {}
        for node in self.nodes:
            for name, count in node.commands().items():
                calls[name] = calls.get(name, 0) + count
        return calls


class Shim:
    def __init__(self, procs, redis_port, workers=None, cluster=None, extra=()):
        self.port = free_port()
        env = dict(os.environ, RUST_LOG="warn")
        if workers:
            env["TOKIO_WORKER_THREADS"] = str(workers)  # read by tokio's multi-thread runtime
        redis = (["--redis-mode", "cluster", "--redis-url", ",".join(f"redis://{a}" for a in cluster.addresses())]
                 if cluster else ["--redis-url", f"redis://127.0.0.1:{redis_port}"])
        self.process = procs.start([SHIM_BIN, "--listen", f"127.0.0.1:{self.port}", *redis, *extra],
                                   OUT / ("shim-cluster.log" if cluster else "shim.log"), core=LOAD_CORE, env=env)
        if not wait_until("shim", lambda: "ok" in http_get(f"http://127.0.0.1:{self.port}/healthz"),
                          10, self.process):
            sys.exit("bench: the shim did not start; see bench/out/shim.log")


class Envoy:
    def __init__(self, procs, name, filters, shim_port, shape=None):
        """`shape`, when given, changes the bootstrap (a dict) before Envoy reads it."""
        self.procs = procs
        self.port, self.admin = free_port(), free_port()
        config = OUT / f"envoy-{name}.json"
        bootstrap = envoy_config(self.port, self.admin, shim_port, filters, name)
        if shape:
            shape(bootstrap)
        config.write_text(json.dumps(bootstrap, indent=1))
        self.log = OUT / f"envoy-{name}.log"
        # Python stays Envoy's parent for its whole life (Envoy stops when its parent does).
        self.process = procs.start([ENVOY_BIN, "-c", str(config.relative_to(ROOT)), "--concurrency", "1",
                                    "--use-dynamic-base-id", "--log-level", "warn",
                                    "--component-log-level", "wasm:info"], self.log, core=ENVOY_CORE)
        self.ready = wait_until(f"Envoy ({name})",
                                lambda: http_get(f"http://127.0.0.1:{self.admin}/ready").strip() == "LIVE",
                                30, self.process)

    def why_not_ready(self):
        text = self.log.read_text(errors="replace")
        for line in text.splitlines():
            if "invalid plugin configuration" in line or "Unable to create Wasm" in line:
                return re.sub(r"^.*?\] ", "", line).strip()
        return (text.strip().splitlines() or ["Envoy did not start"])[-1][:200]

    def stats(self):
        """Every counter, as name -> value."""
        counters = {}
        for line in http_get(f"http://127.0.0.1:{self.admin}/stats").splitlines():
            name, _, value = line.partition(": ")
            if value.isdigit():
                counters[name] = int(value)
        return counters

    def stop(self):
        self.procs.stop(self.process)


# --------------------------------------------------------------------------- load

def wrk(url, seconds, connections=32, headers=(), script=None):
    args = ["taskset", "-c", LOAD_CORE, "wrk", "-t1", f"-c{connections}", f"-d{seconds}s"]
    for header in headers:
        args += ["-H", header]
    if script:
        args += ["-s", str(script)]
    text = subprocess.run(args + [url], capture_output=True, text=True, timeout=seconds + 30).stdout
    m = re.search(r"(\d+) requests in", text)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors = re.search(r"Socket errors: (.*)", text)
    return {
        "requests": int(m.group(1)) if m else 0,
        "rps": float(rps.group(1)) if rps else 0.0,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": errors.group(1).strip() if errors else "",
    }


def oha_fixed_rate(url, seconds, rate, headers=(), connections=16):
    args = ["taskset", "-c", LOAD_CORE, "oha", "--no-tui", "--output-format", "json", "-z", f"{seconds}s",
            "-q", str(rate), "-c", str(connections), "--latency-correction"]
    for header in headers:
        args += ["-H", header]
    text = subprocess.run(args + [url], capture_output=True, text=True, timeout=seconds + 30).stdout
    report = json.loads(text)
    percentiles = {k: v * 1000 for k, v in (report.get("latencyPercentiles") or {}).items() if v is not None}
    return {
        "rps": report["summary"].get("requestsPerSec"),
        "success_rate": report["summary"].get("successRate"),
        "latency_ms": percentiles,
        "status": report.get("statusCodeDistribution", {}),
    }


# --------------------------------------------------------------------------- measuring

class Snapshot:
    def __init__(self, envoy, shim, redis):
        self.envoy_cpu = cpu_ns(envoy.process.pid)
        self.shim_cpu = cpu_ns(shim.process.pid)
        self.redis_cpu = sum(cpu_ns(pid) for pid in redis.pids())
        self.stats = envoy.stats()
        self.redis = redis.commands()


def delta(before, after):
    def d(name):
        return after.stats.get(name, 0) - before.stats.get(name, 0)

    requests = d("http.bench.downstream_rq_total")
    shim_calls = d("cluster.ratelimit_shim.upstream_rq_total")
    commands = {k: v - before.redis.get(k, 0) for k, v in after.redis.items() if v != before.redis.get(k, 0)}
    scripts = sum(v for k, v in commands.items() if k.startswith(("eval", "fcall")))
    wasm = {}
    for name in after.stats:
        # The Wasm filter's stats, or the dynamic module's (the same names, another prefix).
        for prefix in ("wasmcustom.ratelimit.", "dynamicmodulescustom.ratelimit."):
            if name.startswith(prefix) and d(name):
                wasm[name.removeprefix(prefix)] = wasm.get(name.removeprefix(prefix), 0) + d(name)
    # Checks sent to the shim (a call may carry several), from the filter's own counters.
    # (`shim_calls` is the counter's name in builds before the calls were batched.)
    checks = sum(v for k, v in wasm.items() if k.endswith((".shim_checks", ".shim_calls")))
    per = lambda x, n: x / n if n else None
    return {
        "requests": requests,
        "envoy_cpu_us_per_req": per((after.envoy_cpu - before.envoy_cpu) / 1000, requests),
        "shim_calls": shim_calls,
        "shim_calls_per_req": per(shim_calls, requests),
        "redis_commands_per_req": per(sum(commands.values()), requests),
        "redis_scripts_per_req": per(scripts, requests),
        "redis_commands": commands,
        "shim_checks": checks,
        "checks_per_call": per(checks, shim_calls),
        "shim_cpu_us_per_check": per((after.shim_cpu - before.shim_cpu) / 1000, checks),
        "redis_cpu_us_per_check": per((after.redis_cpu - before.redis_cpu) / 1000, checks),
        "shim_cpu_us_per_req": per((after.shim_cpu - before.shim_cpu) / 1000, requests),
        "redis_cpu_us_per_req": per((after.redis_cpu - before.redis_cpu) / 1000, requests),
        "filter_counters": wasm,
        "shim_errors": sum(v for k, v in wasm.items() if k.endswith(("shim_errors", "shim_timeouts"))),
        "failed_open": sum(v for k, v in wasm.items() if k.endswith("failed_open")),
    }


def measure_config(procs, name, filters, shim, redis, args):
    redis.flush()
    envoy = Envoy(procs, name, filters, shim.port)
    if not envoy.ready:
        reason = envoy.why_not_ready()
        envoy.stop()
        print(f"  {name}: SKIPPED ({reason})", flush=True)
        return {"skipped": reason}
    try:
        url = f"http://127.0.0.1:{envoy.port}/"
        headers = [f"x-api-key: {API_KEY}"]
        wrk(url, 1, headers=headers)  # warm-up: connections, JIT, the abusive key's bucket
        before = Snapshot(envoy, shim, redis)
        closed = wrk(url, args.duration, headers=headers)
        closed.update(delta(before, Snapshot(envoy, shim, redis)))
        before = Snapshot(envoy, shim, redis)
        fixed = oha_fixed_rate(url, args.duration, args.rate, headers=headers)
        fixed.update(delta(before, Snapshot(envoy, shim, redis)))
    finally:
        envoy.stop()
    problems = []
    for phase in (closed, fixed):
        if phase["shim_errors"] or phase["failed_open"]:
            problems.append(f"{phase['shim_errors']} shim errors/timeouts, {phase['failed_open']} failed open")
    result = {"closed": closed, "fixed": fixed}
    if problems:
        result["invalid"] = "; ".join(problems) + " (see bench/out/shim.log)"
    p = fixed["latency_ms"]
    print(f"  {name:17} {closed['rps']:9.0f} req/s  envoy {closed['envoy_cpu_us_per_req'] or 0:6.1f} us/req  "
          f"p50 {p.get('p50', 0):.3f} ms  p99 {p.get('p99', 0):.3f} ms  "
          f"shim calls/req {closed['shim_calls_per_req'] or 0:.3f}"
          + (f"  INVALID: {result['invalid']}" if problems else ""), flush=True)
    return result


def round_trip_ms(redis):
    """p50 of one loopback round trip from Envoy's core to the load core (redis-benchmark
    PING, one client, back to back): the least a hop costs on this machine. An exact check
    makes two more than the baseline (Envoy to the shim, the shim to Redis)."""
    text = subprocess.run(["taskset", "-c", ENVOY_CORE, "redis-benchmark", "-p", str(redis.port), "-c", "1",
                           "-n", "20000", "-t", "ping", "-q"], capture_output=True, text=True, timeout=60).stdout
    p50 = re.findall(r"PING_MBULK: .*?p50=([\d.]+) msec", text)
    return float(p50[-1]) if p50 else None


# --------------------------------------------------------------------------- the shim's ceiling

def check_function(redis):
    """The name of the shim's check function (check.lua), in the library the shim loaded."""
    found = re.search(r"^(ratelimit_[0-9a-f]+_check)$", redis.cli("FUNCTION", "LIST"), re.M)
    if not found:
        raise SystemExit("bench: the shim loaded no function library into Redis")
    return found.group(1)


def script_args(key):
    """FCALL arguments of one admitted token-bucket check, after check.lua's header."""
    header = (SCRIPTS / "check.lua").read_text()
    if re.search(r"ARGV\[1\]\s+mode", header) and re.search(r"ARGV\[1\+i\]\s+check i's parameters", header):
        # mode, then one value: algorithm, limit, period (ms), cost, lease, shadow, calendar
        return ["1", key, "charge", f"token_bucket {ADMIT_ALL} 1000 1 0 0 "]
    raise SystemExit("bench: check.lua's ARGV layout changed; update script_args() in bench/run.py")


def ceiling(procs, shim, redis, args):
    """Checks/s through the shim vs FCALL/s straight into Redis, Redis alone on core 0."""
    pin(redis.process.pid, ENVOY_CORE)
    try:
        redis.cli("FLUSHALL")
        before = (cpu_ns(shim.process.pid), cpu_ns(redis.process.pid), redis.commands())
        through = wrk(f"http://127.0.0.1:{shim.port}/v1/check", args.duration, script=ROOT / "bench" / "shim-check.lua")
        after = (cpu_ns(shim.process.pid), cpu_ns(redis.process.pid), redis.commands())
        checks = through["requests"]
        through_result = {
            "checks_per_s": through["rps"], "non_2xx": through["non_2xx"],
            "shim_cpu_us_per_check": (after[0] - before[0]) / 1000 / checks if checks else None,
            "redis_cpu_us_per_check": (after[1] - before[1]) / 1000 / checks if checks else None,
        }
        function = check_function(redis)
        raw = {}
        for pipeline in (1, 16):
            r_before = cpu_ns(redis.process.pid)
            t0 = time.time()
            out = subprocess.run(["taskset", "-c", LOAD_CORE, "redis-benchmark", "-p", str(redis.port), "-c", "32",
                                  "-n", str(args.fcall_n * pipeline), "-P", str(pipeline), "--csv",
                                  "FCALL", function, *script_args("rl:bench:{ceiling-raw}")],
                                 capture_output=True, text=True, timeout=120)
            elapsed = time.time() - t0
            rows = [line for line in out.stdout.splitlines() if line.startswith('"FCALL')]
            if not rows:
                print(f"  redis-benchmark failed: {(out.stdout + out.stderr).strip()[-300:]}", file=sys.stderr)
            rps = float(rows[-1].split('","')[1]) if rows else 0.0
            raw[f"P{pipeline}"] = {
                "fcall_per_s": rps,
                "redis_cpu_us_per_check": (cpu_ns(redis.process.pid) - r_before) / 1000 / (args.fcall_n * pipeline),
                "seconds": round(elapsed, 1),
            }
        result = {"through_shim": through_result, "redis_benchmark": raw,
                  "ratio": through["rps"] / raw["P1"]["fcall_per_s"] if raw["P1"]["fcall_per_s"] else None}
    finally:
        pin(redis.process.pid, LOAD_CORE)
    print(f"  shim {through_result['checks_per_s']:.0f} checks/s vs FCALL {raw['P1']['fcall_per_s']:.0f}/s "
          f"(pipelined x16: {raw['P16']['fcall_per_s']:.0f}/s): {result['ratio'] or 0:.2f}", flush=True)
    return result


# --------------------------------------------------------------------------- bytes per key

def memory_per_key(shim, redis, keys=200):
    """Redis bytes per counter for each algorithm: checks on `keys` fresh keys through the shim."""
    results = {}
    connection = http.client.HTTPConnection("127.0.0.1", shim.port, timeout=5)
    plans = [("token_bucket", 100, 1), ("fixed_window", 100, 1), ("sliding_window_counter", 100, 1),
             ("sliding_window_log", 100, 1), ("sliding_window_log", 100, 100)]
    for algorithm, limit, checks_per_key in plans:
        label = algorithm if checks_per_key == 1 else f"{algorithm} ({checks_per_key} entries)"
        n = keys if checks_per_key == 1 else keys // 10
        redis.cli("FLUSHALL")
        used_before = int(re.search(r"used_memory:(\d+)", redis.cli("INFO", "memory")).group(1))
        status = None
        for i in range(n):
            # Shaped like the filter's keys (src/keys.rs): 96 bits of SHA-256 in hex.
            digest = hashlib.sha256(f"{algorithm}-{i}".encode()).hexdigest()[:24]
            body = json.dumps({"checks": [{"key": f"per-api-key:{{{digest}}}", "algorithm": algorithm,
                                           "limit": limit, "period_ms": 86_400_000}]})
            for _ in range(checks_per_key):
                connection.request("POST", "/v1/check", body, {"content-type": "application/json"})
                response = connection.getresponse()
                reply = response.read().decode()
                status = response.status
                if status != 200:
                    break
            if status != 200:
                break
        if status != 200:
            results[label] = {"unsupported": f"shim answered {status}: {reply[:160]}"}
            continue
        used_after = int(re.search(r"used_memory:(\d+)", redis.cli("INFO", "memory")).group(1))
        names = [k for k in redis.cli("--scan", "--pattern", "*").splitlines() if k]
        usage = sum(int(redis.cli("MEMORY", "USAGE", k, "SAMPLES", "0") or 0) for k in names)
        results[label] = {
            "counters": n, "redis_keys": len(names),
            "memory_usage_bytes_per_counter": usage / n,
            "used_memory_bytes_per_counter": (used_after - used_before) / n,
            "key_example": names[0] if names else None,
        }
    connection.close()
    for label, r in results.items():
        if "unsupported" in r:
            print(f"  {label:34} {r['unsupported']}")
        else:
            print(f"  {label:34} MEMORY USAGE {r['memory_usage_bytes_per_counter']:.0f} B/counter, "
                  f"used_memory {r['used_memory_bytes_per_counter']:.0f} B/counter ({r['redis_keys']} keys)")
    return results


# --------------------------------------------------------------------------- table

def spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"


def table(results):
    runs = results["runs"]
    lines = [
        "| configuration | max req/s | × baseline | Envoy µs CPU/req | added µs/req | p50 ms @2k/s | p99 ms @2k/s "
        "| added p50 / p99 ms | shim calls/req | Redis cmds/req | shim µs/check | Redis µs/check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    k = lambda v: f"{v / 1000:.1f}k"
    f1 = lambda v: f"{v:.1f}"
    f2 = lambda v: f"{v:.2f}"
    f3 = lambda v: f"{v:.3f}"
    described = results.get("configs") or [(n, d) for n, d, _ in CONFIGS + EXPERIMENTS]
    for name, description in described:
        if not any(name in run for run in runs):
            continue
        rows = [run.get(name, {}) for run in runs]
        base = "baseline_cluster" if name.endswith("_cluster") else "baseline"
        ok = [(r, run[base]) for r, run in zip(rows, runs)
              if r and "skipped" not in r and "invalid" not in r and "closed" in run.get(base, {})]
        if not ok:
            reason = next((f"skipped: {r['skipped']}" for r in rows if r.get("skipped")), None) or \
                next((f"invalid: {r['invalid']}" for r in rows if r.get("invalid")), "not measured")
            lines.append(f"| {description} | {reason} |" + " |" * 10)
            continue
        c = lambda key, phase="closed": [r[phase][key] for r, _ in ok]
        ratio = [r["closed"]["rps"] / b["closed"]["rps"] for r, b in ok]
        added = [r["closed"]["envoy_cpu_us_per_req"] - b["closed"]["envoy_cpu_us_per_req"] for r, b in ok]
        p50 = [r["fixed"]["latency_ms"].get("p50") for r, _ in ok]
        p99 = [r["fixed"]["latency_ms"].get("p99") for r, _ in ok]
        a50 = [r["fixed"]["latency_ms"]["p50"] - b["fixed"]["latency_ms"]["p50"] for r, b in ok]
        a99 = [r["fixed"]["latency_ms"]["p99"] - b["fixed"]["latency_ms"]["p99"] for r, b in ok]
        invalid = " ⚠" if len(ok) < len(runs) else ""
        lines.append("| " + " | ".join([
            description + invalid, spread(c("rps"), k), spread(ratio, f2),
            spread(c("envoy_cpu_us_per_req"), f1), spread(added, f1),
            spread(p50, f3), spread(p99, f3), f"{spread(a50, f2)} / {spread(a99, f2)}",
            spread(c("shim_calls_per_req"), f3), spread(c("redis_commands_per_req"), f2),
            spread(c("shim_cpu_us_per_check"), f1), spread(c("redis_cpu_us_per_check"), f1),
        ]) + " |")
    lines.append("")
    lines.append(f"Ranges are min–max over {len(runs)} runs; ratios and added costs are against the "
                 "baseline of the same run and topology (rows \"route to a cluster\" against that baseline). ⚠: some runs left out (skipped, or the shim failed checks: see results.json).")
    trips = [t for t in results.get("round_trip_ms", []) if t is not None]
    if trips:
        lines += ["", f"One loopback round trip between the two cores (redis-benchmark PING, one client, "
                      f"from Envoy's core to Redis's): p50 {spread(trips, f3)} ms. An exact check makes two "
                      f"more than the baseline (Envoy to the shim, the shim to Redis), so its added p50 "
                      f"cannot fall below about {spread([2 * t for t in trips], f2)} ms on this machine."]
    ceilings = results.get("ceiling", [])
    if ceilings:
        lines += ["", "| shim vs raw Redis | checks/s | shim µs CPU/check | Redis µs CPU/check |", "|---|---|---|---|"]
        lines.append(f"| through the shim (wrk, 32 conns) | {spread([c['through_shim']['checks_per_s'] for c in ceilings], k)} "
                     f"| {spread([c['through_shim']['shim_cpu_us_per_check'] for c in ceilings], f1)} "
                     f"| {spread([c['through_shim']['redis_cpu_us_per_check'] for c in ceilings], f1)} |")
        for p in ("P1", "P16"):
            lines.append(f"| redis-benchmark FCALL -c 32 -P {p[1:]} "
                         f"| {spread([c['redis_benchmark'][p]['fcall_per_s'] for c in ceilings], k)} | – "
                         f"| {spread([c['redis_benchmark'][p]['redis_cpu_us_per_check'] for c in ceilings], f1)} |")
        lines.append(f"| **shim / FCALL (-P 1)** | {spread([c['ratio'] for c in ceilings], f2)} | | |")
    memory = results.get("memory")
    if memory:
        lines += ["", "| algorithm | Redis keys per counter | MEMORY USAGE B/counter | used_memory B/counter |", "|---|---|---|---|"]
        for label, r in memory.items():
            if "unsupported" in r:
                lines.append(f"| {label} | not supported by this shim yet | | |")
            else:
                lines.append(f"| {label} | {r['redis_keys'] / r['counters']:.0f} | {r['memory_usage_bytes_per_counter']:.0f} "
                             f"| {r['used_memory_bytes_per_counter']:.0f} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- profile

def profile(args, config):
    """perf record (call graphs) of Envoy, the shim and Redis under closed-loop load."""
    name, _, filters = config
    OUT.mkdir(parents=True, exist_ok=True)
    procs = Processes()
    try:
        redis = Redis(procs)
        shim = Shim(procs, redis.port)
        envoy = Envoy(procs, name, filters, shim.port)
        if not envoy.ready:
            sys.exit(f"bench: {name}: {envoy.why_not_ready()}")
        url = f"http://127.0.0.1:{envoy.port}/"
        wrk(url, 1, headers=[f"x-api-key: {API_KEY}"])
        recorders = {}
        for who, pid in (("envoy", envoy.process.pid), ("shim", shim.process.pid), ("redis", redis.process.pid)):
            data = OUT / f"perf-{name}-{who}.data"
            recorders[who] = (data, subprocess.Popen(
                ["perf", "record", "-q", "-F", "999", "-g", "-o", str(data), "-p", str(pid),
                 "--", "sleep", str(args.duration)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        before = Snapshot(envoy, shim, redis)
        closed = wrk(url, args.duration, headers=[f"x-api-key: {API_KEY}"])
        closed.update(delta(before, Snapshot(envoy, shim, redis)))
        for who, (data, recorder) in recorders.items():
            recorder.wait(timeout=60)
            for sort in ("dso", "dso,sym"):
                report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", sort,
                                         "--stdio", "-g", "none", "--percent-limit", "0.7"],
                                        capture_output=True, text=True).stdout
                suffix = sort.replace(",", "-")
                (OUT / f"perf-{name}-{who}-{suffix}.txt").write_text(report)
        envoy.stop()
    finally:
        procs.stop_all()
    print(json.dumps({k: v for k, v in closed.items() if k != "redis_commands"}, indent=1))
    print(f"bench: perf reports in bench/out/perf-{name}-*.txt")


# --------------------------------------------------------------------------- paired

def config_named(name):
    """The configuration (name, description, filters) called `name`, or a clear exit."""
    found = next((c for c in CONFIGS + EXPERIMENTS if c[0] == name), None)
    if found is None:
        sys.exit(f"bench: no configuration named {name}")
    return found


def rows_with_baseline(spec):
    """`baseline`, then the comma-separated rows of `spec`; and each one's filters."""
    names = ["baseline"] + [n for n in spec.split(",") if n != "baseline"]
    return names, {n: config_named(n)[2] for n in names}


def rotated(names, cycle):
    """`names` in the order of this cycle: each row goes first in turn."""
    first = cycle % len(names)
    return names[first:] + names[:first]


def paired(args):
    """Envoy CPU per request of several configurations served by ONE Envoy, one listener
    each, in short alternating closed-loop phases: the machine's drift, which moves whole
    runs by 20-50% here, hits every configuration of a cycle alike. Added cost = the
    configuration's CPU per request minus the baseline's of the same cycle."""
    names, chosen = rows_with_baseline(args.paired)
    unfit = [n for n in names if n.endswith("_cluster") or n == SHIM_HOP]
    if unfit:
        sys.exit(f"bench: --paired takes direct-response rows only; not {', '.join(unfit)}")
    OUT.mkdir(parents=True, exist_ok=True)
    procs = Processes()
    try:
        redis = Redis(procs)
        shim = Shim(procs, redis.port, args.shim_workers)
        ports = {n: free_port() for n in names}
        admin = free_port()
        config = envoy_config(0, admin, shim.port, [], "")
        template = config["static_resources"]["listeners"][0]
        listeners = []
        for n in names:
            listener = json.loads(json.dumps(template))
            listener["name"] = n
            listener["address"] = address(ports[n])
            hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
            hcm["stat_prefix"] = n
            filters = json.loads(json.dumps(chosen[n]))
            for f in filters:
                vm = f.get("typed_config", {}).get("config", {}).get("vm_config")
                if vm is not None:
                    vm["vm_id"] = n  # a VM each: no shared data or queue between configurations
            hcm["http_filters"] = filters + hcm["http_filters"]
            listeners.append(listener)
        config["static_resources"]["listeners"] = listeners
        path = OUT / "envoy-paired.json"
        path.write_text(json.dumps(config, indent=1))
        log = OUT / "envoy-paired.log"
        envoy = procs.start([ENVOY_BIN, "-c", str(path.relative_to(ROOT)), "--concurrency", "1",
                             "--use-dynamic-base-id", "--log-level", "warn"], log, core=ENVOY_CORE)
        if not wait_until("Envoy (paired)", lambda: http_get(f"http://127.0.0.1:{admin}/ready").strip() == "LIVE",
                          30, envoy):
            sys.exit(f"bench: Envoy did not start; see {log}")
        headers = [f"x-api-key: {API_KEY}"]
        for n in names:
            wrk(f"http://127.0.0.1:{ports[n]}/", 1, args.connections, headers)  # warm-up: JIT, connections
        cycles, throughput, busy = [], {}, {}
        for cycle in range(args.cycles):
            per_request = {}
            for n in rotated(names, cycle):
                before, started = cpu_ns(envoy.pid), time.monotonic()
                served = wrk(f"http://127.0.0.1:{ports[n]}/", args.phase, args.connections, headers)
                used_ns = cpu_ns(envoy.pid) - before
                per_request[n] = used_ns / 1000 / served["requests"]
                throughput.setdefault(n, []).append(served["rps"])
                # Whether the phase was bound by Envoy's core (near 1.0) or by the round trip.
                busy.setdefault(n, []).append(used_ns / 1e9 / (time.monotonic() - started))
            cycles.append(per_request)
            print(f"  cycle {cycle + 1}: " + "  ".join(f"{n} {per_request[n]:.1f}" for n in names), flush=True)
    finally:
        procs.stop_all()
    median = statistics.median
    added = {n: [c[n] - c["baseline"] for c in cycles] for n in names[1:]}
    lines = [f"One Envoy, a listener per configuration, {args.cycles} cycles of {args.phase} s closed-loop "
             f"phases ({args.connections} connections) in rotating order (Envoy µs CPU per request; added = minus "
             "the baseline of the same cycle; Envoy busy = its CPU seconds per second of the phase):",
             "", "| configuration | µs/req, median | added µs/req, median (min–max) | × baseline req/s, median "
             "| Envoy busy, median |",
             "|---|---|---|---|---|", f"| baseline | {median([c['baseline'] for c in cycles]):.1f} | – | 1.00 "
             f"| {median(busy['baseline']):.2f} |"]
    share = {n: [r / b for r, b in zip(throughput[n], throughput["baseline"]) if b] for n in names[1:]}
    for n in names[1:]:
        lines.append(f"| {n} | {median([c[n] for c in cycles]):.1f} | {median(added[n]):.1f} "
                     f"({min(added[n]):.1f}–{max(added[n]):.1f}) | {median(share[n]):.2f} | {median(busy[n]):.2f} |")
    lines.append("")
    for reference, label in (("wasm_passthrough", "the pass-through's"), ("probe_floor", "the floor probe's")):
        if reference not in added:
            continue
        for n in names[1:]:
            if n not in (reference, "wasm_passthrough"):
                ratios = [a / f for a, f in zip(added[n], added[reference]) if f > 0]
                lines.append(f"- {n}: added cost / {label}, per cycle: median {median(ratios):.2f} "
                             f"(of {len(ratios)} cycles; ratio of medians "
                             f"{median(added[n]) / median(added[reference]):.2f})")
    text = "\n".join(lines)
    (OUT / "paired.md").write_text(text + "\n")
    print(text)


def alternating_latency(args):
    """Latency at --rate of several rows, each its own Envoy (all started at once, pinned to
    the same core, idle when not measured), in short fixed-rate phases rotating through
    them: a row's added p50 and p99 are taken against the baseline of the same cycle."""
    names, chosen = rows_with_baseline(args.alternate)
    OUT.mkdir(parents=True, exist_ok=True)
    procs = Processes()
    latencies = {n: [] for n in names}
    try:
        redis = Redis(procs)
        shim = Shim(procs, redis.port, args.shim_workers)
        envoys = {n: Envoy(procs, n, chosen[n], shim.port) for n in names}
        for n, envoy in envoys.items():
            if not envoy.ready:
                sys.exit(f"bench: {n}: {envoy.why_not_ready()}")
        headers = [f"x-api-key: {API_KEY}"]
        url = lambda n: f"http://127.0.0.1:{envoys[n].port}/"
        for n in names:
            oha_fixed_rate(url(n), 1, args.rate, headers=headers)  # warm-up at the same rate
        for cycle in range(args.cycles):
            for n in rotated(names, cycle):
                latencies[n].append(oha_fixed_rate(url(n), args.phase, args.rate, headers=headers)["latency_ms"])
            print(f"  cycle {cycle + 1}: " + "  ".join(
                f"{n} {latencies[n][-1]['p50']:.3f}/{latencies[n][-1]['p99']:.3f}" for n in names), flush=True)
    finally:
        procs.stop_all()
    median = statistics.median
    lines = [f"{len(names)} Envoys, {args.cycles} cycles of {args.phase} s at {args.rate} req/s in rotating order "
             "(ms; added = minus the baseline of the same cycle):", "",
             "| configuration | p50, median | added p50, median (min–max) | p99, median | added p99, median (min–max) |",
             "|---|---|---|---|---|"]
    for n in names:
        p50 = [c["p50"] for c in latencies[n]]
        p99 = [c["p99"] for c in latencies[n]]
        a50 = [c["p50"] - b["p50"] for c, b in zip(latencies[n], latencies["baseline"])]
        a99 = [c["p99"] - b["p99"] for c, b in zip(latencies[n], latencies["baseline"])]
        lines.append(f"| {n} | {median(p50):.3f} | {median(a50):.3f} ({min(a50):.3f}–{max(a50):.3f}) "
                     f"| {median(p99):.3f} | {median(a99):.3f} ({min(a99):.3f}–{max(a99):.3f}) |")
    text = "\n".join(lines)
    (OUT / "alternate.md").write_text(text + "\n")
    print(text)


# --------------------------------------------------------------------------- where the time goes

def envoy_histograms(envoy, names):
    """p50/p90/p99 (cumulative since start) of the filter's histograms `ratelimit.<name>`."""
    text = http_get(f"http://127.0.0.1:{envoy.admin}/stats?format=json&filter=ratelimit", timeout=5)
    found = {}
    for block in json.loads(text).get("stats", []):
        histograms = block.get("histograms")
        if not histograms:
            continue
        quantiles = histograms["supported_quantiles"]
        for h in histograms["computed_quantiles"]:
            short = h["name"].rsplit(".", 1)[-1]
            if short in names:
                at = {q: v.get("cumulative") for q, v in zip(quantiles, h["values"])}
                found[short] = {"p50": at.get(50), "p90": at.get(90), "p99": at.get(99)}
    return found


def shim_histogram(metrics_text, name):
    """Buckets (le -> cumulative count), count and sum of one of the shim's histograms."""
    buckets, count, total = {}, 0, 0.0
    for line in metrics_text.splitlines():
        m = re.match(rf'{name}_bucket{{le="([^"]+)"}} (\d+)', line)
        if m:
            buckets[float(m.group(1)) if m.group(1) != "+Inf" else float("inf")] = int(m.group(2))
        elif line.startswith(f"{name}_count "):
            count = int(line.split()[1])
        elif line.startswith(f"{name}_sum "):
            total = float(line.split()[1])
    return buckets, count, total


def histogram_summary(before, after):
    """Mean and the bucket bound holding the median, in µs, between two snapshots."""
    (b0, c0, s0), (b1, c1, s1) = before, after
    n = c1 - c0
    if not n:
        return {"mean": None, "p50_at_most": None}
    median = next(le for le in sorted(b1) if b1[le] - b0.get(le, 0) >= n / 2)
    return {"mean": (s1 - s0) / n * 1e6, "p50_at_most": median * 1e6}


def where_time_goes(args):
    """One Envoy at --rate req/s on an exact row (--where ROW, rl_global by default), timed along
    the path: queued in the worker, the call's round trip, the shim's answer, its Redis call,
    Redis's own run."""
    OUT.mkdir(parents=True, exist_ok=True)
    procs = Processes()
    try:
        redis = Redis(procs)
        shim = Shim(procs, redis.port, args.shim_workers)
        baseline = Envoy(procs, "baseline", [], shim.port)
        url = f"http://127.0.0.1:{baseline.port}/"
        oha_fixed_rate(url, 1, args.rate)
        base = oha_fixed_rate(url, args.duration, args.rate)
        baseline.stop()
        name, _, filters = config_named(args.where)
        envoy = Envoy(procs, name, filters, shim.port)
        if not envoy.ready:
            sys.exit(f"bench: {name}: {envoy.why_not_ready()}")
        url = f"http://127.0.0.1:{envoy.port}/"
        headers = [f"x-api-key: {API_KEY}"]
        oha_fixed_rate(url, 1, args.rate, headers=headers)  # warm-up at the same rate
        metrics = lambda: http_get(f"http://127.0.0.1:{shim.port}/metrics", timeout=5)
        fcall = lambda: re.search(r"cmdstat_fcall:calls=(\d+),usec=(\d+)", redis.cli("INFO", "commandstats"))
        shim_before, redis_before = metrics(), fcall()
        measured = oha_fixed_rate(url, args.duration, args.rate, headers=headers)
        shim_after, redis_after = metrics(), fcall()
        filter_histograms = envoy_histograms(envoy, {"queued_us", "shim_call_us", "shim_batch_size"})
        envoy.stop()
    finally:
        procs.stop_all()
    summary = {
        name: histogram_summary(shim_histogram(shim_before, name), shim_histogram(shim_after, name))
        for name in ("rlshim_check_duration_seconds", "rlshim_redis_call_duration_seconds")
    }
    calls = int(redis_after.group(1)) - int(redis_before.group(1))
    redis_us = (int(redis_after.group(2)) - int(redis_before.group(2))) / calls if calls else None
    ms = lambda r, q: r["latency_ms"].get(q)
    f = lambda v, fmt="{:.0f}": "–" if v is None else fmt.format(v)
    rows = [
        ("request, end to end (oha), ms", *(f(ms(measured, q), "{:.3f}") for q in ("p50", "p90", "p99")), "–"),
        ("baseline (no filter), same minute, ms", *(f(ms(base, q), "{:.3f}") for q in ("p50", "p90", "p99")), "–"),
    ]
    for key, label in (("queued_us", "waiting in the worker's queue (queued_us), µs"),
                       ("shim_call_us", "the call's round trip as Envoy sees it (shim_call_us), µs"),
                       ("shim_batch_size", "requests per call (shim_batch_size)")):
        h = filter_histograms.get(key, {})
        rows.append((label, f(h.get("p50")), f(h.get("p90")), f(h.get("p99")), "–"))
    for key, label in (("rlshim_check_duration_seconds", "in the shim, request received to answered, µs"),
                       ("rlshim_redis_call_duration_seconds", "the shim's Redis call, sent to answered, µs")):
        s_ = summary[key]
        rows.append((label, f"≤ {f(s_['p50_at_most'])}", "", "", f(s_["mean"])))
    rows.append(("Redis running the function (INFO commandstats), µs", "", "", "", f(redis_us, "{:.1f}")))
    lines = [f"One Envoy at {args.rate} req/s for {args.duration} s, row {name} "
             "(Envoy's histograms include the 1 s warm-up at the same rate; the shim's p50 is the bucket bound "
             "holding it):", "", "| | p50 | p90 | p99 | mean |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    text = "\n".join(lines)
    (OUT / "where.md").write_text(text + "\n")
    print(text)


# --------------------------------------------------------------------------- failover

FAILOVER_LIMIT = 1_000_000  # per hour: never reached, so every charge stays in Redis


def failover(args):
    """A master killed under traffic, its replica promoted: how long decisions fall to the
    failure mode, how many admissions the lost writes forgot, and whether any request hung.

    3 masters with a replica each (cluster-node-timeout 1 s), a shim in cluster mode, one
    Envoy with one exact rule on one client key (failure_mode closed, so a decision the
    shim could not make shows as a 503). Client threads send requests back to back; after
    `--duration` seconds the master owning the client's counter is killed (SIGKILL), and
    the load goes on for as long again plus the promotion. Every response is timed.
    Admissions forgotten = 200s counted by the clients - tokens the counter shows spent
    (from the last response's X-RateLimit-Remaining)."""
    import threading
    OUT.mkdir(parents=True, exist_ok=True)
    procs = Processes()
    try:
        cluster = RedisCluster(procs, masters=3, replicas=1)
        shim = Shim(procs, None, cluster=cluster)
        # A fixed window refills nothing within the hour: what Redis shows spent is what it
        # remembers admitting (a run across the top of the hour is reported as such).
        filters = ratelimit({"algorithm": "fixed_window"}, limit=FAILOVER_LIMIT, period="1h", failure_mode="closed")
        envoy = Envoy(procs, "failover", filters, shim.port)
        if not envoy.ready:
            sys.exit(f"bench: failover: {envoy.why_not_ready()}")
        request = urllib.request.Request(f"http://127.0.0.1:{envoy.port}/", headers={"x-api-key": API_KEY})
        with urllib.request.urlopen(request, timeout=2) as reply:  # the counter's first charge
            first = reply.status == 200
        owner = next(n for n in cluster.nodes if n.cli("ROLE").startswith("master") and n.cli("DBSIZE") == "1")
        started = time.monotonic()
        kill_at = started + args.duration
        stop_at = kill_at + args.duration + 3
        records, lock = [], threading.Lock()

        def client():
            conn = http.client.HTTPConnection("127.0.0.1", envoy.port, timeout=10)
            while time.monotonic() < stop_at:
                sent = time.monotonic()
                try:
                    conn.request("GET", "/", headers={"x-api-key": API_KEY})
                    reply = conn.getresponse()
                    reply.read()
                    row = (sent - started, time.monotonic() - sent, reply.status,
                           reply.getheader("x-ratelimit-remaining"))
                except OSError as error:
                    row = (sent - started, time.monotonic() - sent, f"error: {error}", None)
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", envoy.port, timeout=10)
                with lock:
                    records.append(row)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(max(0.0, kill_at - time.monotonic()))
        owner.process.kill()
        killed = time.monotonic() - started
        for thread in threads:
            thread.join()
        promoted = [n.port for n in cluster.nodes if n is not owner and n.cli("ROLE").startswith("master")
                    and n.cli("DBSIZE") == "1"]
        stats = envoy.stats()
    finally:
        procs.stop_all()
    records.sort()
    failed = [r for r in records if r[2] != 200]
    admitted = sum(1 for r in records if r[2] == 200) + (1 if first else 0)
    last_remaining = next((int(r[3]) for r in reversed(records) if r[2] == 200 and r[3]), None)
    spent = FAILOVER_LIMIT - last_remaining if last_remaining is not None else None
    report = {
        "requests": len(records),
        "killed_at_s": round(killed, 3),
        "replica_promoted": bool(promoted),
        "failure_mode_decisions": len(failed),
        "failure_window_s": round(failed[-1][0] - failed[0][0] + failed[-1][1], 3) if failed else 0.0,
        "first_failure_after_kill_s": round(failed[0][0] - killed, 3) if failed else None,
        "slowest_request_s": round(max(r[1] for r in records), 3),
        "admitted": admitted,
        "spent_in_redis": spent,
        "admissions_forgotten": admitted - spent if spent is not None else None,
        "filter_failed_closed": sum(v for k, v in stats.items() if k.endswith("failed_closed")),
        "crossed_the_hour": time.strftime("%H", time.gmtime(time.time() - (time.monotonic() - started)))
        != time.strftime("%H", time.gmtime()),
    }
    report["statuses"] = {}
    for r in records:  # errors carry their text: grouped by it
        report["statuses"][str(r[2])] = report["statuses"].get(str(r[2]), 0) + 1
    (OUT / "failover.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


# --------------------------------------------------------------------------- main

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--duration", type=int, default=5, help="seconds per load phase")
    parser.add_argument("--rate", type=int, default=2000, help="fixed rate for the latency phase")
    parser.add_argument("--fcall-n", type=int, default=150_000, help="redis-benchmark requests (x pipeline)")
    parser.add_argument("--only", help="comma-separated configuration names")
    parser.add_argument("--wasm-before", metavar="PATH",
                        help="another build of the filter, measured as rl_global_before and rl_local_before "
                             "(before/after a change)")
    parser.add_argument("--skip-ceiling", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-cluster", action="store_true",
                        help="leave out the exact global row through a 3-master Redis Cluster")
    parser.add_argument("--shim-workers", type=int, help="TOKIO_WORKER_THREADS for the shim (default: one per core)")
    parser.add_argument("--failover", action="store_true",
                        help="instead of the sweep: kill a Redis Cluster master under traffic (see failover())")
    parser.add_argument("--paired", metavar="NAME,...",
                        help="instead of the sweep: Envoy CPU per request of these rows against the baseline, "
                             "one Envoy, alternating short phases (see paired())")
    parser.add_argument("--cycles", type=int, default=10, help="--paired, --alternate: cycles")
    parser.add_argument("--phase", type=int, default=1, help="--paired, --alternate: seconds per phase")
    parser.add_argument("--connections", type=int, default=32,
                        help="--paired: wrk connections (32 as the sweep; more, until Envoy's core is saturated)")
    parser.add_argument("--where", nargs="?", const="rl_global", metavar="ROW",
                        help="instead of the sweep: where an exact check's time goes at --rate (see where_time_goes()), "
                             "in rl_global or another exact row (rl_global_h2)")
    parser.add_argument("--alternate", metavar="NAME,...",
                        help="instead of the sweep: latency at --rate of these rows, an Envoy each, in rotating "
                             "--phase s phases for --cycles cycles (see alternating_latency())")
    parser.add_argument("--profile", metavar="NAME",
                        help="instead of the sweep: perf-record Envoy, the shim and Redis under closed-loop load")
    args = parser.parse_args()

    for tool in ("wrk", "oha", "redis-server", "redis-cli", "redis-benchmark", "taskset"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} is missing (bench/bench.sh installs it)")
    for path in (ENVOY_BIN, ROOT / RATELIMIT_WASM, ROOT / PASSTHROUGH_WASM, ROOT / SHIM_BIN):
        if not Path(path).exists():
            sys.exit(f"bench: {Path(path).name} is missing (run `make bench`)")
    if os.cpu_count() < 2:
        sys.exit("bench: needs two cores (Envoy on one, the load on the other)")

    OUT.mkdir(parents=True, exist_ok=True)
    experiments = list(EXPERIMENTS)
    if args.wasm_before:
        before = str(Path(args.wasm_before).resolve())
        experiments.append(("rl_global_before", "exact global, the --wasm-before build", ratelimit({}, wasm=before)))
        experiments.append(("rl_local_before", "scope local, the --wasm-before build",
                            ratelimit({"scope": "local"}, wasm=before)))
        experiments.append(("rl_abusive_100_before", "abusive client (100/s), the --wasm-before build",
                            ratelimit({}, limit=100, period="1s", wasm=before)))
    configs = [c for c in CONFIGS + experiments if c[0] in args.only.split(",")] if args.only else CONFIGS
    if args.failover:
        return failover(args)
    if args.where:
        return where_time_goes(args)
    if args.paired:
        return paired(args)
    if args.alternate:
        return alternating_latency(args)
    if args.profile:
        return profile(args, config_named(args.profile))
    procs = Processes()
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "runs": [], "ceiling": [],
               "configs": [(n, d) for n, d, _ in CONFIGS + experiments] + [(CLUSTER_ROW, CLUSTER_ROW_DESCRIPTION)]}
    try:
        redis = Redis(procs)
        shim = Shim(procs, redis.port, args.shim_workers)
        if not args.skip_cluster:
            cluster = RedisCluster(procs)
            cluster_shim = Shim(procs, None, args.shim_workers, cluster=cluster)
        for run in range(args.runs):
            order = configs if run % 2 == 0 else list(reversed(configs))
            print(f"run {run + 1}/{args.runs}: {', '.join(c[0] for c in order)}", flush=True)
            results["runs"].append({name: measure_config(procs, name, filters, shim, redis, args)
                                    for name, _, filters in order})
            results.setdefault("round_trip_ms", []).append(round_trip_ms(redis))
            if not args.skip_cluster:
                # The same rule and Envoy, through a shim on the 3-master cluster.
                results["runs"][-1][CLUSTER_ROW] = measure_config(procs, CLUSTER_ROW, ratelimit({}), cluster_shim,
                                                                  cluster, args)
            if not args.skip_ceiling:
                results["ceiling"].append(ceiling(procs, shim, redis, args))
        if not args.skip_memory:
            print("bytes per key in Redis:", flush=True)
            results["memory"] = memory_per_key(shim, redis)
    finally:
        procs.stop_all()
    (OUT / "results.json").write_text(json.dumps(results, indent=1))
    (OUT / "table.md").write_text(table(results))
    print()
    print(table(results))


if __name__ == "__main__":
    main()
