#!/usr/bin/env bash
# `make bench`: installs the load generators when missing (wrk from Debian, oha from
# crates.io), builds the pass-through wasm filter, runs the sweep (bench/run.py; extra
# arguments are passed to it, e.g. --runs 3 --duration 5), draws the latency plot
# bench/latency.png with matplotlib, then measures Redis's work per check against floor
# scripts (bench/redis_work.py) and the merging of concurrent callers' checks
# (bench/coalescing.py) and the cost of distance (bench/distance.py); all run from a venv in bench/.venv.
# Expects `make build` to have run (the Makefile's bench target depends on it).
# `make bench PEER=<limitador-server>` adds the peer's row to bench/rls.py's table.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
OHA_VERSION=1.16.0

if ! command -v wrk >/dev/null || ! command -v redis-benchmark >/dev/null; then
    echo "bench: installing wrk and redis-tools"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends wrk redis-tools >/dev/null
fi
if ! command -v oha >/dev/null; then
    echo "bench: installing oha $OHA_VERSION (a few minutes, once)"
    cargo install --quiet --locked oha --version "$OHA_VERSION"
fi
bench/build-passthrough.sh

if ! bench/.venv/bin/python -c 'import matplotlib, yaml' 2>/dev/null; then
    echo "bench: installing matplotlib and PyYAML into bench/.venv"
    python3 -m venv bench/.venv
    bench/.venv/bin/pip install --quiet matplotlib pyyaml
fi
# run.py reads the shim's cluster from the shipped envoy.yaml (PyYAML).
bench/.venv/bin/python bench/run.py "$@"
bench/.venv/bin/python bench/plot.py
# Redis's own time per check, each algorithm against its floor script; then Redis and
# shim CPU per check with 1, 4 and 16 concurrent callers, on one Redis and on a cluster.
bench/.venv/bin/python bench/redis_work.py
bench/.venv/bin/python bench/coalescing.py
bench/.venv/bin/python bench/coalescing.py --cluster
# The same paths a network hop away (bench/delay_proxy.rs, built here with rustc).
bench/.venv/bin/python bench/distance.py
# Envoy's native rate-limit filter through the shim's gRPC service, against the Wasm filter;
# with PEER=<limitador-server> (built by hand; nothing here builds it) the peer's row too.
bench/.venv/bin/python bench/rls.py ${PEER:+--peer "$PEER"}
