"""The package against a running router on a real broker: the pinned openai and anthropic
SDKs, instrumented, call the fake API; their reports are routed by the router, and these
tests assert its decisions from its output topics (retry when due, review, dead letter),
the retries taken back with Retries, and a reviewer's decision read with ReviewOutcomes.

Needs FAULTROUTER_BROKERS (and FAULTROUTER_TOPIC_PREFIX if the router has one); with
FAULTROUTER_REGISTRY_URL, everything goes through that schema registry in the Confluent wire
format (the router runs with --wire-format confluent). make test runs this file from the Go
integration tests TestPythonWorker and TestPythonWorkerRegistry.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import anthropic
import openai
import pytest
from confluent_kafka import Consumer, KafkaException

import faultrouter
from faultrouter.fake import FakeAPI
from faultrouter.reporter import Codec, Topics

pytestmark = pytest.mark.skipif(not os.environ.get("FAULTROUTER_BROKERS"), reason="needs FAULTROUTER_BROKERS: a running router")
RUN = uuid.uuid4().hex[:8]
REGISTRY = os.environ.get("FAULTROUTER_REGISTRY_URL") or None


@pytest.fixture(scope="module")
def rep():
    r = faultrouter.Reporter(source=f"py-client-{RUN}", registry_url=REGISTRY)
    yield r
    r.flush(10)


@pytest.fixture(scope="module")
def fake():
    with FakeAPI() as a:
        yield a


def read(topic: str, want, timeout: float = 60) -> dict[str, list[tuple[dict, int]]]:
    """Reads topic from its start until want(records by key) holds; (record, timestamp ms)."""
    codec = Codec(REGISTRY)
    c = Consumer({"bootstrap.servers": os.environ["FAULTROUTER_BROKERS"], "group.id": f"py-read-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed", "enable.auto.commit": False})
    c.subscribe([topic])
    seen: dict[str, list[tuple[dict, int]]] = {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                if want(seen):
                    return seen
                continue
            if msg.error():
                raise KafkaException(msg.error())
            seen.setdefault(msg.key().decode(), []).append((codec.decode(topic, msg.value()), msg.timestamp()[1]))
    finally:
        c.close()
    pytest.fail(f"{topic}: not there within {timeout} s; saw {sorted(seen)}")


def routes(recs):
    return [f"{r['decision']['class']}/{r['decision']['route']}" for r, _ in recs]


def openai_call(client, prompt):
    return client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": prompt}])


def test_sdk_outcomes_are_routed(rep, fake):
    """Each outcome of the real SDKs gets the router's decision for it."""
    topics = Topics(os.environ.get("FAULTROUTER_TOPIC_PREFIX", ""))
    oa = faultrouter.instrument(openai.OpenAI(base_url=fake.url + "/v1", api_key="fake", timeout=0.5), rep,
                                action="answer_ticket", prompt_template="support-v1")
    async def anthropic_call(prompt):
        # an async client belongs to one event loop: one per asyncio.run
        async with anthropic.AsyncAnthropic(base_url=fake.url, api_key="fake", timeout=0.5) as an:
            faultrouter.instrument(an, rep, action="answer_ticket", prompt_template="support-v1")
            await an.messages.create(model="claude-test-1", max_tokens=50, messages=[{"role": "user", "content": prompt}])

    async def openai_async_call(prompt):
        async with openai.AsyncOpenAI(base_url=fake.url + "/v1", api_key="fake", timeout=0.5) as c:
            faultrouter.instrument(c, rep, action="answer_ticket", prompt_template="support-v1")
            await openai_call(c, prompt)

    def anthropic_sync_call(prompt):
        an = faultrouter.instrument(anthropic.Anthropic(base_url=fake.url, api_key="fake", timeout=0.5), rep,
                                    action="answer_ticket", prompt_template="support-v1")
        an.messages.create(model="claude-test-1", max_tokens=50, messages=[{"role": "user", "content": prompt}])

    def validated(code):
        def validate(resp):
            raise faultrouter.OutputInvalid("the answer has no order number", code=code)
        c = faultrouter.instrument(openai.OpenAI(base_url=fake.url + "/v1", api_key="fake", timeout=0.5), rep,
                                   action="answer_ticket", prompt_template="support-v1", validate=validate)
        return lambda prompt: openai_call(c, prompt)

    unreachable = faultrouter.instrument(openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="fake", timeout=0.5),
                                         rep, action="answer_ticket")

    def langchain_call(prompt):
        from faultrouter.langchain import FaultrouterCallbackHandler
        from test_langchain import OpenAIChat  # a chat model as langchain-openai's, on the plain SDK

        handler = FaultrouterCallbackHandler(rep, action="answer_ticket", prompt_template="lc-v1")
        OpenAIChat(base_url=fake.url + "/v1").invoke(prompt, config={"callbacks": [handler]})

    sdks = {
        "openai": lambda prompt: openai_call(oa, prompt),
        "openai-async": lambda prompt: asyncio.run(openai_async_call(prompt)),
        "anthropic": lambda prompt: anthropic_sync_call(prompt),
        "anthropic-async": lambda prompt: asyncio.run(anthropic_call(prompt)),
        "unreachable": lambda prompt: openai_call(unreachable, prompt),
        "schema": validated(None),
        "fixable": validated("CODE_2101"),
        "langchain": langchain_call,
    }
    want = {}  # task -> routes of its audit records, in order

    def call(name, prompt, routes_, times=1, sdk="openai"):
        tid = f"py-{name}-{RUN}"
        want[tid] = routes_
        with faultrouter.task(tid):
            for _ in range(times):
                try:
                    sdks[sdk](prompt)
                except (openai.APIError, anthropic.APIError, faultrouter.OutputInvalid):
                    pass
        return tid

    rate = call("429", "[fake:429 retry-after=2] where is order 1?", ["RATE_LIMITED/RETRY"])
    call("500", "[fake:500] x", ["UNCLASSIFIED/REVIEW"])
    call("401", "[fake:401] x", ["AUTH_FAILED/RETRY"], sdk="anthropic-async")
    call("403", "[fake:403] x", ["AUTH_FAILED/RETRY"], sdk="openai-async")
    call("400", "[fake:400] x", ["INPUT_QUALITY_ISSUE/REVIEW"])
    call("404", "[fake:404] x", ["UNCLASSIFIED/REVIEW"], sdk="anthropic")
    call("502", "[fake:502] x", ["NETWORK_TIMEOUT/RETRY"], sdk="anthropic")
    call("conn", "x", ["NETWORK_TIMEOUT/RETRY"], sdk="unreachable")
    refused = call("refusal", "[fake:refusal] x", ["MODEL_REFUSAL/REVIEW"], sdk="anthropic-async")
    call("filtered", "[fake:content_filter] x", ["MODEL_REFUSAL/REVIEW"], sdk="openai-async")
    call("schema", "where is my order?", ["SCHEMA_VIOLATION/REVIEW"], sdk="schema")
    call("fixable", "where is my order?", ["VALIDATION_FIXABLE/RETRY"], sdk="fixable")
    call("lc-refusal", "[fake:refusal] x", ["MODEL_REFUSAL/REVIEW"], sdk="langchain")
    call("lc-429", "[fake:429 retry-after=3] x", ["RATE_LIMITED/RETRY"], sdk="langchain")
    call("ok", "hello", ["SUCCEEDED/COMPLETE"], sdk="anthropic-async")
    dead = call("timeouts", "[fake:timeout=2] x",
                ["NETWORK_TIMEOUT/RETRY", "NETWORK_TIMEOUT/RETRY", "NETWORK_TIMEOUT/DEADLETTER"], times=3)
    rep.flush()

    audit = read(topics.audit, lambda s: all(len(s.get(t, [])) >= len(w) for t, w in want.items()))
    for tid, w in want.items():
        # the murmur2 partitioner put every record on its task's partition: nothing forwarded
        assert all(r["decision"]["rule"] != "partition.forward" for r, _ in audit[tid]), audit[tid]
        assert routes(audit[tid]) == w, f"{tid}: {audit[tid]}"

    # the 429's retry is published once its retry-after has passed, not before
    d = audit[rate][0][0]["decision"]
    assert d["retry"]["delay_ms"] == 2000
    retry = read(topics.retry, lambda s: rate in s)
    rec, ts = retry[rate][0]
    not_before = int(d["retry"]["not_before"].timestamp() * 1000)
    # due 2 s (the retry-after) after the router decided, which is after the attempt ended
    assert not_before == int(d["decided_at"].timestamp() * 1000) + 2000
    assert not_before >= int(audit[rate][0][0]["event"]["occurred_at"].timestamp() * 1000) + 2000
    assert ts >= not_before, f"retry published at {ts}, due at {not_before}"

    review = read(topics.review, lambda s: refused in s)
    assert routes(review[refused]) == ["MODEL_REFUSAL/REVIEW"]
    assert review[refused][0][0]["decision"]["review"]["owner"] == "ai_product"
    deadletter = read(topics.deadletter, lambda s: dead in s)
    assert len(deadletter[dead]) == 1


def test_a_retry_is_taken_and_completes(rep, fake):
    """Retries hands the due retry of a 429 back to the worker, which calls again in the
    retry's task (attempt 2, the same model) and the router completes the task."""
    topics = Topics(os.environ.get("FAULTROUTER_TOPIC_PREFIX", ""))
    oa = faultrouter.instrument(openai.OpenAI(base_url=fake.url + "/v1", api_key="fake"), rep, action="answer_ticket")
    tid = f"py-retry-{RUN}"
    prompt = f"[fake:429-once] where is order {RUN}?"
    with faultrouter.task(tid):
        with pytest.raises(openai.RateLimitError):
            openai_call(oa, prompt)
    rep.flush()
    for retry in faultrouter.Retries(f"py-worker-{RUN}", source=rep.source, idle_timeout=60, registry_url=REGISTRY):
        if retry.task_id != tid:
            continue
        assert (retry.attempt, retry.model, retry.n) == (2, "gpt-4o-mini", 1)
        with retry.task():
            openai_call(oa, prompt)
        break
    else:
        pytest.fail("no retry came")
    rep.flush()
    audit = read(topics.audit, lambda s: len(s.get(tid, [])) >= 2)
    assert routes(audit[tid]) == ["RATE_LIMITED/RETRY", "SUCCEEDED/COMPLETE"]
    assert audit[tid][1][0]["event"]["attempt"] == 2


def test_review_outcome(rep, fake):
    """A reviewer's rejection of a refusal's review item comes back through ReviewOutcomes."""
    topics = Topics(os.environ.get("FAULTROUTER_TOPIC_PREFIX", ""))
    outcomes = faultrouter.ReviewOutcomes(registry_url=REGISTRY)
    an = faultrouter.instrument(anthropic.Anthropic(base_url=fake.url, api_key="fake"), rep, action="answer_ticket")
    tid = f"py-review-{RUN}"
    with faultrouter.task(tid):
        an.messages.create(model="claude-test-1", max_tokens=50, messages=[{"role": "user", "content": "[fake:refusal] x"}])
    rep.flush()
    read(topics.review, lambda s: tid in s)
    rep.decide(tid, approve=False, reason="out of scope", reviewer="py-test")
    rep.flush()
    got = outcomes.wait(tid, timeout=60)
    outcomes.close()
    assert (got.approved, got.decision["rule"]) == (False, "MANUAL_REJECTED")
    assert "out of scope" in (got.user_message or "")
