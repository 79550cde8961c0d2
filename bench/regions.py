#!/usr/bin/env python3
"""Regions (`make bench-regions`): what each rung of `regions` admits and costs.

Three regions on this machine (scripts/regions_harness.py: per region a Redis and the
shim's binary; between regions, one delay proxy per direction, bench/delay_proxy.rs),
at one-way delays of 0 (the proxy alone), 10 and 40 ms. For each delay and each rung
(`independent`, `home`, `replicated`), fixed window, 100 per hour, each on a fresh key:

  (a) burst: 100 checks at once at every region; admitted in total against the limit;
  (b) latency: 200 sequential checks per region (regions side by side, one keep-alive
      connection each, a key with a big limit), p50/p99 per region at the client;
  (c) replicated only: traffic at every region (one check per 20 ms each) while region c
      is cut off for 5 s; what was admitted during it, and the time from healing until
      every region reports `remaining` within 1 of the limit minus everything admitted
      (read with `counters show`'s admin endpoint, charging nothing);
  (d) Redis work per check, every region's Redis summed, over 4 clients per region each
      making 100 checks on a key of its own: the time Redis spent executing the checks'
      commands (`INFO commandstats` usec of FCALL, which holds the commands a function
      calls, and of XRANGE: the check functions, replication's stream reads and its
      applies at the peers), the commands called (commandstats calls, a function's own
      included), and Redis CPU (`INFO cpu` used_cpu_user + sys). Each less the
      replication loops' idle polling (every peer's stream read every 10 ms even without
      traffic), measured for 2 s before each phase as a rate. The rungs alternate
      (independent, home, replicated, then back), so the ratios to independent come from
      the same minute. CPU includes the network work (a check that arrives alone costs more
      than one pipelined with others) and the polling's jitter: the noisiest of the three.

Prints a Markdown table and writes it to bench/out/<date>-<HHMM>-regions.txt. Everything
listens on 127.0.0.1; every process is stopped at the end, on error too.
"""

import argparse
import math
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import regions_harness as h  # noqa: E402  (the regions' processes and the shim's API)

OUT = h.ROOT / "bench" / "out"
RUNGS = ("independent", "home", "replicated")
LIMIT = 100
BIG = 1_000_000


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def burst(regions, rung, per_region):
    admitted, failed = h.burst(regions, h.body(h.check(h.fresh_key(f"burst-{rung}"), rung, LIMIT)), per_region)
    return {"admitted": admitted, "failed": failed, "sent": per_region * len(regions)}


def latency(regions, rung, per_region):
    """p50 and p99 (ms) per region of sequential checks, the regions side by side."""
    key = h.fresh_key(f"latency-{rung}")
    data = h.body(h.check(key, rung, BIG))
    samples = [[] for _ in range(len(regions))]
    failed = [0] * len(regions)

    def run(index):
        client = h.Client(regions.port(index))
        for _ in range(3):  # warm-up: the connection, the shim's peer connections
            client.decide(data)
        for _ in range(per_region):
            started = time.perf_counter()
            ok, _, status = client.decide(data)
            samples[index].append((time.perf_counter() - started) * 1000)
            failed[index] += status != 200 or not ok
        client.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(regions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"p50": [statistics.median(s) for s in samples], "p99": [percentile(s, 0.99) for s in samples],
            "failed": sum(failed)}


def partition(regions, seconds, interval=0.02):
    """Region c (the last) cut off for `seconds` while every region sees a check per
    `interval`; then healed, and the time until every region agrees."""
    key = h.fresh_key("partition")
    data = h.body(h.check(key, "replicated", LIMIT))
    clients = [h.Client(regions.port(i)) for i in range(len(regions))]
    before = 0
    for client in clients:  # some spending everywhere, known everywhere
        for _ in range(5):
            before += client.decide(data)[0]
    settled, _ = h.converge(regions, key, "replicated", LIMIT, before, 10)
    if settled is None:
        h.fail("replicated: the regions did not agree within 10 s before the partition")
    cut = len(regions) - 1
    regions.cut_off(cut)
    during = [0] * len(regions)
    failed = [0] * len(regions)

    def traffic(index):
        client = h.Client(regions.port(index))
        started = time.perf_counter()
        sent = 0
        while time.perf_counter() - started < seconds:
            ok, _, status = client.decide(data)
            during[index] += ok
            failed[index] += status != 200
            sent += 1
            time.sleep(max(0.0, started + sent * interval - time.perf_counter()))
        client.close()

    threads = [threading.Thread(target=traffic, args=(i,), daemon=True) for i in range(len(regions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    regions.heal(cut)
    healed = time.perf_counter()
    took, seen = h.converge(regions, key, "replicated", LIMIT, before + sum(during), 30, clients)
    took = None if took is None else time.perf_counter() - healed
    for client in clients:
        client.close()
    total = before + sum(during)
    # docs/REGIONS.md: the region cut off spends no more than its share of what it knew
    # remained; the majority carries on to the limit.
    bound = LIMIT + math.ceil((LIMIT - before) / len(regions))
    return {"before": before, "during": during, "total": total, "bound": bound, "converge_s": took,
            "seen": seen, "failed": sum(failed)}


def command_usec(counters):
    """Microseconds Redis spent in the commands a check (and its replication) makes: the
    functions (a check, check_regions, a peer's apply; the commands they call included)
    and stream reads. The replication loops' GETs, and their empty reads while idle, are
    the polling subtracted as a rate."""
    return counters.get("usec:fcall", 0) + counters.get("usec:xrange", 0)


def work_phase(regions, rung, clients_per_region, checks_each, idle_s, settle_s=0.3):
    """Redis CPU seconds, command calls and command microseconds of `rung`'s checks,
    every region's Redis summed, less the idle rate of the replication loops' polling
    over the same time."""
    w0 = regions.work()
    time.sleep(idle_s)
    w1 = regions.work()
    idle = {name: (w1[name] - w0.get(name, 0)) / idle_s for name in w1}
    idle_usec = command_usec(w1) - command_usec(w0)
    failed = [0]
    lock = threading.Lock()

    def run(index):
        client = h.Client(regions.port(index))
        data = h.body(h.check(h.fresh_key(f"work-{rung}"), rung, BIG))
        bad = 0
        for _ in range(checks_each):
            ok, _, status = client.decide(data)
            bad += status != 200 or not ok
        client.close()
        with lock:
            failed[0] += bad

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(regions)) for _ in range(clients_per_region)]
    started = time.perf_counter()
    w2 = regions.work()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(settle_s)  # the replication of the last checks, counted with them
    w3 = regions.work()
    window = time.perf_counter() - started
    return {"cpu_s": w3["cpu"] - w2["cpu"] - idle["cpu"] * window,
            "calls": w3["calls"] - w2["calls"] - idle["calls"] * window,
            "usec": command_usec(w3) - command_usec(w2) - idle_usec / idle_s * window,
            "idle_cpu_s": idle["cpu"] * window,
            "checks": len(threads) * checks_each, "failed": failed[0]}


WORK_FIELDS = ("cpu_s", "calls", "usec", "idle_cpu_s", "checks", "failed")


def measure_delay(delay_ms, args, log):
    results = {rung: {} for rung in RUNGS}
    run_dir = OUT / "regions" / f"{delay_ms}ms"
    with h.Regions(3, delay_ms * 1000, run_dir) as regions:
        log(f"regions: {delay_ms} ms one way: 3 regions up")
        for rung in RUNGS:
            results[rung]["burst"] = b = burst(regions, rung, args.burst)
            log(f"  {rung:11} burst: {b['admitted']} of {b['sent']} admitted (limit {LIMIT}), {b['failed']} not 200")
        for rung in RUNGS:
            results[rung]["latency"] = lat = latency(regions, rung, args.latency_checks)
            log(f"  {rung:11} latency p50 {' / '.join(f'{v:.2f}' for v in lat['p50'])} ms, "
                f"p99 {' / '.join(f'{v:.2f}' for v in lat['p99'])} ms, {lat['failed']} not admitted or not 200")
        results["replicated"]["partition"] = p = partition(regions, args.partition_s)
        took = f"{p['converge_s']:.3f} s" if p["converge_s"] is not None else "not within 30 s"
        log(f"  replicated  partition of c, {args.partition_s} s: admitted during it a/b/c "
            f"{'/'.join(map(str, p['during']))}, total {p['total']} (with {p['before']} before; bound {p['bound']}); "
            f"converged {took} after healing, remaining seen {p['seen']}; {p['failed']} not 200")
        work = {rung: dict.fromkeys(WORK_FIELDS, 0) for rung in RUNGS}
        for order in (RUNGS, tuple(reversed(RUNGS)))[:args.work_rounds]:
            for rung in order:
                w = work_phase(regions, rung, args.work_clients, args.work_checks, args.idle_s)
                for field in WORK_FIELDS:
                    work[rung][field] += w[field]
        for rung in RUNGS:
            w = work[rung]
            w["cpu_us_per_check"] = w["cpu_s"] * 1e6 / w["checks"]
            w["idle_cpu_us_per_check"] = w["idle_cpu_s"] * 1e6 / w["checks"]
            w["calls_per_check"] = w["calls"] / w["checks"]
            w["usec_per_check"] = w["usec"] / w["checks"]
            results[rung]["work"] = w
        base = work["independent"]
        for rung in RUNGS:
            w = work[rung]
            log(f"  {rung:11} Redis work per check: {w['usec_per_check']:.1f} µs in commands "
                f"({w['usec_per_check'] / base['usec_per_check']:.2f}x independent), "
                f"{w['calls_per_check']:.2f} calls ({w['calls_per_check'] / base['calls_per_check']:.2f}x), "
                f"{w['cpu_us_per_check']:.1f} µs CPU ({w['cpu_us_per_check'] / base['cpu_us_per_check']:.2f}x; "
                f"idle polling subtracted: {w['idle_cpu_us_per_check']:.1f} µs), {w['failed']} failed")
    return results


LEGEND = """\
Burst: admitted of 100 sent at once at each region (300 in all) on one key of limit 100.
Latency: at the client, each region's checks one after another, the regions side by side
(a home region's own checks run faster while the others wait on the WAN). Converge: from
the links healing until every region reports remaining within 1 of the limit minus all
admitted; bound: the limit plus the cut-off region's share of what it knew remained.
Redis work, every region's Redis summed, less the replication loops' idle polling: µs in
commands (commandstats usec of FCALL and XRANGE: checks, replication's reads and applies),
calls (commandstats, a function's own commands included), CPU (INFO cpu; the noisiest: the
idle polling subtracted is shown in the log, and at a distance it is larger than the rest).
"""


def against(work, base, field, fmt):
    """A rung's work per check, with its ratio to independent's."""
    value = f"{work[field]:{fmt}}"
    return value if work is base else f"{value} ({work[field] / base[field]:.2f}x)"


def table(all_results, args):
    lines = ["| rung | one-way delay | burst admitted / limit | p50 ms a / b / c | p99 ms a / b / c "
             "| converge after c's partition heals | admitted in partition (a / b / c; total) "
             "| Redis µs in commands per check (vs independent) | Redis calls per check (vs independent) "
             "| Redis CPU µs per check (vs independent) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for rung in RUNGS:
        for delay in args.delays:
            row = all_results[delay][rung]
            base = all_results[delay]["independent"]["work"]
            b, lat, w = row["burst"], row["latency"], row["work"]
            burst_cell = f"{b['admitted']} / {LIMIT}" + (f" ({b['failed']} failed)" if b["failed"] else "")
            p = row.get("partition")
            if p:
                converge = f"{p['converge_s']:.2f} s" if p["converge_s"] is not None else "> 30 s"
                during = f"{' / '.join(map(str, p['during']))}; {p['total']} (bound {p['bound']})"
            else:
                converge = during = "-"
            lines.append(f"| {rung} | {delay} ms | {burst_cell} | {' / '.join(f'{v:.2f}' for v in lat['p50'])} | "
                         f"{' / '.join(f'{v:.2f}' for v in lat['p99'])} | {converge} | {during} | "
                         f"{against(w, base, 'usec_per_check', '.1f')} | {against(w, base, 'calls_per_check', '.2f')} | "
                         f"{against(w, base, 'cpu_us_per_check', '.1f')} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", default="0,10,40", help="one-way delays in ms, comma-separated")
    parser.add_argument("--burst", type=int, default=100, help="checks at once per region")
    parser.add_argument("--latency-checks", type=int, default=200, help="sequential checks per region")
    parser.add_argument("--partition-s", type=float, default=5.0, help="how long region c is cut off")
    parser.add_argument("--work-clients", type=int, default=4, help="clients per region in the Redis work phase")
    parser.add_argument("--work-checks", type=int, default=100, help="checks per client in the Redis work phase")
    parser.add_argument("--idle-s", type=float, default=2.0, help="idle polling measured this long before each phase")
    parser.add_argument("--work-rounds", type=int, default=2, choices=(1, 2))
    args = parser.parse_args()
    args.delays = [int(d) for d in args.delays.split(",")]
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.time()
    stamp = time.strftime("%Y-%m-%d-%H%M", time.localtime(started))
    notes = []

    def log(line):
        print(line, flush=True)
        notes.append(line)

    all_results = {}
    for delay in args.delays:
        all_results[delay] = measure_delay(delay, args, log)
    took = time.time() - started
    text = table(all_results, args)
    header = (f"# bench/regions.py, {time.strftime('%Y-%m-%d %H:%M', time.localtime(started))}, {took:.0f} s\n\n"
              f"`{' '.join([Path(sys.argv[0]).name] + sys.argv[1:])}` on {platform.node()} "
              f"({os.cpu_count()} cores, {platform.platform()}). Three regions a, b, c on 127.0.0.1, "
              f"each a Redis and a shim ({' '.join(h.SHIM_FLAGS)}, peer flags at their defaults), a delay "
              f"proxy per direction between regions. Fixed window, {LIMIT} per hour; burst: {args.burst} at once "
              f"per region; latency: {args.latency_checks} sequential checks per region at the client; "
              f"partition: c cut off {args.partition_s:g} s, one check per 20 ms per region; Redis work: every "
              f"region's Redis summed, {args.work_clients} clients x {args.work_checks} checks per region, "
              f"{args.work_rounds} rounds, idle polling subtracted.\n\n")
    path = OUT / f"{stamp}-regions.txt"
    path.write_text(header + text + "\n" + LEGEND + "\n## Log\n\n```\n" + "\n".join(notes) + "\n```\n")
    print()
    print(text)
    print(f"written to {path.relative_to(h.ROOT)}")


if __name__ == "__main__":
    main()
