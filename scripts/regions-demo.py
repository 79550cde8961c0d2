#!/usr/bin/env python3
"""`make demo REGIONS=3`: the shim serving several regions, on this machine.

Starts the regions (scripts/regions_harness.py: per region a Redis and the shim, 20 ms
one way between regions through delay proxies), then for each rung of `regions`
(independent, home, replicated) sends 300 checks of one fresh key (fixed window, 100 per
hour) round-robin over the regions, a few at a time, and prints what was admitted against
the limit. Stops everything at the end, on error too.
"""

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import regions_harness as h  # noqa: E402

LIMIT = 100
EXPLAINED = {
    "independent": "each region counts alone",
    "home": "every check is counted in the key's home region",
    "replicated": "each region counts in its own Redis and replicates its spending to the others",
}


def spread(regions, rung, checks, in_flight):
    """`checks` checks of one fresh key, check i at region i mod N, `in_flight` at a
    time: admitted per region, failures, and each region's latencies (ms)."""
    key = h.fresh_key(f"demo-{rung}")
    data = h.body(h.check(key, rung, LIMIT))
    admitted = [0] * len(regions)
    failed = [0]
    latencies = [[] for _ in range(len(regions))]
    next_check = [0]
    lock = threading.Lock()

    def worker():
        clients = [h.Client(regions.port(i)) for i in range(len(regions))]
        while True:
            with lock:
                i = next_check[0]
                next_check[0] += 1
            if i >= checks:
                break
            region = i % len(regions)
            started = time.perf_counter()
            ok, _, status = clients[region].decide(data)
            took = (time.perf_counter() - started) * 1000
            with lock:
                admitted[region] += ok
                failed[0] += status != 200
                latencies[region].append(took)
        for client in clients:
            client.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(in_flight)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return key, admitted, failed[0], latencies


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regions", type=int, default=3, help="how many regions (2 to 5)")
    parser.add_argument("--delay-ms", type=int, default=20, help="one-way delay between regions")
    parser.add_argument("--checks", type=int, default=300, help="checks per rung, round-robin")
    parser.add_argument("--in-flight", type=int, default=6, help="checks sent at a time")
    args = parser.parse_args()
    names = ", ".join(h.NAMES[:args.regions])
    print(f"Starting {args.regions} regions ({names}) on 127.0.0.1: each a Redis and a shim, "
          f"{args.delay_ms} ms one way between regions ...", flush=True)
    with h.Regions(args.regions, args.delay_ms * 1000, h.ROOT / ".run" / "regions-demo") as regions:
        print(f"{args.checks} checks per rung, round-robin over the regions, {args.in_flight} at a time, "
              f"one key per rung: fixed window, {LIMIT} per hour.\n")
        for rung in ("independent", "home", "replicated"):
            key, admitted, failed, latencies = spread(regions, rung, args.checks, args.in_flight)
            total = sum(admitted)
            medians = [statistics.median(l) if l else 0.0 for l in latencies]
            if total > LIMIT + 1:
                verdict = f"{total / LIMIT:.1f}x the limit".replace(".0x", "x")
            elif abs(total - LIMIT) <= 1:
                verdict = "the limit" if total == LIMIT else f"{total - LIMIT:+d} off the limit"
            else:
                verdict = f"{LIMIT - total} under the limit"
            why = EXPLAINED[rung]
            if rung == "home" and args.delay_ms:
                homes = [name for name, m in zip(h.NAMES, medians) if m < args.delay_ms]
                if len(homes) == 1:
                    why += f" ({homes[0]}: the others wait a round trip to it)"
            print(f"{rung:<12} {total:>3} admitted of {args.checks}, limit {LIMIT}: {verdict}; {why}")
            line = (f"{'':<12} per region " + ", ".join(f"{name} {n}" for name, n in zip(h.NAMES, admitted))
                    + "; median check " + ", ".join(f"{name} {m:.1f} ms" for name, m in zip(h.NAMES, medians)))
            if failed:
                line += f"; {failed} answers not 200"
            print(line)
            if rung == "replicated" and total:
                took, seen = h.converge(regions, key, rung, LIMIT, total, 10)
                print(f"{'':<12} " + (f"every region agrees {took * 1000:.0f} ms later: remaining "
                                      + ", ".join(f"{name} {r}" for name, r in zip(h.NAMES, seen))
                                      if took is not None else
                                      f"the regions did not agree within 10 s: remaining {seen}"))
        print("\nStopping the regions.")
    print("Stopped. (Logs: .run/regions-demo/; `make bench-regions` measures bursts, latency, a partition "
          "and Redis work per check.)")


if __name__ == "__main__":
    main()
