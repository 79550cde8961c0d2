#!/usr/bin/env bash
# Runs the filter's pure-logic unit tests compiled to wasm32 (wasm32-unknown-unknown),
# under Node with wasm-bindgen-test-runner: the decisions tested natively are the ones
# the .wasm makes. Uses rustup's target when installed, else Debian's rustc-web route.
set -euo pipefail
cd "$(dirname "$0")/.."
runner=$(command -v wasm-bindgen-test-runner || echo "$HOME/.cargo/bin/wasm-bindgen-test-runner")
[ -x "$runner" ] || { echo "test-wasm: wasm-bindgen-test-runner missing; run 'make setup'" >&2; exit 1; }
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER="$runner"

if rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    exec cargo test --target wasm32-unknown-unknown -p ratelimit-wasm -p ratelimit-rules -p ratelimit-wire --lib
fi
# The linker as in build-wasm.sh: lld-22's wasm-ld.
PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR=target/wasm-test \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=/usr/lib/llvm-22/bin/wasm-ld \
    exec /usr/bin/cargo test --target wasm32-unknown-unknown -p ratelimit-wasm -p ratelimit-rules -p ratelimit-wire --lib -Zbuild-std=std,panic_abort
