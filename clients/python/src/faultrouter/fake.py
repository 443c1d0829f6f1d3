"""A local stand-in for the OpenAI and Anthropic APIs, to try a worker (and test one)
without an API key: `python -m faultrouter.fake [--port 8000]`.

It answers POST /v1/chat/completions and POST /v1/responses as OpenAI does and POST
/v1/messages as Anthropic does. What it answers is chosen by a directive in the last user message:

  [fake:429]           429 with retry-after: 2 (seconds); [fake:429 retry-after=5];
                       [fake:429 retry-after-ms=1500] (retry-after-ms);
                       [fake:429 retry-after-date=5] (an HTTP date 5 s from now)
  [fake:429-once]      429 the first time this exact prompt is seen, an answer afterwards
  [fake:500]           500 server error        [fake:401]  401, invalid API key
  [fake:403]           403, permission denied  [fake:400]  400, invalid request
  [fake:404]           404, no such model      [fake:502]  502 bad gateway
  [fake:timeout]       answers after 5 s (a client with a shorter timeout times out);
                       [fake:timeout=2]
  [fake:refusal]       a refusal: OpenAI's message.refusal, Anthropic's stop_reason refusal
  [fake:content_filter] OpenAI's finish_reason content_filter
  [fake:length]        OpenAI's finish_reason length, the answer cut off
  [fake:cache]         an answer whose Anthropic usage has prompt-cache tokens (100 written,
                       200 read)
  anything else        an answer echoing the prompt, with token usage

A request with "stream": true is answered as the APIs stream (server-sent events): OpenAI's
chat.completion.chunk objects (usage in a last chunk with stream_options.include_usage),
Anthropic's message_start ... message_stop events; a refusal and content_filter stream too.

Point the SDKs at it: OpenAI(base_url="http://127.0.0.1:8000/v1") (or OPENAI_BASE_URL) and
Anthropic(base_url="http://127.0.0.1:8000") (or ANTHROPIC_BASE_URL); any API key does.
"""

from __future__ import annotations

import email.utils
import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DIRECTIVE = re.compile(r"\[fake:([a-z0-9_-]+)(?:[= ]([^\]]*))?\]")
REFUSAL = "I'm sorry, but I can't help with that request."


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up (a timeout)


def _last_user_text(body: dict) -> str:
    if isinstance(body.get("input"), str):  # OpenAI responses
        return body["input"]
    for m in reversed(body.get("messages") or body.get("input") or []):
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

        self.server = _QuietServer((host, port), Handler)
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
        if what in ("429", "500", "502", "401", "403", "404", "400"):
            status = int(what)
            headers = {}
            if status == 429:
                key, _, v = arg.partition("=")
                if key == "retry-after-ms":
                    headers["retry-after-ms"] = v
                elif key == "retry-after-date":
                    headers["retry-after"] = email.utils.formatdate(time.time() + float(v), usegmt=True)
                else:
                    headers["retry-after"] = v if key == "retry-after" else "2"
            return self._send(h, status, self._error(anthropic, status), headers)
        model = body.get("model") or "fake-model"
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            if anthropic:
                return self._send_sse(h, self._message_events(self._message(model, prompt, what)))
            return self._send_sse(h, self._completion_chunks(self._completion(model, prompt, what), usage))
        if anthropic:
            return self._send(h, 200, self._message(model, prompt, what))
        if path.rstrip("/").endswith("/responses"):
            return self._send(h, 200, self._response(model, prompt, what))
        return self._send(h, 200, self._completion(model, prompt, what))

    @staticmethod
    def _error(anthropic: bool, status: int) -> dict:
        kinds = {429: ("rate_limit_error", "rate_limit_exceeded", "Rate limit reached; try again later."),
                 500: ("api_error", "server_error", "The server had an error while processing your request."),
                 401: ("authentication_error", "invalid_api_key", "Incorrect API key provided."),
                 403: ("permission_error", "permission_denied", "You are not allowed to use this model."),
                 404: ("not_found_error", "model_not_found", "The model does not exist."),
                 502: ("api_error", "bad_gateway", "Bad gateway."),
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
        elif what == "length":
            message["content"], finish = '{"order": 12', "length"
        return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}}

    @staticmethod
    def _message(model: str, prompt: str, what: str | None) -> dict:
        refused = what == "refusal"
        content = [] if refused else [{"type": "text", "text": "Echo: " + prompt}]
        usage: dict[str, Any] = {"input_tokens": 12, "output_tokens": 0 if refused else 30}
        if what == "cache":
            usage.update(cache_creation_input_tokens=100, cache_read_input_tokens=200)
        return {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant", "model": model,
                "content": content, "stop_reason": "refusal" if refused else "end_turn", "stop_sequence": None,
                "usage": usage}

    @staticmethod
    def _response(model: str, prompt: str, what: str | None) -> dict:
        part: dict[str, Any] = {"type": "output_text", "text": "Echo: " + prompt, "annotations": []}
        if what == "refusal":
            part = {"type": "refusal", "refusal": REFUSAL}
        return {"id": "resp_" + uuid.uuid4().hex, "object": "response", "created_at": int(time.time()),
                "model": model, "status": "completed", "parallel_tool_calls": True, "tool_choice": "auto",
                "tools": [], "output": [{"type": "message", "id": "msg_" + uuid.uuid4().hex, "role": "assistant",
                                         "status": "completed", "content": [part]}],
                "usage": {"input_tokens": 12, "output_tokens": 30, "total_tokens": 42,
                          "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}

    @staticmethod
    def _completion_chunks(c: dict, usage: bool) -> list[tuple[str | None, Any]]:
        """The chunks OpenAI streams for completion c: the role, the text (or refusal) in two
        pieces, the finish reason, the usage if asked, [DONE]."""
        msg, choice = c["choices"][0]["message"], c["choices"][0]

        def chunk(delta: dict, finish: str | None = None, choices: bool = True, **extra: Any) -> tuple[str | None, Any]:
            return None, {"id": c["id"], "object": "chat.completion.chunk", "created": c["created"], "model": c["model"],
                          "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}] if choices else [],
                          **extra}

        out: list[tuple[str | None, Any]] = [chunk({"role": "assistant", "content": ""})]
        for k in ("content", "refusal"):
            v = msg.get(k)
            if v:
                out += [chunk({k: v[: len(v) // 2]}), chunk({k: v[len(v) // 2:]})]
        out.append(chunk({}, choice["finish_reason"]))
        if usage:
            out.append(chunk({}, choices=False, usage=c["usage"]))
        out.append((None, "[DONE]"))
        return out

    @staticmethod
    def _message_events(m: dict) -> list[tuple[str | None, Any]]:
        """The events Anthropic streams for message m."""
        start = {**m, "content": [], "stop_reason": None, "usage": {**m["usage"], "output_tokens": 1}}
        out: list[tuple[str | None, Any]] = [("message_start", {"type": "message_start", "message": start})]
        for i, block in enumerate(m["content"]):
            text = block["text"]
            out.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                "content_block": {"type": "text", "text": ""}}))
            for piece in (text[: len(text) // 2], text[len(text) // 2:]):
                out.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                    "delta": {"type": "text_delta", "text": piece}}))
            out.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        out.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": m["stop_reason"], "stop_sequence": None},
                                      "usage": {"output_tokens": m["usage"]["output_tokens"]}}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    @staticmethod
    def _send_sse(h: BaseHTTPRequestHandler, events: list[tuple[str | None, Any]]) -> None:
        text = ""
        for name, data in events:
            if name:
                text += f"event: {name}\n"
            text += "data: " + (data if isinstance(data, str) else json.dumps(data)) + "\n\n"
        body = text.encode()
        try:
            h.send_response(200)
            h.send_header("content-type", "text/event-stream")
            h.send_header("content-length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

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
