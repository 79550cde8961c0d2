"""Lets a published client retry a refused request by itself and prints, as JSON, how
long it chose to wait each time and when (its sleeps are recorded, not slept).
tests/client_libraries.rs runs it against real Envoy and compares with what the limiter
decided.

    retry_waits.py openai|urllib3 URL API_KEY

openai: the official client's chat completion (it honours `retry-after-ms`, then
`retry-after`), max_retries 2. urllib3: `Retry(total=2, status_forcelist=[429],
respect_retry_after_header=True)`.
"""
import json
import sys
import time

client, url, api_key = sys.argv[1:4]
waits = []


def record(seconds):
    waits.append({"seconds": seconds, "at": time.time()})


if client == "openai":
    import openai
    import openai._base_client

    openai._base_client.time.sleep = record
    api = openai.OpenAI(base_url=url, api_key="unused", max_retries=2,
                        default_headers={"x-api-key": api_key})
    try:
        api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        outcome = "answered"
    except openai.RateLimitError:
        outcome = "refused"
else:
    import urllib3
    import urllib3.util.retry

    urllib3.util.retry.time.sleep = record
    retry = urllib3.util.Retry(total=2, status_forcelist=[429], respect_retry_after_header=True,
                               backoff_factor=0, raise_on_status=True)
    try:
        urllib3.PoolManager().request("GET", url, headers={"x-api-key": api_key}, retries=retry)
        outcome = "answered"
    except urllib3.exceptions.MaxRetryError:
        outcome = "refused"
print(json.dumps({"outcome": outcome, "waits": waits}))
