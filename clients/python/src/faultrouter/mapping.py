"""How an SDK's outcome becomes a TaskEvent's fields (stage, status, error, output, usage).

| outcome (OpenAI and Anthropic SDKs)        | stage    | error.type, http_status, code                 | router's class by default |
|--------------------------------------------|----------|-----------------------------------------------|---------------------------|
| RateLimitError (429)                       | NETWORK  | RateLimitError, 429, retry_after_ms from      | RATE_LIMITED              |
|                                            |          | retry-after-ms / retry-after                  |                           |
| APITimeoutError                            | NETWORK  | APITimeoutError, -, timeout                   | NETWORK_TIMEOUT           |
| APIConnectionError                         | NETWORK  | APIConnectionError, -, connection_reset       | NETWORK_TIMEOUT           |
| InternalServerError and other 5xx          | NETWORK  | the class, the status, the body's code        | 502-504: NETWORK_TIMEOUT; |
|                                            |          |                                               | others UNCLASSIFIED       |
| AuthenticationError (401)                  | PROTOCOL | AuthenticationError, 401, the body's code     | AUTH_FAILED               |
| PermissionDeniedError (403)                | PROTOCOL | PermissionDeniedError, 403, the body's code   | AUTH_FAILED               |
| BadRequestError (400)                      | PROTOCOL | BadRequestError, 400, the body's code         | INPUT_QUALITY_ISSUE       |
| other 4xx                                  | PROTOCOL | the class, the status, the body's code        | by the policy             |
| a refusal: message.refusal, finish_reason  | MODEL    | Refusal, -, refusal or content_filter;        | MODEL_REFUSAL             |
| content_filter, stop_reason refusal        |          | output.text the refusal, confidence 0         |                           |
| output that fails the caller's schema      | MODEL    | the exception's class, -, its code or         | SCHEMA_VIOLATION (a       |
| (OutputInvalid, pydantic ValidationError,  |          | schema_violation; output.schema_valid false   | CODE_1xxx/2xxx code:      |
| json.JSONDecodeError; a structured answer  |          | (LengthFinishReasonError for a structured     | VALIDATION_FIXABLE)       |
| cut off: finish_reason length)             |          | answer cut off)                               |                           |
| any other exception                        | null     | its class, -, -                               | UNCLASSIFIED, or by type  |
| an answer                                  | MODEL    | status OK; output.text, model, tokens, cost   | SUCCEEDED                 |

A refusal carries output.confidence 0 so that the router's refusal rule (confidence below
its minimum) holds whatever words the model refused in.
"""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any

TEXT_LIMIT = 2000  # output.text is cut to this many characters: records stay small


class OutputInvalid(Exception):
    """Raise it (in an attempt, or from instrument's validate) when the model's output fails
    your schema or validator; code is a validator code such as CODE_2101 (a fixable one is
    retried with feedback) or None for a plain schema violation."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


def _status(exc: BaseException) -> int | None:
    s = getattr(exc, "status_code", None)
    return s if isinstance(s, int) else None


def _headers(exc: BaseException) -> Any:
    resp = getattr(exc, "response", None)
    return getattr(resp, "headers", None) or {}


def _body_code(exc: BaseException) -> str | None:
    code = getattr(exc, "code", None)  # OpenAI: the error object's code
    if isinstance(code, str) and code:
        return code
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            for k in ("code", "type"):
                if isinstance(err.get(k), str) and err[k]:
                    return err[k]
    return None


def retry_after_ms(headers: Any) -> int | None:
    """The wait the server asked for: retry-after-ms, else retry-after (seconds or an HTTP
    date); None when neither is there or readable."""
    try:
        v = headers.get("retry-after-ms")
        if v is not None:
            return max(0, round(float(v)))
        v = headers.get("retry-after")
        if v is None:
            return None
        try:
            return max(0, round(float(v) * 1000))
        except ValueError:
            when = email.utils.parsedate_to_datetime(v)
            return max(0, round((when.timestamp() - time.time()) * 1000))
    except (TypeError, ValueError, AttributeError):
        return None


def _mro(exc: BaseException) -> list[str]:
    return [c.__name__ for c in type(exc).__mro__]


def from_exception(exc: BaseException) -> dict:
    """The TaskEvent fields of an attempt that raised exc."""
    names = _mro(exc)
    kind = type(exc).__name__
    msg = str(exc)[:TEXT_LIMIT] or kind
    status = _status(exc)
    if isinstance(exc, OutputInvalid) or "ValidationError" in names or isinstance(exc, json.JSONDecodeError):
        code = getattr(exc, "code", None) if isinstance(exc, OutputInvalid) else None
        return {"status": "ERROR", "stage": "MODEL",
                "error": {"type": kind, "code": code or "schema_violation", "message": msg},
                "output": {"schema_valid": False}}
    if kind == "ContentFilterFinishReasonError":  # OpenAI's parse(): the answer was filtered
        return refusal("content_filter", None)
    if kind == "LengthFinishReasonError":  # OpenAI's parse(): cut off before its schema closed
        return {"status": "ERROR", "stage": "MODEL",
                "error": {"type": kind, "code": "schema_violation", "message": msg},
                "output": {"schema_valid": False}}
    if "APITimeoutError" in names or kind in ("TimeoutError", "ReadTimeout", "ConnectTimeout", "TimeoutException"):
        return {"status": "ERROR", "stage": "NETWORK", "error": {"type": kind, "code": "timeout", "message": msg}}
    if "APIConnectionError" in names or "ConnectionError" in names or "ConnectError" in names:
        return {"status": "ERROR", "stage": "NETWORK",
                "error": {"type": kind, "code": "connection_reset", "message": msg}}
    if status is not None:
        err: dict[str, Any] = {"type": kind, "http_status": status, "code": _body_code(exc), "message": msg}
        if status == 429:
            err["retry_after_ms"] = retry_after_ms(_headers(exc))
        return {"status": "ERROR", "stage": "NETWORK" if status >= 500 or status == 429 else "PROTOCOL", "error": err}
    return {"status": "ERROR", "stage": None, "error": {"type": kind, "message": msg}}


def refusal(code: str, text: str | None) -> dict:
    """The fields of a refused answer: terminal, to review."""
    return {"status": "ERROR", "stage": "MODEL",
            "error": {"type": "Refusal", "code": code, "message": (text or code)[:TEXT_LIMIT]},
            "output": {"text": (text or "")[:TEXT_LIMIT], "confidence": 0.0, "flags": ["refusal"]}}


def _get(obj: Any, *path: str) -> Any:
    for p in path:
        if obj is None:
            return None
        obj = obj.get(p) if isinstance(obj, dict) else getattr(obj, p, None)
    return obj


def tokens_of(resp: Any) -> tuple[int, int]:
    """(input, output) tokens of an OpenAI or Anthropic response, (0, 0) if it has none."""
    u = _get(resp, "usage")
    if u is None:
        return 0, 0
    for i, o in (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")):
        a, b = _get(u, i), _get(u, o)
        if isinstance(a, int) or isinstance(b, int):
            extra = 0
            for k in ("cache_creation_input_tokens", "cache_read_input_tokens"):  # Anthropic
                if isinstance(_get(u, k), int):
                    extra += _get(u, k)
            return (a or 0) + extra, b or 0
    return 0, 0


def cost_usd(model: str | None, tokens: tuple[int, int], prices: dict | None) -> float:
    """Cost from a price table {model or model prefix: (USD per 1M input tokens, per 1M
    output tokens)}; the longest matching prefix wins; 0 when the model has no price."""
    if not prices or not model:
        return 0.0
    best = max((k for k in prices if model.startswith(k)), key=len, default=None)
    if best is None:
        return 0.0
    pin, pout = prices[best]
    return round((tokens[0] * pin + tokens[1] * pout) / 1e6, 9)


def cut_off_structured(resp: Any, request: Any) -> dict | None:
    """The fields of an OpenAI answer to a request for structured output (response_format
    json_schema, as chat.completions.parse sends) that stopped at its token limit: its JSON
    cannot be whole, so it fails the schema (the SDK's parse() raises LengthFinishReasonError
    after the call). None for any other answer."""
    fmt = _get(request, "response_format")
    choices = _get(resp, "choices")
    if _get(fmt, "type") != "json_schema" or not isinstance(choices, list) or not choices:
        return None
    if _get(choices[0], "finish_reason") != "length":
        return None
    return {"status": "ERROR", "stage": "MODEL",
            "error": {"type": "LengthFinishReasonError", "code": "schema_violation",
                      "message": "the structured answer was cut off at the token limit (finish_reason length)"},
            "output": {"schema_valid": False}}


def from_response(resp: Any) -> dict:
    """The TaskEvent fields of an answer: OK, or a refusal; model and tokens where given."""
    fields: dict[str, Any] = {"status": "OK", "stage": "MODEL"}
    model = _get(resp, "model")
    if isinstance(model, str):
        fields["model"] = model
    text = None
    choices = _get(resp, "choices")
    if isinstance(choices, list) and choices:  # OpenAI chat completions
        msg = _get(choices[0], "message")
        if isinstance(_get(msg, "refusal"), str) and _get(msg, "refusal"):
            fields.update(refusal("refusal", _get(msg, "refusal")))
        elif _get(choices[0], "finish_reason") == "content_filter":
            fields.update(refusal("content_filter", _get(msg, "content")))
        text = _get(msg, "content")
    elif _get(resp, "stop_reason") is not None or _get(resp, "type") == "message":  # Anthropic messages
        blocks = _get(resp, "content") or []
        text = "".join(_get(b, "text") or "" for b in blocks if _get(b, "type") == "text")
        if _get(resp, "stop_reason") == "refusal":
            fields.update(refusal("refusal", text))
    elif _get(resp, "object") == "response":  # OpenAI responses
        for item in _get(resp, "output") or []:
            for part in _get(item, "content") or []:
                if _get(part, "type") == "refusal":
                    fields.update(refusal("refusal", _get(part, "refusal")))
        text = _get(resp, "output_text")
    if fields["status"] == "OK" and isinstance(text, str) and text:
        fields["output"] = {"text": text[:TEXT_LIMIT]}
    return fields


def stream_kind(resp: Any) -> str | None:
    """"openai" or "anthropic" for an SDK stream (sync or async), None for anything else."""
    names = [c.__name__ for c in type(resp).__mro__]
    if "Stream" not in names and "AsyncStream" not in names:
        return None
    return type(resp).__module__.split(".")[0]


class StreamAccumulator:
    """Collects what a stream's chunks (OpenAI) or events (Anthropic) carry into the shape of
    the answer they add up to, for from_response and tokens_of."""

    def __init__(self, kind: str):
        self.kind = kind
        self.model: str | None = None
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.finish: str | None = None
        self.usage: dict[str, int] = {}

    def add(self, chunk: Any) -> None:
        if self.kind == "anthropic":
            t = _get(chunk, "type")
            if t == "message_start":
                self.model = _get(chunk, "message", "model") or self.model
                self._usage(_get(chunk, "message", "usage"))
            elif t == "content_block_delta" and isinstance(_get(chunk, "delta", "text"), str):
                self.text.append(_get(chunk, "delta", "text"))
            elif t == "message_delta":
                self.finish = _get(chunk, "delta", "stop_reason") or self.finish
                self._usage(_get(chunk, "usage"))
            return
        self.model = _get(chunk, "model") or self.model
        choices = _get(chunk, "choices")
        if isinstance(choices, list) and choices:
            for k, into in (("content", self.text), ("refusal", self.refusal)):
                v = _get(choices[0], "delta", k)
                if isinstance(v, str):
                    into.append(v)
            self.finish = _get(choices[0], "finish_reason") or self.finish
        self._usage(_get(chunk, "usage"))

    def _usage(self, u: Any) -> None:
        for k in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens",
                  "cache_creation_input_tokens", "cache_read_input_tokens"):
            v = _get(u, k)
            if isinstance(v, int):
                self.usage[k] = v

    def response(self) -> dict:
        text = "".join(self.text)
        if self.kind == "anthropic":
            return {"type": "message", "model": self.model, "content": [{"type": "text", "text": text}],
                    "stop_reason": self.finish, "usage": self.usage or None}
        return {"model": self.model, "usage": self.usage or None, "choices": [
            {"message": {"content": text or None, "refusal": "".join(self.refusal) or None}, "finish_reason": self.finish}]}
