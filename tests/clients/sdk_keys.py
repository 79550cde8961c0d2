"""Drives an official SDK with its own way of sending its key until the limiter refuses it,
printing one JSON line per request. tests/sdk_keys.rs runs it through real Envoy with the
demo's configuration.

    sdk_keys.py openai|anthropic|anthropic-bearer BASE_URL KEY TOKENS COUNT

openai: `OpenAI(api_key=KEY)`, a chat completion (`Authorization: Bearer KEY`).
anthropic: `Anthropic(api_key=KEY)`, a message (`x-api-key: KEY`).
anthropic-bearer: `Anthropic(auth_token=KEY)`, a message (`Authorization: Bearer KEY`).
Each request asks the demo's upstream to report TOKENS tokens (`x-demo-tokens`); no SDK
retries by itself (max_retries 0). Stops after the first refusal or COUNT requests.
"""
import json
import sys

client, base_url, key, tokens, count = sys.argv[1:6]
headers = {"x-demo-tokens": tokens}
messages = [{"role": "user", "content": "hi"}]

if client == "openai":
    import openai

    api = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0,
                        default_headers=headers)
    RateLimitError = openai.RateLimitError

    def call():
        answer = api.chat.completions.create(model="gpt-demo", messages=messages)
        return answer.usage.total_tokens
else:
    import anthropic

    credentials = {"auth_token": key} if client == "anthropic-bearer" else {"api_key": key}
    api = anthropic.Anthropic(base_url=base_url, max_retries=0, default_headers=headers,
                              **credentials)
    RateLimitError = anthropic.RateLimitError

    def call():
        answer = api.messages.create(model="claude-demo", max_tokens=16, messages=messages)
        return answer.usage.input_tokens + answer.usage.output_tokens

for n in range(1, int(count) + 1):
    try:
        print(json.dumps({"n": n, "outcome": "answered", "tokens": call()}), flush=True)
    except RateLimitError as refused:
        response = refused.response
        print(json.dumps({"n": n, "outcome": "refused", "status": response.status_code,
                          "retry_after": response.headers.get("retry-after"),
                          "body": response.json()}), flush=True)
        break
