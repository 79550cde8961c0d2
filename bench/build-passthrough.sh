#!/usr/bin/env bash
# Builds the pass-through wasm filter (bench/passthrough) to
# bench/passthrough/target/passthrough.wasm, the same way scripts/build-wasm.sh builds
# the real filter: an installed wasm32-wasip1 target if there is one, else Debian's
# rustc-web with -Zbuild-std (scripts/wasm-toolchain.sh).
set -euo pipefail
cd "$(dirname "$0")/passthrough"
. ../../scripts/wasm-toolchain.sh
out=target/passthrough.wasm

if has_rustup_target wasm32-wasip1; then
    cargo build --quiet --release --target wasm32-wasip1
    cp target/wasm32-wasip1/release/bench_passthrough.wasm "$out"
    exit 0
fi
debian_route build-passthrough
RUSTFLAGS="-L /usr/lib/wasm32-wasi" CARGO_TARGET_DIR=target/debian \
    /usr/bin/cargo build --quiet --release --target wasm32-wasip1 -Zbuild-std=std,panic_abort
cp target/debian/wasm32-wasip1/release/bench_passthrough.wasm "$out"
