"""Guards the mapping table (faultrouter.mapping, the package README): each row, through the
real pinned openai and anthropic SDKs, sync and async, talking to the fake API, reports one
event with the row's fields; and instrumenting turns the SDKs' own retries off (one HTTP
request per call). A row that is wrong fails its test here, before any router runs."""

from __future__ import annotations

import asyncio
import warnings

import anthropic
import openai
import pytest

import faultrouter
from faultrouter import OutputInvalid

SDKS = ["openai", "openai-async", "anthropic", "anthropic-async"]


class Caller:
    """One SDK flavour: makes a call with a prompt through an instrumented client."""

    def __init__(self, sdk: str, url: str, reporter, **instrument_kw):
        self.sdk = sdk
        self.is_async = sdk.endswith("-async")
        kw = {"api_key": "fake", "timeout": 0.5}
        if sdk.startswith("openai"):
            cls = openai.AsyncOpenAI if self.is_async else openai.OpenAI
            self.client = cls(base_url=url + "/v1", **kw)
        else:
            cls = anthropic.AsyncAnthropic if self.is_async else anthropic.Anthropic
            self.client = cls(base_url=url, **kw)
        self.errors = openai if sdk.startswith("openai") else anthropic
        faultrouter.instrument(self.client, reporter, action="answer_ticket", prompt_template="support-v1",
                               **instrument_kw)

    def call(self, prompt: str, client=None):
        c = client or self.client
        if self.sdk.startswith("openai"):
            coro_or_resp = c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": prompt}])
        else:
            coro_or_resp = c.messages.create(model="claude-test-1", max_tokens=100,
                                             messages=[{"role": "user", "content": prompt}])
        return asyncio.run(coro_or_resp) if self.is_async else coro_or_resp


@pytest.fixture(params=SDKS)
def caller(request, api, reporter):
    return Caller(request.param, api.url, reporter, prices={"gpt-4o-mini": (0.15, 0.60), "claude": (3.0, 15.0)})


def only_event(reporter):
    assert len(reporter.events) == 1, f"want exactly one event, got {reporter.events}"
    return reporter.events[0]


def requests_for(api, directive):
    return sum(1 for _, d in api.requests if d == directive)


# (prompt, the SDK's exception class name or None, the event's expected fields)
ERROR_ROWS = [
    ("[fake:429]", "RateLimitError",
     {"status": "ERROR", "stage": "NETWORK", "error.type": "RateLimitError", "error.http_status": 429,
      "error.retry_after_ms": 2000}),
    ("[fake:429 retry-after=7]", "RateLimitError", {"error.http_status": 429, "error.retry_after_ms": 7000}),
    ("[fake:429 retry-after-ms=1500]", "RateLimitError", {"error.http_status": 429, "error.retry_after_ms": 1500}),
    ("[fake:500]", "InternalServerError",
     {"status": "ERROR", "stage": "NETWORK", "error.type": "InternalServerError", "error.http_status": 500}),
    ("[fake:timeout=2]", "APITimeoutError",
     {"status": "ERROR", "stage": "NETWORK", "error.type": "APITimeoutError", "error.code": "timeout",
      "error.http_status": None}),
    ("[fake:401]", "AuthenticationError",
     {"status": "ERROR", "stage": "PROTOCOL", "error.type": "AuthenticationError", "error.http_status": 401}),
    ("[fake:403]", "PermissionDeniedError",
     {"status": "ERROR", "stage": "PROTOCOL", "error.type": "PermissionDeniedError", "error.http_status": 403}),
    ("[fake:400]", "BadRequestError",
     {"status": "ERROR", "stage": "PROTOCOL", "error.type": "BadRequestError", "error.http_status": 400}),
    ("[fake:404]", "NotFoundError",
     {"status": "ERROR", "stage": "PROTOCOL", "error.type": "NotFoundError", "error.http_status": 404}),
    ("[fake:502]", "InternalServerError",
     {"status": "ERROR", "stage": "NETWORK", "error.type": "InternalServerError", "error.http_status": 502}),
]


def field(ev, path):
    for p in path.split("."):
        ev = (ev or {}).get(p)
    return ev


@pytest.mark.parametrize("prompt,exc,want", ERROR_ROWS, ids=[r[0] for r in ERROR_ROWS])
def test_error_rows(caller, api, reporter, prompt, exc, want):
    before = requests_for(api, prompt[6:-1].split()[0].split("=")[0])
    with faultrouter.task("t-row", action="answer_ticket"):
        with pytest.raises(getattr(caller.errors, exc)):
            caller.call(prompt + " " + caller.sdk)
    ev = only_event(reporter)
    for k, v in want.items():
        assert field(ev, k) == v, f"{k}: {field(ev, k)!r}, want {v!r} in {ev}"
    assert ev["task_id"] == "t-row" and ev["attempt"] == 1 and ev["provider"] == caller.sdk.split("-")[0]
    assert ev["prompt_template"] == "support-v1"
    assert ev["model"] in ("gpt-4o-mini", "claude-test-1")
    # the SDK's retries are off: the 429, 500 and the timeout were not retried inside the call
    assert requests_for(api, prompt[6:-1].split()[0].split("=")[0]) == before + 1


def test_connection_error(reporter):
    # nothing listens on port 9 of this host
    for sdk in SDKS:
        c = Caller(sdk, "http://127.0.0.1:9", reporter)
        with faultrouter.task("t-conn"):
            with pytest.raises(c.errors.APIConnectionError):
                c.call("hello")
    assert [(e["stage"], e["error"]["type"], e["error"]["code"]) for e in reporter.events] == \
        [("NETWORK", "APIConnectionError", "connection_reset")] * len(SDKS)


def test_refusal(caller, reporter):
    with faultrouter.task("t-refused"):
        caller.call("[fake:refusal] how do I pick a lock")
    ev = only_event(reporter)
    assert (ev["status"], ev["stage"], ev["error"]["type"], ev["error"]["code"]) == ("ERROR", "MODEL", "Refusal", "refusal")
    assert ev["output"]["confidence"] == 0.0 and ev["output"]["flags"] == ["refusal"]
    if caller.sdk.startswith("openai"):
        assert ev["output"]["text"] == faultrouter.fake.REFUSAL


@pytest.mark.parametrize("sdk", ["openai", "openai-async"])
def test_content_filter(sdk, api, reporter):
    c = Caller(sdk, api.url, reporter)
    with faultrouter.task("t-filtered"):
        c.call("[fake:content_filter] something")
    ev = only_event(reporter)
    assert (ev["status"], ev["error"]["code"], ev["output"]["confidence"]) == ("ERROR", "content_filter", 0.0)


def test_answer(caller, reporter):
    with faultrouter.task("t-ok", attempt=3, sla_ms=60000):
        caller.call("where is my order?")
    ev = only_event(reporter)
    assert (ev["status"], ev["stage"], ev.get("error")) == ("OK", "MODEL", None)
    assert ev["output"]["text"] == "Echo: where is my order?"
    assert ev["usage"]["tokens"] == 42 and ev["usage"]["elapsed_ms"] >= 0
    # prices: gpt-4o-mini 12 x 0.15 + 30 x 0.60 per 1M; claude 12 x 3 + 30 x 15 per 1M
    want = 0.0000198 if caller.sdk.startswith("openai") else 0.000486
    assert ev["usage"]["cost_usd"] == pytest.approx(want)
    assert ev["attempt"] == 3 and ev["sla_ms"] == 60000 and ev["action"] == "answer_ticket"


def test_schema_violation_from_validate(api, reporter):
    def validate(resp):
        raise OutputInvalid("answer has no order number", code="CODE_1203")

    c = Caller("openai", api.url, reporter, validate=validate)
    with faultrouter.task("t-schema"):
        with pytest.raises(OutputInvalid):
            c.call("where is my order?")
    ev = only_event(reporter)
    assert (ev["status"], ev["stage"], ev["error"]["code"], ev["output"]["schema_valid"]) == \
        ("ERROR", "MODEL", "CODE_1203", False)
    assert ev["usage"]["tokens"] == 42, "the call's usage is kept on a schema violation"


def test_pydantic_validation_error_is_a_schema_violation(reporter):
    import pydantic

    class Answer(pydantic.BaseModel):
        order: int

    with faultrouter.task("t-pyd"):
        with pytest.raises(pydantic.ValidationError):
            with faultrouter.attempt(reporter, action="answer_ticket"):
                Answer.model_validate_json('{"order": "soon"}')
    ev = only_event(reporter)
    assert (ev["status"], ev["error"]["type"], ev["error"]["code"], ev["output"]["schema_valid"]) == \
        ("ERROR", "ValidationError", "schema_violation", False)


def test_attempt_collects_calls_and_reports_once(api, reporter):
    c = Caller("openai", api.url, reporter)
    with faultrouter.task("t-att", action="answer_ticket"):
        with pytest.raises(OutputInvalid):
            with faultrouter.attempt(reporter) as a:
                c.call("step one")
                c.call("step two")
                raise OutputInvalid("missing field order_id")
        assert a.event is not None
    ev = only_event(reporter)
    assert ev["usage"]["tokens"] == 84 and ev["model"] == "gpt-4o-mini" and ev["attempt"] == 1
    assert ev["output"]["schema_valid"] is False and ev["error"]["code"] == "schema_violation"


def test_attempt_sees_a_refusal_inside(api, reporter):
    c = Caller("anthropic", api.url, reporter)
    with faultrouter.task("t-att-ref", action="answer_ticket"):
        with faultrouter.attempt(reporter):
            c.call("[fake:refusal] no")
    assert only_event(reporter)["error"]["type"] == "Refusal"


def test_attempt_decorator_async(reporter):
    @faultrouter.attempt(reporter, task_id="t-deco", attempt_no=2, action="answer_ticket")
    async def work():
        raise TimeoutError("slow")

    with pytest.raises(TimeoutError):
        asyncio.run(work())
    ev = only_event(reporter)
    assert (ev["task_id"], ev["attempt"], ev["stage"], ev["error"]["code"]) == ("t-deco", 2, "NETWORK", "timeout")


def test_calls_in_a_task_are_successive_attempts(api, reporter):
    c = Caller("openai", api.url, reporter)
    with faultrouter.task("t-seq", action="answer_ticket") as t:
        with pytest.raises(openai.RateLimitError):
            c.call("[fake:429] a")
        c.call("b")
    assert [e["attempt"] for e in reporter.events] == [1, 2] and t.events == reporter.events


def test_a_call_outside_a_task_is_not_reported(api, reporter):
    c = Caller("openai", api.url, reporter)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c.call("hello")
    assert reporter.events == [] and "not reported" in str(w[0].message)


def test_copies_are_instrumented_and_keep_retries_off(api, reporter):
    c = Caller("openai", api.url, reporter)
    before = requests_for(api, "429")
    with faultrouter.task("t-copy"):
        with pytest.raises(openai.RateLimitError):
            c.call("[fake:429] copy", client=c.client.with_options(max_retries=5))
    assert len(reporter.events) == 1 and requests_for(api, "429") == before + 1


def test_task_context_crosses_await(api, reporter):
    c = openai.AsyncOpenAI(base_url=api.url + "/v1", api_key="fake")
    faultrouter.instrument(c, reporter, action="answer_ticket")

    async def one(tid):
        with faultrouter.task(tid):
            await c.chat.completions.create(model="m", messages=[{"role": "user", "content": tid}])

    async def main():
        await asyncio.gather(*(one(f"t-{i}") for i in range(5)))

    asyncio.run(main())
    assert sorted(e["task_id"] for e in reporter.events) == [f"t-{i}" for i in range(5)]
    assert all(e["output"]["text"] == "Echo: " + e["task_id"] for e in reporter.events)


def test_retry_after_as_an_http_date(caller, reporter):
    with faultrouter.task("t-date", action="answer_ticket"):
        with pytest.raises(caller.errors.RateLimitError):
            caller.call("[fake:429 retry-after-date=5] " + caller.sdk)
    ev = only_event(reporter)
    # the date has whole seconds: 5 s ahead is read as 4 to 5 s from when the answer arrived
    assert 3000 <= ev["error"]["retry_after_ms"] <= 5000, ev["error"]


@pytest.mark.parametrize("sdk", SDKS)
def test_validate_on_every_sdk(sdk, api, reporter):
    """validate= with the JSON of the answer: a json.JSONDecodeError is a schema violation,
    raised to the caller, the call's usage kept; sync and async, OpenAI and Anthropic."""
    import json

    def validate(resp):
        text = resp.choices[0].message.content if sdk.startswith("openai") else resp.content[0].text
        json.loads(text)  # "Echo: ..." is no JSON

    c = Caller(sdk, api.url, reporter, validate=validate)
    with faultrouter.task("t-json"):
        with pytest.raises(json.JSONDecodeError):
            c.call("where is my order?")
    ev = only_event(reporter)
    assert (ev["status"], ev["stage"], ev["error"]["type"], ev["error"]["code"], ev["output"]["schema_valid"]) == \
        ("ERROR", "MODEL", "JSONDecodeError", "schema_violation", False)
    assert ev["usage"]["tokens"] == 42


def test_json_decode_error_in_an_attempt(reporter):
    import json

    with faultrouter.task("t-json-attempt"):
        with pytest.raises(json.JSONDecodeError):
            with faultrouter.attempt(reporter, action="answer_ticket"):
                json.loads("{not json")
    ev = only_event(reporter)
    assert (ev["stage"], ev["error"]["type"], ev["error"]["code"], ev["output"]["schema_valid"]) == \
        ("MODEL", "JSONDecodeError", "schema_violation", False)


class Order(__import__("pydantic").BaseModel):
    order: int


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_parse_cut_off_is_a_schema_violation(is_async, api, reporter):
    """chat.completions.parse with a structured answer cut off at the token limit: the SDK
    raises LengthFinishReasonError after the call; the call reports a schema violation."""
    c = Caller("openai-async" if is_async else "openai", api.url, reporter)
    with faultrouter.task("t-length"):
        with pytest.raises(openai.LengthFinishReasonError):
            call = c.client.chat.completions.parse(model="gpt-4o-mini", response_format=Order,
                                                   messages=[{"role": "user", "content": "[fake:length] order?"}])
            asyncio.run(call) if is_async else call
    ev = only_event(reporter)
    assert (ev["status"], ev["stage"], ev["error"]["type"], ev["error"]["code"], ev["output"]["schema_valid"]) == \
        ("ERROR", "MODEL", "LengthFinishReasonError", "schema_violation", False)


def test_parse_content_filter_is_a_refusal(api, reporter):
    c = Caller("openai", api.url, reporter)
    with faultrouter.task("t-parse-filter"):
        with pytest.raises(openai.ContentFilterFinishReasonError):
            c.client.chat.completions.parse(model="gpt-4o-mini", response_format=Order,
                                            messages=[{"role": "user", "content": "[fake:content_filter] order?"}])
    ev = only_event(reporter)
    assert (ev["status"], ev["error"]["type"], ev["error"]["code"], ev["output"]["confidence"]) == \
        ("ERROR", "Refusal", "content_filter", 0.0)


def test_create_with_a_schema_cut_off_is_a_schema_violation(api, reporter):
    """chat.completions.create asking for json_schema output, cut off at the token limit:
    no exception (create does not parse), but the answer cannot fit the schema."""
    c = Caller("openai", api.url, reporter)
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": Order.model_json_schema()}}
    with faultrouter.task("t-create-length"):
        c.client.chat.completions.create(model="gpt-4o-mini", response_format=fmt,
                                         messages=[{"role": "user", "content": "[fake:length] order?"}])
    ev = only_event(reporter)
    assert (ev["status"], ev["error"]["type"], ev["error"]["code"], ev["output"]["schema_valid"]) == \
        ("ERROR", "LengthFinishReasonError", "schema_violation", False)


def test_a_plain_answer_cut_off_is_an_answer(api, reporter):
    """finish_reason length without a requested schema is an answer (the text is what it is)."""
    c = Caller("openai", api.url, reporter)
    with faultrouter.task("t-long"):
        c.call("[fake:length] tell me everything")
    assert only_event(reporter)["status"] == "OK"


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_responses_api(is_async, api, reporter):
    """OpenAI's Responses API: a refusal part is a refusal, an answer an answer."""
    c = Caller("openai-async" if is_async else "openai", api.url, reporter)
    calls = (("t-resp-ref", "[fake:refusal] pick a lock"), ("t-resp-ok", "hello"))
    if is_async:
        async def both():
            for task_id, prompt in calls:
                with faultrouter.task(task_id):
                    await c.client.responses.create(model="gpt-4o-mini", input=prompt)
        asyncio.run(both())
    else:
        for task_id, prompt in calls:
            with faultrouter.task(task_id):
                c.client.responses.create(model="gpt-4o-mini", input=prompt)
    refused, answered = reporter.events
    assert (refused["status"], refused["error"]["type"], refused["error"]["code"], refused["output"]["text"]) == \
        ("ERROR", "Refusal", "refusal", faultrouter.fake.REFUSAL)
    assert refused["output"]["confidence"] == 0.0
    assert (answered["status"], answered["output"]["text"], answered["usage"]["tokens"]) == ("OK", "Echo: hello", 42)


@pytest.mark.parametrize("sdk", ["anthropic", "anthropic-async"])
def test_anthropic_cache_tokens_are_counted(sdk, api, reporter):
    c = Caller(sdk, api.url, reporter, prices={"claude": (3.0, 15.0)})
    with faultrouter.task("t-cache"):
        c.call("[fake:cache] hello")
    ev = only_event(reporter)
    # 12 input + 100 written to the cache + 200 read from it, 30 output
    assert ev["usage"]["tokens"] == 342
    assert ev["usage"]["cost_usd"] == pytest.approx((312 * 3.0 + 30 * 15.0) / 1e6)


def test_any_other_exception(reporter):
    with faultrouter.task("t-other"):
        with pytest.raises(KeyError):
            with faultrouter.attempt(reporter, action="answer_ticket"):
                {}["missing"]
    ev = only_event(reporter)
    assert (ev["status"], ev.get("stage"), ev["error"]["type"]) == ("ERROR", None, "KeyError")
    assert ev["error"].get("http_status") is None and ev["error"].get("code") is None


def stream_call(caller, prompt):
    """A streamed call read to its end: its text."""
    c = caller.client
    if caller.sdk.startswith("openai"):
        kw = dict(model="gpt-4o-mini", messages=[{"role": "user", "content": prompt}], stream=True,
                  stream_options={"include_usage": True})

        def piece(chunk):
            return (chunk.choices[0].delta.content or "") if chunk.choices else ""
    else:
        kw = dict(model="claude-test-1", max_tokens=100, messages=[{"role": "user", "content": prompt}], stream=True)

        def piece(event):
            return event.delta.text if event.type == "content_block_delta" else ""

    if caller.is_async:
        async def run():
            text = ""
            async for chunk in await (c.chat.completions.create(**kw) if caller.sdk.startswith("openai") else c.messages.create(**kw)):
                text += piece(chunk)
            return text
        return asyncio.run(run())
    text = ""
    for chunk in (c.chat.completions.create(**kw) if caller.sdk.startswith("openai") else c.messages.create(**kw)):
        text += piece(chunk)
    return text


def test_a_stream_reports_when_it_ends(caller, reporter):
    """A streamed answer is reported once, when read to its end, with the text, model, tokens
    and cost it carried; nothing before."""
    with faultrouter.task("t-stream", sla_ms=60000):
        text = stream_call(caller, "where is my order?")
    assert text == "Echo: where is my order?"
    ev = only_event(reporter)
    assert (ev["status"], ev["stage"], ev["output"]["text"], ev["usage"]["tokens"]) == ("OK", "MODEL", text, 42)
    assert ev["model"] in ("gpt-4o-mini", "claude-test-1")
    want = 0.0000198 if caller.sdk.startswith("openai") else 0.000486
    assert ev["usage"]["cost_usd"] == pytest.approx(want)


def test_a_streamed_refusal_is_a_refusal(caller, reporter):
    with faultrouter.task("t-stream-refused"):
        stream_call(caller, "[fake:refusal] pick a lock")
    ev = only_event(reporter)
    assert (ev["status"], ev["error"]["type"], ev["error"]["code"], ev["output"]["confidence"]) == \
        ("ERROR", "Refusal", "refusal", 0.0)
    if caller.sdk.startswith("openai"):
        assert ev["output"]["text"] == faultrouter.fake.REFUSAL


@pytest.mark.parametrize("sdk", ["openai", "openai-async"])
def test_a_streamed_content_filter_is_a_refusal(sdk, api, reporter):
    c = Caller(sdk, api.url, reporter)
    with faultrouter.task("t-stream-filtered"):
        stream_call(c, "[fake:content_filter] x")
    ev = only_event(reporter)
    assert (ev["status"], ev["error"]["code"]) == ("ERROR", "content_filter")


def test_a_stream_closed_early_reports_what_it_carried(api, reporter):
    c = Caller("openai", api.url, reporter)
    with faultrouter.task("t-stream-closed"):
        s = c.client.chat.completions.create(model="gpt-4o-mini", stream=True,
                                             messages=[{"role": "user", "content": "hello there"}])
        next(iter(s))
        assert reporter.events == [], "reported before the stream ended"
        s.close()
    ev = only_event(reporter)
    assert ev["status"] == "OK" and ev["model"] == "gpt-4o-mini"


def test_the_stream_helper_reports_once(api, reporter):
    """The SDK's own stream helper (chat.completions.stream) reads the wrapped stream."""
    c = Caller("openai", api.url, reporter)
    with faultrouter.task("t-stream-helper"):
        with c.client.chat.completions.stream(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]) as s:
            final = s.get_final_completion()
    assert final.choices[0].message.content == "Echo: hi"
    ev = only_event(reporter)
    assert (ev["status"], ev["output"]["text"]) == ("OK", "Echo: hi")
