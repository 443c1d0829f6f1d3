"""The Python worker against a real faultrouter router and Kafka broker.

Needs a running router: FAULTROUTER_BROKERS (bootstrap servers) and, if the router uses one,
FAULTROUTER_TOPIC_PREFIX; FAULTROUTER_AVRO_DIR defaults to ../../avro. make test runs this file
from the Go integration test TestPythonWorker, which starts the router, and again from
TestPythonWorkerRegistry with FAULTROUTER_REGISTRY_URL set: then every record goes through
confluent-kafka's AvroSerializer and AvroDeserializer and that registry, against a router run
with --wire-format confluent.

Records are produced with confluent-kafka's default partitioner (librdkafka's, CRC32-based):
the router does not depend on the producer hashing keys like the Java client.
"""

import os
import time
import uuid
from datetime import datetime, timezone

import pytest

from faultrouter_worker import Worker, next_attempt

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = uuid.uuid4().hex[:8]  # task IDs unique to this run


@pytest.fixture(scope="module")
def worker():
    brokers = os.environ.get("FAULTROUTER_BROKERS")
    if not brokers:
        pytest.fail("FAULTROUTER_BROKERS is not set: start a faultrouter router and point this test at its broker")
    avro_dir = os.environ.get("FAULTROUTER_AVRO_DIR", os.path.join(HERE, "..", "..", "avro"))
    w = Worker(brokers, avro_dir, topic_prefix=os.environ.get("FAULTROUTER_TOPIC_PREFIX", ""), source="py-test",
               registry_url=os.environ.get("FAULTROUTER_REGISTRY_URL") or None)
    yield w
    w.producer.flush(10)


def attempt(task_id, **fields):
    """One attempt outcome; the fields not given are those of a plain successful answer."""
    e = {"task_id": task_id, "attempt": 1, "action": "answer_ticket", "provider": "openai",
         "model": "gpt-4o", "prompt_template": "support-v3", "stage": "MODEL", "status": "OK",
         "usage": {"cost_usd": 0.01, "tokens": 100, "elapsed_ms": 800}}
    e.update(fields)
    return e


def wait_for(worker, topic, want, timeout=60):
    """Reads topic from the beginning until want(records by task) holds; returns them."""
    seen = {}
    for key, rec in worker.consume(topic, f"py-test-{RUN}-{uuid.uuid4().hex[:6]}", timeout):
        if (rec.get("decision") or {}).get("rule") == "partition.forward":
            # CRC32 put the record on another partition than its task's (murmur2): the router
            # forwarded it there and audited that; its decision follows from the task's partition
            continue
        seen.setdefault(key, []).append(rec)
        if want(seen):
            return seen
    pytest.fail(f"{topic}: condition not met within {timeout} s; saw {sorted(seen)}")


def decision(rec):
    d = rec["decision"]
    return f"{d['class']}/{d['route']}"


def test_succeeded_is_completed(worker):
    task = f"py-ok-{RUN}"
    worker.report(attempt(task))
    worker.flush()
    audit = wait_for(worker, worker.topics.audit, lambda s: task in s)
    assert [decision(r) for r in audit[task]] == ["SUCCEEDED/COMPLETE"]
    assert audit[task][0]["event"]["source"] == "py-test"


def test_timeout_is_retried_when_due(worker):
    task = f"py-timeout-{RUN}"
    worker.report(attempt(task, stage="NETWORK", status="ERROR",
                          error={"type": "TimeoutError", "http_status": 504}))
    worker.flush()
    audit = wait_for(worker, worker.topics.audit, lambda s: task in s)
    plan = audit[task][0]["decision"]["retry"]
    assert decision(audit[task][0]) == "NETWORK_TIMEOUT/RETRY"
    assert (plan["n"], plan["delay_ms"]) == (1, 1000)

    for retry in worker.retries(f"py-worker-{RUN}"):
        if retry["event"]["task_id"] == task:
            break
    else:
        pytest.fail("no retry for the timeout")
    received = datetime.now(timezone.utc)
    # published when due, not before: the plan's not_before has passed when the worker sees it
    assert received >= retry["decision"]["retry"]["not_before"]
    assert retry["decision"]["retry"]["n"] == 1

    # the worker tries again and succeeds: the task completes
    nxt = worker.report(next_attempt(retry, status="OK"))
    worker.flush()
    assert nxt["attempt"] == 2
    audit = wait_for(worker, worker.topics.audit, lambda s: len(s.get(task, [])) >= 2)
    assert decision(audit[task][1]) == "SUCCEEDED/COMPLETE"
    assert audit[task][1]["decision"]["totals"]["attempts"] == 2


def test_refusal_goes_to_review_and_approval_comes_back_as_retry(worker):
    task = f"py-refusal-{RUN}"
    worker.report(attempt(task, output={"text": "I cannot help with that request.",
                                        "schema_valid": True, "confidence": 0.9}))
    worker.flush()
    review = wait_for(worker, worker.topics.review, lambda s: task in s)
    item = review[task][0]
    assert decision(item) == "MODEL_REFUSAL/REVIEW"
    assert item["decision"]["review"]["owner"]

    worker.decide(task, approve=True, reason="the answer is fine", reviewer="py-test")
    worker.flush()
    retries = wait_for(worker, worker.topics.retry, lambda s: task in s)
    back = retries[task][0]
    assert back["decision"]["rule"] == "MANUAL_OVERRIDE_SUCCESS"
    assert back["event"]["task_id"] == task


def test_fixable_validation_is_retried_with_feedback(worker):
    # a validation failure the validator can explain is retried with its feedback
    task = f"py-validate-{RUN}"
    worker.report(attempt(task, stage="BUSINESS", status="ERROR",
                          error={"type": "ValidationError", "code": "CODE_2101",
                                 "message": "amount must be positive"}))
    worker.flush()
    for retry in worker.retries(f"py-validate-{RUN}"):
        if retry["event"]["task_id"] == task:
            break
    else:
        pytest.fail("no retry for the fixable validation failure")
    d = retry["decision"]
    assert d["class"] == "VALIDATION_FIXABLE"
    assert "CODE_2101" in (d["feedback"] or "")
    # the next attempt uses the model the router suggests for this kind of failure
    assert d["suggested_model"] and next_attempt(retry, status="OK")["model"] == d["suggested_model"]


def test_wire_format_as_configured(worker):
    # last: the router's records read by the tests above were all in the wire format asked for
    want = {"confluent"} if worker.registry else {"single-object"}
    for topic in (worker.topics.audit, worker.topics.retry, worker.topics.review):
        assert worker.framings.get(topic) == want, (topic, worker.framings.get(topic))
