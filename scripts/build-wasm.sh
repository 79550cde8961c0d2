#!/usr/bin/env bash
# Builds the filter for wasm32-wasip1 into target/wasm32-wasip1/release/ratelimit_wasm.wasm.
#
# Prefers a toolchain with an installed wasm32-wasip1 target; otherwise uses Debian's
# rustc-web with -Zbuild-std (see scripts/setup.sh). The Debian route builds in its own
# target directory so the two compilers never rebuild each other's host artifacts.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/wasm32-wasip1/release/ratelimit_wasm.wasm

if rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
    cargo build --quiet --release --target wasm32-wasip1 -p ratelimit-wasm
    exit 0
fi

if [ ! -x /usr/bin/cargo ] || [ ! -d /usr/lib/rustlib/src/rust ]; then
    echo "build-wasm: no wasm32-wasip1 toolchain; run 'make setup' first" >&2
    exit 1
fi
# std without its default features: its backtrace support (object, gimli, addr2line) has
# nothing to read on wasm32 and was about a tenth of this build's CPU. The linker is lld-22's
# wasm-ld, the binary rustc-web's rust-lld links to, named directly: rust-lld's package
# (rust-web-llvm) would bring llvm-22's tools too, about 95 MB for a first run to unpack.
PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
RUSTFLAGS="-L /usr/lib/wasm32-wasi" CARGO_TARGET_DIR=target/wasm-debian \
CARGO_TARGET_WASM32_WASIP1_LINKER=/usr/lib/llvm-22/bin/wasm-ld \
    /usr/bin/cargo build --quiet --release --target wasm32-wasip1 -p ratelimit-wasm \
    -Zbuild-std=std,panic_abort -Zbuild-std-features=
mkdir -p "$(dirname "$out")"
cp target/wasm-debian/wasm32-wasip1/release/ratelimit_wasm.wasm "$out"
