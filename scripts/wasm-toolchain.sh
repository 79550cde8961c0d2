# Sourced by every script that builds for wasm32 (scripts/build-wasm.sh,
# scripts/test-wasm.sh, scripts/build-previous.sh, bench/build-passthrough.sh): which
# route builds wasm32 on this machine, in one place.
#
#   has_rustup_target TARGET   whether rustup has TARGET installed: plain cargo builds it.
#   debian_route WHO           otherwise: exports what Debian's rustc-web route needs (its
#                              cargo and rustc first, -Zbuild-std allowed, the linker of
#                              both wasm32 targets), or fails naming WHO when it is missing.
#
# The linker is lld-22's wasm-ld, the binary rustc-web's rust-lld links to, named
# directly: rust-lld's package (rust-web-llvm) would bring llvm-22's tools too, about
# 95 MB for a first run to unpack. scripts/tools.txt names it for setup.
WASM_LINKER=/usr/lib/llvm-22/bin/wasm-ld

has_rustup_target() {
    rustup target list --installed 2>/dev/null | grep -qx "$1"
}

debian_route() {
    if [ ! -x /usr/bin/cargo ] || [ ! -d /usr/lib/rustlib/src/rust ] || [ ! -x "$WASM_LINKER" ]; then
        echo "$1: no wasm32 toolchain; run 'make setup' first" >&2
        return 1
    fi
    export PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
    export CARGO_TARGET_WASM32_WASIP1_LINKER=$WASM_LINKER
    export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=$WASM_LINKER
}
