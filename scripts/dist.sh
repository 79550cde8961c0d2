#!/usr/bin/env bash
# Packs a release from the built filter and shim (`make dist` builds them first) into
# OUT/ratelimit-wasm-VERSION/ (OUT: dist/ by default), VERSION from Cargo.toml's
# [workspace.package]:
#
#   ratelimit_wasm.wasm, ratelimit_wasm.wasm.sha256   the filter and its checksum
#   libratelimit_native.so, libratelimit_native.so.sha256
#                                                      the filter as an Envoy dynamic
#                                                      module (linux x86_64, for the Envoy
#                                                      docs/NATIVE.md names) and its checksum
#   redis-shim                                         the shim (linux x86_64)
#   oci/                                               the filter as an OCI image layout
#                                                      (tag VERSION) that Istio's WasmPlugin
#                                                      pulls once copied to a registry
#   wasmplugin.yaml                                    deploy/istio/wasmplugin.yaml pinned to
#                                                      oci://REGISTRY/ratelimit-wasm/filter:
#                                                      VERSION@sha256:<manifest digest>
#   docker-compose.yml                                 docker-compose.yml with the release's
#                                                      .wasm (run from the repository root)
#   RELEASE-NOTES.md                                   CHANGELOG.md's section for VERSION
#
# The image is the "compat" Wasm image (one application/vnd.oci.image.layer.v1.tar+gzip
# layer holding plugin.wasm, what deploy/istio/wasm-image.Dockerfile builds): Istio's
# image fetcher accepts it in every version, while a CNCF wasm artifact
# (application/vnd.wasm.content.layer.v1+wasm) is not among the formats it reads.
#
#   REGISTRY=registry.example.com scripts/dist.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
registry=${REGISTRY:-registry.example.com}
wasm=target/wasm32-wasip1/release/ratelimit_wasm.wasm
shim=target/shim/redis-shim
native=target/shim/libratelimit_native.so
for built in "$wasm" "$shim" "$native"; do
    [ -f "$built" ] || { echo "dist: $built is missing: run 'make build' first" >&2; exit 1; }
done
exec python3 scripts/dist.py "$out" "$registry" "$wasm" "$shim" "$native"
