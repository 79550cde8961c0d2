#!/bin/sh
# Writes a new shared token for the shim and its callers, next to kustomization.yaml:
#   shim-token.env          RLSHIM_TOKEN=<token>, the Secret the shim reads it from
#   shim-token-patch.yaml   the same token as the WasmPlugin's pluginConfig.shim_token
# Both are git-ignored. Run it before the first `kubectl apply -k deploy/istio`, and again
# (then apply again) to rotate the token: docs/ISTIO.md, "The shared token".
set -eu
cd "$(dirname "$0")"
# 32 random bytes as 64 hex digits: nothing to quote in YAML, env files or headers.
token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
umask 077
printf 'RLSHIM_TOKEN=%s\n' "$token" > shim-token.env
cat > shim-token-patch.yaml <<PATCH
# Written by generate-token.sh: the shim's shared token for the filter at the gateway.
# The shim reads the same token from the Secret generated out of shim-token.env.
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata:
  name: ratelimit
  namespace: istio-system
spec:
  pluginConfig:
    shim_token: "$token"
PATCH
echo "wrote $(pwd)/shim-token.env and shim-token-patch.yaml; now: kubectl apply -k $(pwd)"
