"""A local stand-in for the OpenAI and Anthropic APIs, to try a worker (and test one)
without an API key: `python -m faultrouter.fake [--port 8000]`.

It answers POST /v1/chat/completions as OpenAI does and POST /v1/messages as Anthropic
does. What it answers is chosen by a directive in the last user message:

  [fake:429]           429 with retry-after: 2 (seconds); [fake:429 retry-after=5]
  [fake:429-once]      429 the first time this exact prompt is seen, an answer afterwards
  [fake:500]           500 server error        [fake:401]  401, invalid API key
  [fake:403]           403, permission denied  [fake:400]  400, invalid request
  [fake:timeout]       answers after 5 s (a client with a shorter timeout times out);
                       [fake:timeout=2]
  [fake:refusal]       a refusal: OpenAI's message.refusal, Anthropic's stop_reason refusal
  [fake:content_filter] OpenAI's finish_reason content_filter
  anything else        an answer echoing the prompt, with token usage

Point the SDKs at it: OpenAI(base_url="http://127.0.0.1:8000/v1") (or OPENAI_BASE_URL) and
Anthropic(base_url="http://127.0.0.1:8000") (or ANTHROPIC_BASE_URL); any API key does.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DIRECTIVE = re.compile(r"\[fake:([a-z0-9_-]+)(?:[= ]([^\]]*))?\]")
REFUSAL = "I'm sorry, but I can't help with that request."


def _last_user_text(body: dict) -> str:
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, str):
                return c
            if isinstance(c, list):
                return " ".join(p.get("text", "") for p in c if isinstance(p, dict))
    return ""


class FakeAPI:
    """The server; start() runs it on a thread and returns it. requests lists
    (path, directive) of every request received, in order."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.requests: list[tuple[str, str | None]] = []
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                api.handle(self, self.path, body)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.handle_error = lambda request, address: None  # a client that hung up
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"

    def start(self) -> "FakeAPI":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "FakeAPI":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def handle(self, h: BaseHTTPRequestHandler, path: str, body: dict) -> None:
        anthropic = path.rstrip("/").endswith("/messages")
        prompt = _last_user_text(body)
        m = DIRECTIVE.search(prompt)
        what, arg = (m.group(1), (m.group(2) or "").strip()) if m else (None, "")
        with self.lock:
            self.requests.append((path, what))
            first = prompt not in self.seen
            self.seen.add(prompt)
        if what == "429-once":
            what = "429" if first else None
        if what == "timeout":
            time.sleep(float(arg or 5))
            what = None
        if what in ("429", "500", "401", "403", "400"):
            status = int(what)
            headers = {}
            if status == 429:
                secs = arg.split("=", 1)[1] if arg.startswith("retry-after=") else "2"
                headers["retry-after"] = secs
            return self._send(h, status, self._error(anthropic, status), headers)
        model = body.get("model") or "fake-model"
        if anthropic:
            return self._send(h, 200, self._message(model, prompt, refused=what == "refusal"))
        return self._send(h, 200, self._completion(model, prompt, what))

    @staticmethod
    def _error(anthropic: bool, status: int) -> dict:
        kinds = {429: ("rate_limit_error", "rate_limit_exceeded", "Rate limit reached; try again later."),
                 500: ("api_error", "server_error", "The server had an error while processing your request."),
                 401: ("authentication_error", "invalid_api_key", "Incorrect API key provided."),
                 403: ("permission_error", "permission_denied", "You are not allowed to use this model."),
                 400: ("invalid_request_error", "invalid_value", "Invalid value for 'messages'.")}
        kind, code, msg = kinds[status]
        if anthropic:
            return {"type": "error", "error": {"type": kind, "message": msg}}
        return {"error": {"message": msg, "type": kind, "param": None, "code": code}}

    @staticmethod
    def _completion(model: str, prompt: str, what: str | None) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": "Echo: " + prompt, "refusal": None}
        finish = "stop"
        if what == "refusal":
            message.update(content=None, refusal=REFUSAL)
        elif what == "content_filter":
            message["content"], finish = None, "content_filter"
        return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}}

    @staticmethod
    def _message(model: str, prompt: str, refused: bool) -> dict:
        content = [] if refused else [{"type": "text", "text": "Echo: " + prompt}]
        return {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant", "model": model,
                "content": content, "stop_reason": "refusal" if refused else "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 12, "output_tokens": 0 if refused else 30}}

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, obj: dict, headers: dict | None = None) -> None:
        data = json.dumps(obj).encode()
        try:
            h.send_response(status)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout)


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m faultrouter.fake", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    a = p.parse_args(argv)
    api = FakeAPI(a.host, a.port)
    print(f"fake OpenAI and Anthropic APIs at {api.url}:\n"
          f"  export OPENAI_BASE_URL={api.url}/v1 OPENAI_API_KEY=fake\n"
          f"  export ANTHROPIC_BASE_URL={api.url} ANTHROPIC_API_KEY=fake", flush=True)
    try:
        api.server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
