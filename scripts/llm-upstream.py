#!/usr/bin/env python3
"""The demo's stand-in for a language-model API: `llm-upstream.py PORT [NAME]`. `stack.sh up`
runs two, the primary (127.0.0.1:8402) and the fallback pool (8403); each names itself in
an `x-upstream` header (NAME, "primary" by default).

It answers each API in its own format, with the tokens the request "used":
- POST /v1/messages: an Anthropic Messages response (`usage.input_tokens`,
  `usage.output_tokens`);
- POST /v1/chat/completions (and any other path, such as the demo's /v1/chat): an OpenAI
  chat completion (`usage.prompt_tokens`, `completion_tokens`, `total_tokens`).
Both also report the total in an `x-usage-tokens` header, which the demo's `llm-tokens`
rule charges (`cost_from_response`). The count is the request's `x-demo-tokens` header, or
40 tokens per word of the body; a quarter of it is output.
"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def model_of(prompt, default):
    try:
        return json.loads(prompt).get("model") or default
    except (ValueError, AttributeError):
        return default


def anthropic_message(model, input_tokens, output_tokens):
    return {"id": "msg_demo", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": "..."}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def openai_completion(model, prompt_tokens, completion_tokens):
    return {"id": "chatcmpl-demo", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "..."}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


class Chat(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        prompt = self.rfile.read(int(self.headers.get("content-length") or 0))
        tokens = int(self.headers.get("x-demo-tokens") or 40 * max(1, len(prompt.split())))
        output = tokens // 4
        path = self.path.split("?", 1)[0]
        if path == "/v1/messages":
            answer = anthropic_message(model_of(prompt, "demo-claude"), tokens - output, output)
        else:
            answer = openai_completion(model_of(prompt, "demo-gpt"), tokens - output, output)
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.send_header("x-usage-tokens", str(tokens))
        self.send_header("x-upstream", NAME)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, *args):
        pass


NAME = sys.argv[2] if len(sys.argv) > 2 else "primary"

if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Chat).serve_forever()
