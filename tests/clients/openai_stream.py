"""Streams one chat completion with the official `openai` client, as an application would
(`stream=True`, usage asked for in the final chunk), and prints what the client read as
JSON. tests/cost_from_response.rs runs it against real Envoy.

    openai_stream.py BASE_URL API_KEY COMPLETION_TOKENS PROMPT_TOKENS

The API key goes in `x-api-key` (the rule's key); `x-report`, `x-tokens` and
`x-prompt-tokens` tell the test upstream what to stream (tests/support/upstream.rs).
"""
import json
import sys

import openai

base_url, api_key, completion_tokens, prompt_tokens = sys.argv[1:5]
client = openai.OpenAI(
    base_url=base_url,
    api_key="unused",
    max_retries=0,
    default_headers={
        "x-api-key": api_key,
        "x-report": "openai-stream",
        "x-tokens": completion_tokens,
        "x-prompt-tokens": prompt_tokens,
    },
)
stream = client.chat.completions.create(
    model="test-model",
    messages=[{"role": "user", "content": "Say hello"}],
    stream=True,
    stream_options={"include_usage": True},
)
text, usage = "", None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
    if chunk.usage:
        usage = chunk.usage
print(json.dumps({
    "text": text,
    "prompt_tokens": usage.prompt_tokens,
    "completion_tokens": usage.completion_tokens,
}))
