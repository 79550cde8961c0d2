#!/usr/bin/env bash
# `stack.sh up` starts Redis (127.0.0.1:8401), the shim (8400), the demo's language-model
# upstream (8402, scripts/llm-upstream.py) and its fallback pool (8403, the same script),
# and Envoy (10000, admin 9901, envoy.yaml; with HOST=native, envoy-native.yaml and the
# filter as a dynamic module from target/shim) in the background and waits until each is ready; `stack.sh down`
# stops exactly the processes `up` started (their pids are kept in .run/).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=.run
REDIS_PORT=8401 SHIM_PORT=8400 LLM_PORT=8402 FALLBACK_PORT=8403 ENVOY_PORT=10000 ADMIN_PORT=9901
case "${HOST:-wasm}" in
    wasm) ENVOY_CONFIG=envoy.yaml FILTER_LOG=wasm ;;
    native)
        ENVOY_CONFIG=envoy-native.yaml FILTER_LOG=dynamic_modules
        export ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$PWD/target/shim"
        ;;
    *) echo "stack: HOST=$HOST is not a host: wasm (the default) or native" >&2; exit 2 ;;
esac

wait_for() { # description, command...
    local what=$1; shift
    for _ in $(seq 1 100); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "stack: $what did not become ready; see $RUN/*.log" >&2
    return 1
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

up() {
    mkdir -p "$RUN"
    for port in $REDIS_PORT $SHIM_PORT $LLM_PORT $FALLBACK_PORT $ENVOY_PORT $ADMIN_PORT; do
        port_free "$port" || { echo "stack: port $port is in use (is the stack already up? 'make down')" >&2; exit 1; }
    done
    redis-server --port $REDIS_PORT --bind 127.0.0.1 --save "" --appendonly no \
        --logfile "$PWD/$RUN/redis.log" --daemonize yes --pidfile "$PWD/$RUN/redis.pid"
    wait_for "Redis" redis-cli -p $REDIS_PORT ping

    target/shim/redis-shim --listen 127.0.0.1:$SHIM_PORT --redis-url redis://127.0.0.1:$REDIS_PORT \
        </dev/null >"$RUN/shim.log" 2>&1 &
    echo $! >"$RUN/shim.pid"
    wait_for "the shim" curl -sf http://127.0.0.1:$SHIM_PORT/readyz

    python3 scripts/llm-upstream.py $LLM_PORT primary </dev/null >"$RUN/llm.log" 2>&1 &
    echo $! >"$RUN/llm.pid"
    wait_for "the language-model upstream" curl -sf -X POST http://127.0.0.1:$LLM_PORT/v1/chat
    python3 scripts/llm-upstream.py $FALLBACK_PORT fallback </dev/null >"$RUN/fallback.log" 2>&1 &
    echo $! >"$RUN/fallback.pid"
    wait_for "the fallback upstream" curl -sf -X POST http://127.0.0.1:$FALLBACK_PORT/generate

    # Envoy stops when its parent process exits (it asks the kernel for SIGTERM on its
    # parent's death), so it runs under a shell that stays; stopping that shell stops it.
    sh -c ".venv/bin/envoy -c $ENVOY_CONFIG --concurrency 2 --use-dynamic-base-id --log-level warn \
        --component-log-level $FILTER_LOG:info >$RUN/envoy.log 2>&1" </dev/null >/dev/null 2>&1 &
    echo $! >"$RUN/envoy.pid"
    wait_for "Envoy" sh -c "curl -sf http://127.0.0.1:$ADMIN_PORT/ready | grep -q LIVE"

    echo "Redis  redis://127.0.0.1:$REDIS_PORT"
    echo "shim   http://127.0.0.1:$SHIM_PORT  (POST /v1/check and /v1/check-batch, GET /readyz, GET /metrics)"
    echo "LLM    http://127.0.0.1:$LLM_PORT  (POST /v1/chat: the demo's upstream that reports tokens)"
    echo "spill  http://127.0.0.1:$FALLBACK_PORT  (the fallback pool gpu-pool spills /generate over to)"
    echo "Envoy  http://127.0.0.1:$ENVOY_PORT  (admin http://127.0.0.1:$ADMIN_PORT; $ENVOY_CONFIG)"
    echo "logs   $RUN/"
}

down() {
    for name in envoy fallback llm shim redis; do
        if [ -f "$RUN/$name.pid" ]; then
            pid=$(cat "$RUN/$name.pid")
            kill "$pid" 2>/dev/null || true
            # Wait for the ports to be released, so `make up` can follow at once.
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            rm -f "$RUN/$name.pid"
        fi
    done
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
