#!/usr/bin/env bash
# Builds the previous release's shim and filter from git, for the version-skew test
# (tests/version_skew.rs): its sources at target/previous/<commit>/src, built there with
# their own build scripts and target directory, once per commit (a second run only
# prints the paths). Prints two lines: SHIM=<path> and WASM=<path>.
#
# `make test` starts it beside its own builds and the version-skew test runs it again:
# one run at a time (a lock), so the test's waits for make's and finds the build done.
# The shim is built with today's shim profile, in a target directory seeded with a copy
# of today's (`make shim`'s and the filter's): the crates both releases use at the same
# version and features are not compiled again.
#
# The release is the tag PREVIOUS_RELEASE (default below); a clone without the tag
# falls back to the tag's commit.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/wasm-toolchain.sh
tag=${PREVIOUS_RELEASE:-v0.1.0}
tag_commit=f9a62d90b611d99d1c8d48854bbaa0bd5931518e # v0.1.0
if ! commit=$(git rev-parse --verify --quiet "$tag^{commit}"); then
    [ "$tag" = v0.1.0 ] || { echo "build-previous: no tag $tag in this clone" >&2; exit 1; }
    commit=$tag_commit
    git cat-file -e "$commit^{commit}" 2>/dev/null || {
        echo "build-previous: neither tag $tag nor commit $commit is in this clone (git fetch --tags)" >&2
        exit 1
    }
fi
dir=target/previous/$commit
shim=$dir/src/target/shim/redis-shim
wasm=$dir/src/target/wasm32-wasip1/release/ratelimit_wasm.wasm
mkdir -p target/previous
exec 9>"target/previous/$commit.lock"
flock 9
if [ ! -f "$dir/built" ]; then
    # What an interrupted build left, if any.
    rm -rf "$dir/src" "$dir/index" "$dir/index.lock"
    mkdir -p "$dir/src"
    # The commit's files through an index of its own: the repository's index, HEAD and
    # worktree list stay untouched.
    GIT_INDEX_FILE=$(pwd)/$dir/index git read-tree "$commit"
    GIT_INDEX_FILE=$(pwd)/$dir/index git --work-tree="$dir/src" checkout-index --all
    started=$(date +%s)
    # On Debian's route its build-wasm.sh links with rust-lld, which setup no longer
    # installs: it gets the linker today's build-wasm.sh uses (its own build-wasm.sh sets
    # the rest of the route).
    if ! has_rustup_target wasm32-wasip1; then
        export CARGO_TARGET_WASM32_WASIP1_LINKER=$WASM_LINKER
    fi
    # Today's [profile.shim] sections (the previous release has none of its own): the
    # copied crates' fingerprints match only under the same profile.
    sed -n '/^\[profile\.shim[].]/,/^$/p' Cargo.toml >>"$dir/src/Cargo.toml"
    mkdir -p "$dir/src/target"
    for built in target/shim target/wasm-debian; do
        if [ -d "$built" ]; then cp -a "$built" "$dir/src/target/"; fi
    done
    (cd "$dir/src" && cargo build --quiet --locked --profile shim -p redis-shim && scripts/build-wasm.sh)
    echo "build-previous: built $tag ($commit) in $(($(date +%s) - started)) s" >&2
    echo "$commit" >"$dir/built"
fi
echo "SHIM=$(pwd)/$shim"
echo "WASM=$(pwd)/$wasm"
