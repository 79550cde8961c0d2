#!/usr/bin/env bash
# Builds the filter for wasm32-wasip1 into target/wasm32-wasip1/release/ratelimit_wasm.wasm.
#
# Prefers a toolchain with an installed wasm32-wasip1 target; otherwise uses Debian's
# rustc-web with -Zbuild-std (see scripts/setup.sh, scripts/wasm-toolchain.sh). The Debian
# route builds in its own target directory so the two compilers never rebuild each other's
# host artifacts.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/wasm-toolchain.sh
out=target/wasm32-wasip1/release/ratelimit_wasm.wasm

if has_rustup_target wasm32-wasip1; then
    cargo build --quiet --release --target wasm32-wasip1 -p ratelimit-wasm
    exit 0
fi

debian_route build-wasm
# std without its default features: its backtrace support (object, gimli, addr2line) has
# nothing to read on wasm32 and was about a tenth of this build's CPU.
RUSTFLAGS="-L /usr/lib/wasm32-wasi" CARGO_TARGET_DIR=target/wasm-debian \
    /usr/bin/cargo build --quiet --release --target wasm32-wasip1 -p ratelimit-wasm \
    -Zbuild-std=std,panic_abort -Zbuild-std-features=
mkdir -p "$(dirname "$out")"
cp target/wasm-debian/wasm32-wasip1/release/ratelimit_wasm.wasm "$out"
