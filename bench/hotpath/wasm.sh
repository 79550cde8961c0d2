#!/usr/bin/env bash
# Builds bench-hotpath for wasm32-wasip1 (Debian's rustc-web with build-std, as
# scripts/build-wasm.sh) and runs it under Node's V8: the filter's logic as compiled
# wasm, without Envoy's host calls. Usage: bench/hotpath/wasm.sh [local|global|both] [N]
set -euo pipefail
cd "$(dirname "$0")"
PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
RUSTFLAGS="-L /usr/lib/wasm32-wasi" CARGO_TARGET_DIR=target/wasm-debian \
    /usr/bin/cargo build --quiet --release --target wasm32-wasip1 -Zbuild-std=std,panic_abort
wasm=target/wasm-debian/wasm32-wasip1/release/bench-hotpath.wasm
# Envoy's V8 compiles wasm with TurboFan only (no Liftoff); Node tiers up to it.
node --no-warnings run-wasi.cjs "$wasm" "${1:-both}" "${2:-200000}"
