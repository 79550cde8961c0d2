#!/usr/bin/env python3
"""Checks of concurrent callers merged: Redis and shim CPU per check with 1, 4 and 16
callers.

One Redis and one shim, both on core 0, wrk on core 1, with 1, 4 and 16 connections (the callers: Envoys, or
their workers), each in a closed loop posting `/v1/check-batch` with one request of one
token-bucket check (bench/shim-batch-lone.lua, 2,000 keys), --duration seconds each.
Per check: on-CPU time of the shim's and Redis's threads (/proc/<pid>/task/*/schedstat)
and requests per FCALL (`INFO commandstats`). Set SHIM_BIN to measure another build
(before/after). With --cluster, a Redis Cluster of three masters instead of one Redis
(the keys fall in 2,000 slots over the three). Prints a table and writes
bench/out/coalescing.json (coalescing-cluster.json).
"""

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import ENVOY_CORE, OUT, ROOT, SHIM_BIN, Processes, Redis, RedisCluster, Shim, cpu_ns, pin, wrk  # noqa: E402

CALLERS = (1, 4, 16)


def fcalls(redis):
    total = 0
    for node in getattr(redis, "nodes", [redis]):
        m = re.search(r"cmdstat_fcall:calls=(\d+)", node.cli("INFO", "commandstats"))
        total += int(m.group(1)) if m else 0
    return total


def redis_cpu_ns(redis):
    return sum(cpu_ns(pid) for pid in redis.pids())


def measure(shim, redis, callers, seconds):
    wrk(f"http://127.0.0.1:{shim.port}/v1/check-batch", 1, callers, script=ROOT / "bench" / "shim-batch-lone.lua")
    before = (cpu_ns(shim.process.pid), redis_cpu_ns(redis), fcalls(redis))
    load = wrk(f"http://127.0.0.1:{shim.port}/v1/check-batch", seconds, callers,
               script=ROOT / "bench" / "shim-batch-lone.lua")
    after = (cpu_ns(shim.process.pid), redis_cpu_ns(redis), fcalls(redis))
    checks = load["requests"]
    if not checks or load["non_2xx"] or load["socket_errors"]:
        sys.exit(f"coalescing: the load failed: {load}")
    return {"callers": callers, "checks_per_s": load["rps"],
            "shim_cpu_us_per_check": (after[0] - before[0]) / 1000 / checks,
            "redis_cpu_us_per_check": (after[1] - before[1]) / 1000 / checks,
            "checks_per_fcall": checks / max(1, after[2] - before[2])}


def table(rows):
    lines = ["| callers | checks/s | shim CPU µs per check | Redis CPU µs per check | checks per FCALL |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['callers']} | {r['checks_per_s']:.0f} | {r['shim_cpu_us_per_check']:.1f} | "
                     f"{r['redis_cpu_us_per_check']:.1f} | {r['checks_per_fcall']:.2f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=4, help="seconds per load phase")
    parser.add_argument("--cluster", action="store_true", help="a Redis Cluster of three masters")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    procs = Processes()
    try:
        if args.cluster:
            redis = RedisCluster(procs)
            shim = Shim(procs, None, cluster=redis)
        else:
            redis = Redis(procs)
            shim = Shim(procs, redis.port)
        # Redis and the shim share core 0; wrk has core 1.
        for pid in [*redis.pids(), shim.process.pid]:
            pin(pid, ENVOY_CORE)
        rows = []
        for callers in CALLERS:
            rows.append(measure(shim, redis, callers, args.duration))
            print(f"  {callers} callers: {rows[-1]['checks_per_fcall']:.2f} checks per FCALL", flush=True)
    finally:
        procs.stop_all()
    name = "coalescing-cluster.json" if args.cluster else "coalescing.json"
    (OUT / name).write_text(json.dumps({"shim": SHIM_BIN, "cluster": args.cluster,
                                        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, indent=1))
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
