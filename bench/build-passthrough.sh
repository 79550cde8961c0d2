#!/usr/bin/env bash
# Builds the pass-through wasm filter (bench/passthrough) to
# bench/passthrough/target/passthrough.wasm, the same way scripts/build-wasm.sh builds
# the real filter: an installed wasm32-wasip1 target if there is one, else Debian's
# rustc-web with -Zbuild-std.
set -euo pipefail
cd "$(dirname "$0")/passthrough"
out=target/passthrough.wasm

if rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
    cargo build --quiet --release --target wasm32-wasip1
    cp target/wasm32-wasip1/release/bench_passthrough.wasm "$out"
    exit 0
fi
if [ ! -x /usr/bin/cargo ] || [ ! -d /usr/lib/rustlib/src/rust ]; then
    echo "build-passthrough: no wasm32-wasip1 toolchain; run 'make setup' first" >&2
    exit 1
fi
PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
RUSTFLAGS="-L /usr/lib/wasm32-wasi" CARGO_TARGET_DIR=target/debian \
    /usr/bin/cargo build --quiet --release --target wasm32-wasip1 -Zbuild-std=std,panic_abort
cp target/debian/wasm32-wasip1/release/bench_passthrough.wasm "$out"
