#!/usr/bin/env python3
"""The demo's stand-in for a language-model API (`stack.sh up` runs it on 127.0.0.1:8402).

POST /v1/chat answers with the tokens the request "used", reported the way real APIs
report them: in the JSON body (`usage.total_tokens`) and in an `x-usage-tokens` header.
The count is the request's `x-demo-tokens` header, or 40 tokens per word of the body.
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Chat(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        prompt = self.rfile.read(int(self.headers.get("content-length") or 0))
        tokens = int(self.headers.get("x-demo-tokens") or 40 * max(1, len(prompt.split())))
        body = json.dumps({"choices": [{"message": {"content": "..."}}],
                           "usage": {"total_tokens": tokens}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.send_header("x-usage-tokens", str(tokens))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Chat).serve_forever()
