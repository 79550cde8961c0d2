#!/usr/bin/env bash
# Runs the filter's pure-logic unit tests compiled to wasm32 (wasm32-unknown-unknown),
# under Node with wasm-bindgen-test-runner: the decisions tested natively are the ones
# the .wasm makes. Uses rustup's target when installed, else Debian's rustc-web route.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/wasm-toolchain.sh
runner=$(command -v wasm-bindgen-test-runner || echo "$HOME/.cargo/bin/wasm-bindgen-test-runner")
[ -x "$runner" ] || { echo "test-wasm: wasm-bindgen-test-runner missing; run 'make setup'" >&2; exit 1; }
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER="$runner"

if has_rustup_target wasm32-unknown-unknown; then
    exec cargo test --target wasm32-unknown-unknown -p ratelimit-wasm -p ratelimit-rules -p ratelimit-wire --lib
fi
debian_route test-wasm
CARGO_TARGET_DIR=target/wasm-test \
    exec /usr/bin/cargo test --target wasm32-unknown-unknown -p ratelimit-wasm -p ratelimit-rules -p ratelimit-wire --lib -Zbuild-std=std,panic_abort
