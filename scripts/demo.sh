#!/usr/bin/env bash
# Sends traffic through the running demo stack (envoy.yaml) and prints each response's
# status and rate-limit headers as a table.
set -euo pipefail
url=http://127.0.0.1:10000
admin=http://127.0.0.1:9901
run_id="$(date +%s)-$RANDOM"

row() { # label, then curl arguments
    local label=$1; shift
    local headers status
    headers=$(curl -s -o /dev/null -D - "$@")
    last_headers=$headers
    field() { printf '%s\n' "$headers" | tr -d '\r' | awk -v name="$1" 'tolower($1) == name":" { $1 = ""; print substr($0, 2) }'; }
    status=$(printf '%s\n' "$headers" | awk 'NR == 1 { print $2 }')
    printf '%-14s %-6s %-6s %-10s %-11s %-12s %s\n' "$label" "$status" "$(field x-ratelimit-limit)" \
        "$(field x-ratelimit-remaining)" "$(field x-ratelimit-reset)" "$(field retry-after)" "$(field ratelimit)"
}
heading() {
    echo
    echo "$1"
    printf '%-14s %-6s %-6s %-10s %-11s %-12s %s\n' request status limit remaining reset retry-after "RateLimit (draft-7)"
}

key="demo-$run_id"
heading "13 requests with one API key (per-api-key: 10 per minute)"
for i in $(seq 1 13); do row "GET / #$i" -H "x-api-key: $key" "$url/"; done

heading "A premium key (prefix vip:) gets 100 per minute from the same rule"
row "GET /" -H "x-api-key: vip:$run_id" "$url/"

heading "An export costs 5 tokens"
for i in 1 2 3; do row "GET /export #$i" -H "x-api-key: export-$run_id" "$url/export"; done

heading "GET /search: 3 per minute per client address (a sliding window log)"
for i in 1 2 3 4; do row "GET /search #$i" "$url/search?q=$i"; done

heading "POST /v1/chat: 1000 tokens per minute, admitted on an estimate of 100, charged what the answer used"
chat_key="llm-$run_id"
for tokens in 300 500 400 50; do
    row "chat ${tokens}tok" -X POST -H "x-api-key: $chat_key" -H "x-demo-tokens: $tokens" "$url/v1/chat"
    # The settlement travels with the worker's next call to the shim; give it that moment.
    sleep 0.2
done
echo "(the third answer's 400 tokens put the key 200 in debt: the fourth is refused until it refills)"

echo
echo "POST /generate: 5 per minute per tenant on the primary pool, then spilled over to the fallback (gpu-pool, on_exceeded)"
printf '%-16s %-6s %-10s %-10s %s\n' request status upstream remaining x-ratelimit-spilled
tenant="tenant-$run_id"
for i in $(seq 1 7); do
    headers=$(curl -s -o /dev/null -D - -X POST -H "x-tenant: $tenant" "$url/generate" | tr -d '\r')
    field() { printf '%s\n' "$headers" | awk -v name="$1" 'tolower($1) == name":" { $1 = ""; print substr($0, 2) }'; }
    printf '%-16s %-6s %-10s %-10s %s\n' "generate #$i" "$(printf '%s\n' "$headers" | awk 'NR == 1 { print $2 }')" \
        "$(field x-upstream)" "$(field x-ratelimit-remaining)" "$(field x-ratelimit-spilled)"
done
echo "(past its 5, the tenant is served by the fallback pool instead of refused; the spilled requests are not charged to gpu-pool)"

heading "GET /slow takes 2 s: at most 2 in flight per API key (slow-in-flight, a concurrency limit)"
slow_key="slow-$run_id"
curl -s -o /dev/null -H "x-api-key: $slow_key" "$url/slow" &
first=$!
curl -s -o /dev/null -H "x-api-key: $slow_key" "$url/slow" &
second=$!
# Until both are in flight: past the rate limiter, held by the fault filter's delay.
for _ in $(seq 1 100); do
    active=$(curl -s "$admin/stats?filter=demo.fault.active_faults" | awk '{ print $2 }')
    [ "${active:-0}" -ge 2 ] && break
    sleep 0.05
done
row "GET /slow #3" -H "x-api-key: $slow_key" "$url/slow"
printf '%s\n' "$last_headers" | tr -d '\r' | awk 'tolower($0) ~ /^ratelimit-policy:/ { print "    " $0 }'
wait "$first" "$second"
echo "    (#1 and #2 ended: their slots are free again)"
row "GET /slow #4" -H "x-api-key: $slow_key" "$url/slow"

heading "A daily quota (daily: 3 per calendar day per x-daily-key, resetting at midnight at UTC-03:30)"
for i in 1 2 3 4; do row "GET / #$i" -H "x-daily-key: daily-$run_id" "$url/"; done
# The next midnight at -03:30 (the POSIX zone "<-0330>3:30"), which Retry-After, the
# RateLimit reset and X-RateLimit-Reset above point at.
midnight=$(TZ='<-0330>3:30' date -d 'tomorrow 00:00' +%s)
echo "Next midnight at -03:30: $(date -u -d "@$midnight" '+%F %T UTC') = X-RateLimit-Reset $midnight, in $((midnight - $(date +%s))) s"

echo
echo "The body of a refused request:"
curl -s -H "x-api-key: $key" "$url/"
echo
echo "The body of a refused daily request:"
curl -s -H "x-daily-key: daily-$run_id" "$url/"
echo
