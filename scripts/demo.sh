#!/usr/bin/env bash
# Sends traffic through the running demo stack (envoy.yaml) and prints each response's
# status and rate-limit headers as a table.
set -euo pipefail
url=http://127.0.0.1:10000
run_id="$(date +%s)-$RANDOM"

row() { # label, then curl arguments
    local label=$1; shift
    local headers status
    headers=$(curl -s -o /dev/null -D - "$@")
    field() { printf '%s\n' "$headers" | tr -d '\r' | awk -v name="$1" 'tolower($1) == name":" { $1 = ""; print substr($0, 2) }'; }
    status=$(printf '%s\n' "$headers" | awk 'NR == 1 { print $2 }')
    printf '%-14s %-6s %-6s %-10s %-11s %-12s %s\n' "$label" "$status" "$(field x-ratelimit-limit)" \
        "$(field x-ratelimit-remaining)" "$(field x-ratelimit-reset)" "$(field retry-after)" "$(field ratelimit)"
}
heading() {
    echo
    echo "$1"
    printf '%-14s %-6s %-6s %-10s %-11s %-12s %s\n' request status limit remaining reset retry-after "RateLimit (IETF draft)"
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

heading "A daily quota (daily: 3 per calendar day per x-daily-key, resetting at midnight at UTC-03:30)"
for i in 1 2 3 4; do row "GET / #$i" -H "x-daily-key: daily-$run_id" "$url/"; done
# The next midnight at -03:30 (the POSIX zone "<-0330>3:30"), which Retry-After, the
# draft's t and X-RateLimit-Reset above point at.
midnight=$(TZ='<-0330>3:30' date -d 'tomorrow 00:00' +%s)
echo "Next midnight at -03:30: $(date -u -d "@$midnight" '+%F %T UTC') = X-RateLimit-Reset $midnight, in $((midnight - $(date +%s))) s"

echo
echo "The body of a refused request:"
curl -s -H "x-api-key: $key" "$url/"
echo
echo "The body of a refused daily request:"
curl -s -H "x-daily-key: daily-$run_id" "$url/"
echo
