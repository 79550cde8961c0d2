#!/usr/bin/env python3
"""Draws bench/latency.png from bench/out/results.json (written by bench/run.py).

Left: latency percentiles at the fixed rate (2,000 req/s), one colour per
configuration and one line per run, so the spread between identical runs is visible.
Right: Envoy's CPU time per request at full load, the bar spanning the runs' min–max.
Needs matplotlib (bench/bench.sh installs it into bench/.venv).
"""

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BENCH = Path(__file__).resolve().parent
results = json.loads((BENCH / "out" / "results.json").read_text())
LABELS = {
    "baseline": "no filter (baseline)",
    "native_local": "Envoy local_ratelimit",
    "wasm_passthrough": "pass-through wasm",
    "rl_local": "ratelimit-wasm local",
    "rl_global": "ratelimit-wasm exact global",
    "rl_global_before": "exact global, before batching",
    "rl_global_h1": "exact global, HTTP/1.1 to shim",
    "rl_global_h2": "exact global, HTTP/2 to shim",
    "baseline_cluster": "no filter, route to a cluster",
    "rl_global_cluster": "exact global, route to a cluster",
    "rl_global_3_masters": "exact global, Redis Cluster (3 masters)",
    "rl_leased": "ratelimit-wasm leased",
    "rl_abusive": "abusive client (deny cache)",
    "rl_abusive_100": "abusive client, 100/s",
}
names = [n for n in LABELS if any(n in run and "fixed" in run[n] and "invalid" not in run[n]
                                  for run in results["runs"])]

fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6), gridspec_kw={"width_ratios": [3, 2]})
colours = plt.get_cmap("tab10")
for i, name in enumerate(names):
    for r, run in enumerate(results["runs"]):
        row = run.get(name)
        if not row or "fixed" not in row or "invalid" in row:
            continue
        points = sorted((float(k[1:]), v) for k, v in row["fixed"]["latency_ms"].items())
        points = [(p, v) for p, v in points if p < 100]
        xs = [-math.log10(1 - p / 100) for p, _ in points]
        left.plot(xs, [v for _, v in points], color=colours(i), marker="o", markersize=3,
                  linestyle="-" if r == 0 else "--", label=LABELS[name] if r == 0 else None)
ticks = [10, 50, 90, 99, 99.9, 99.99]
left.set_xticks([-math.log10(1 - p / 100) for p in ticks], [f"p{p:g}" for p in ticks])
left.set_yscale("log")
left.set_ylabel("latency (ms, log scale)")
left.set_title(f"Latency at {results['args']['rate']:,} req/s (solid: run 1, dashed: later runs)")
left.grid(True, which="both", alpha=0.3)
left.legend(fontsize=8)

cpu = []
for name in names:
    values = [run[name]["closed"]["envoy_cpu_us_per_req"] for run in results["runs"]
              if name in run and "closed" in run[name] and "invalid" not in run[name]]
    cpu.append((min(values), max(values)))
ys = range(len(names))
right.barh(ys, [hi for _, hi in cpu], color=[colours(i) for i in ys], alpha=0.35)
right.barh(ys, [lo for lo, _ in cpu], color=[colours(i) for i in ys])
right.set_yticks(list(ys), [LABELS[n] for n in names], fontsize=8)
right.invert_yaxis()
right.set_xlabel("µs per request, closed loop (dark: min, light: max)")
right.set_title("Envoy CPU per request")
right.grid(True, axis="x", alpha=0.3)

fig.suptitle(f"ratelimit-wasm benchmarks, {len(results['runs'])} runs ({results['started']})")
fig.tight_layout()
fig.savefig(BENCH / "latency.png", dpi=110)
print("bench: wrote bench/latency.png")
