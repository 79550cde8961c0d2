#!/usr/bin/env python3
"""Redis work per check: the shim's function against a floor script, per algorithm.

One Redis and one shim. For each algorithm and for a batch of 10 requests (one check
each) and a lone request, the shim is driven directly with `POST /v1/check-batch`, checks
on distinct keys (a pool cycled, so keys hold state as in traffic), and Redis's own time
per call is read from `INFO commandstats` (`usec_per_call` of FCALL, which excludes the
network and the client). Then the algorithm's floor script (bench/floor/<algorithm>.lua:
one TIME per call, the same Redis commands per check as the product, nothing else) runs
with EVALSHA over as many keys of its own. Product and floor phases alternate, --rounds
times, so both see the same minute; a row sums the rounds.

A call costs Redis more when calls come apart than back to back (caches and branch
predictors cool between them: on these machines a lone GCRA check takes about 9 µs
pipelined, 19 µs one call at a time, 27 µs with 0.3 ms between calls). The shim's calls
come one at a time, an HTTP round trip apart, so the floor is paced alike: one call at
a time, the product phase's mean interval between calls apart (`floor`). The floor sent
back to back, pipelined, is shown beside it (`floor, back to back`), a lower bound no
call through a shim reaches.

Prints a table (product µs per call, floor µs per call, ratio) and writes
bench/out/redis_work.json. Runs on its own or from bench/bench.sh.
"""

import argparse
import http.client
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import OUT, ROOT, Processes, Redis, Shim  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from resp import RespClient, resp  # noqa: E402  (scripts/resp.py)

FLOORS = ROOT / "bench" / "floor"
# Every check admits: the floors charge unconditionally. The log's limit is its cap
# (MAX_LOG_LIMIT); the floor scripts hold the same numbers.
ALGORITHMS = {
    "token_bucket": (1_000_000, 60_000),
    "fixed_window": (1_000_000, 60_000),
    "sliding_window_counter": (1_000_000, 60_000),
    "sliding_window_log": (10_000, 60_000),
}
KEY_POOL = 2000
BATCH_SIZES = (10, 1)


def usec_and_calls(client, command):
    info = client.call("INFO", "commandstats")
    m = re.search(rf"cmdstat_{command}:calls=(\d+),usec=(\d+)", info)
    return (int(m.group(2)), int(m.group(1))) if m else (0, 0)


def product_phase(client, shim_port, algorithm, batch, calls, offset):
    limit, period_ms = ALGORITHMS[algorithm]
    bodies = []
    for call in range(calls):
        requests = [{"checks": [{"key": f"rw:{algorithm}:{(offset + call * batch + i) % KEY_POOL}",
                                 "algorithm": algorithm, "limit": limit, "period_ms": period_ms}]}
                    for i in range(batch)]
        bodies.append(json.dumps({"requests": requests}))
    connection = http.client.HTTPConnection("127.0.0.1", shim_port, timeout=5)
    client.call("CONFIG", "RESETSTAT")
    started = time.perf_counter()
    for body in bodies:
        connection.request("POST", "/v1/check-batch", body, {"content-type": "application/json"})
        response = connection.getresponse()
        answer = response.read()
        if response.status != 200 or b'"failed"' in answer or b'"allowed":false' in answer:
            sys.exit(f"redis_work: the shim answered {response.status}: {answer[:300]!r}")
    interval = (time.perf_counter() - started) / calls
    connection.close()
    return usec_and_calls(client, "fcall"), interval


def floor_phase(client, sha, algorithm, batch, calls, offset, interval):
    """The floor's calls `interval` seconds apart, one at a time; back to back
    (pipelined) when `interval` is None."""
    commands = []
    for call in range(calls):
        keys = [f"floor:{algorithm}:{(offset + call * batch + i) % KEY_POOL}" for i in range(batch)]
        commands.append(resp("EVALSHA", sha, batch, *keys))
    client.call("CONFIG", "RESETSTAT")
    if interval is None:
        client.pipelined(commands)
    else:
        next_call = time.perf_counter()
        for command in commands:
            while time.perf_counter() < next_call:
                pass  # a sleep this short oversleeps
            next_call += interval
            client.pipelined([command], 1)
    return usec_and_calls(client, "evalsha")


def measure(client, shim_port, algorithm, batch, args):
    sha = client.call("SCRIPT", "LOAD", (FLOORS / f"{algorithm}.lua").read_text())
    calls = args.calls
    # A warm-up of each, uncounted: the library loaded, keys holding state.
    product_phase(client, shim_port, algorithm, batch, 50, 0)
    floor_phase(client, sha, algorithm, batch, 50, 0, None)
    product, floor, back_to_back = [0, 0], [0, 0], [0, 0]
    for round_ in range(args.rounds):
        offset = round_ * calls * batch
        (usec, n), interval = product_phase(client, shim_port, algorithm, batch, calls, offset)
        product[0] += usec
        product[1] += n
        for total, pace in ((floor, interval), (back_to_back, None)):
            usec, n = floor_phase(client, sha, algorithm, batch, calls, offset, pace)
            total[0] += usec
            total[1] += n
    product_us = product[0] / product[1]
    floor_us = floor[0] / floor[1]
    back_to_back_us = back_to_back[0] / back_to_back[1]
    return {"algorithm": algorithm, "batch": batch, "product_us": product_us, "floor_us": floor_us,
            "ratio": product_us / floor_us, "floor_back_to_back_us": back_to_back_us,
            "interval_us": interval * 1e6, "calls": product[1]}


def table(rows):
    lines = ["| algorithm | requests per call | product µs per call | floor µs per call | ratio "
             "| floor, back to back, µs | ratio to it |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['algorithm']} | {row['batch']} | {row['product_us']:.1f} | {row['floor_us']:.1f} | "
                     f"**{row['ratio']:.2f}x** | {row['floor_back_to_back_us']:.1f} | "
                     f"{row['product_us'] / row['floor_back_to_back_us']:.2f}x |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per phase")
    parser.add_argument("--rounds", type=int, default=3, help="alternating product and floor phases")
    parser.add_argument("--only", help="comma-separated algorithms")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    algorithms = args.only.split(",") if args.only else list(ALGORITHMS)
    procs = Processes()
    rows = []
    try:
        redis = Redis(procs)
        shim = Shim(procs, redis.port, 1)
        client = RespClient(redis.port)
        for algorithm in algorithms:
            for batch in BATCH_SIZES:
                rows.append(measure(client, shim.port, algorithm, batch, args))
                print(f"  {algorithm} x{batch}: {rows[-1]['product_us']:.1f} µs vs {rows[-1]['floor_us']:.1f} µs",
                      flush=True)
    finally:
        procs.stop_all()
    result = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}
    (OUT / "redis_work.json").write_text(json.dumps(result, indent=1))
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
