#!/usr/bin/env bash
# Sends a burst with one fresh API key through the running stack and prints each
# response's status and rate-limit headers as a table.
set -euo pipefail
key="demo-$(date +%s)-$RANDOM"
count=${1:-13}
echo "Rule: 10 requests per minute per x-api-key. Sending $count requests with x-api-key: $key"
echo
printf '%-4s %-6s %-8s %-10s %-12s %-12s\n' "#" status limit remaining reset retry-after
for i in $(seq 1 "$count"); do
    headers=$(curl -s -o /dev/null -D - -H "x-api-key: $key" http://127.0.0.1:10000/)
    field() { printf '%s\n' "$headers" | tr -d '\r' | awk -v name="$1" 'tolower($1) == name":" { print $2 }'; }
    status=$(printf '%s\n' "$headers" | awk 'NR == 1 { print $2 }')
    printf '%-4s %-6s %-8s %-10s %-12s %-12s\n' "$i" "$status" "$(field x-ratelimit-limit)" \
        "$(field x-ratelimit-remaining)" "$(field x-ratelimit-reset)" "$(field retry-after)"
done
echo
echo "The body of a refused request:"
curl -s -H "x-api-key: $key" http://127.0.0.1:10000/
echo
