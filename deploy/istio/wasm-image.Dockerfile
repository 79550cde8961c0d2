# The filter as an OCI image for WasmPlugin's `url: oci://...`: one layer holding
# plugin.wasm, the layout Istio's agent unpacks. The build context is the directory of
# the built module:
#
#   make wasm
#   docker build -f deploy/istio/wasm-image.Dockerfile -t REGISTRY/ratelimit-wasm/filter:TAG \
#       target/wasm32-wasip1/release
#   docker push REGISTRY/ratelimit-wasm/filter:TAG
FROM scratch
COPY ratelimit_wasm.wasm ./plugin.wasm
