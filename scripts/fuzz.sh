#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for SECONDS each (default 60): `make fuzz` for a long
# run, `make test` for a few seconds; `fuzz.sh build` only builds them (`make test` does
# it beside its other work, so that the run at its end starts at once). cargo-fuzz needs
# nightly features; RUSTC_BOOTSTRAP lets the stable toolchain use them. A crash fails the
# run and leaves its input in fuzz/artifacts/TARGET/ (replay: cargo fuzz run TARGET
# fuzz/artifacts/TARGET/crash-...); turn it into a regression test before fixing it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
export PATH="$HOME/.cargo/bin:$PATH" RUSTC_BOOTSTRAP=1
if [ "$seconds" = build ]; then
    exec cargo fuzz build
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in $(cargo fuzz list); do
    echo "fuzz: $target for ${seconds}s"
    if ! cargo fuzz run "$target" -- -max_total_time="$seconds" >"$log" 2>&1; then
        cat "$log"
        echo "fuzz: $target failed" >&2
        exit 1
    fi
    grep -E "^Done [0-9]+ runs" "$log" || tail -n 1 "$log"
done
