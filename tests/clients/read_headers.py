"""Sends requests as a client would and prints, one JSON line each, what the published
`ratelimit-headers` parser (PyPI) read from the response. tests/client_libraries.rs runs
it against real Envoy and compares with what the limiter decided.

    read_headers.py URL API_KEY REQUESTS
"""
import json
import sys
import time
import urllib.error
import urllib.request

import ratelimit_headers

url, api_key, requests = sys.argv[1], sys.argv[2], int(sys.argv[3])
for _ in range(requests):
    request = urllib.request.Request(url, headers={"x-api-key": api_key})
    try:
        with urllib.request.urlopen(request) as response:
            status, headers = response.status, dict(response.headers.items())
    except urllib.error.HTTPError as refusal:
        status, headers = refusal.code, dict(refusal.headers.items())
    state = ratelimit_headers.parse(response_headers=headers)
    print(json.dumps({
        "status": status,
        "limit": state.limit,
        "remaining": state.remaining,
        "reset": state.reset.timestamp() if state.reset else None,
        "received_at": time.time(),
    }), flush=True)
