"""Retries and ReviewOutcomes: what the router sends back to a worker."""

from __future__ import annotations

import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator

from confluent_kafka import Consumer, KafkaException, TopicPartition

from .reporter import CLIENT_DEFAULTS, Codec, Topics, default_brokers, default_prefix

RULE_APPROVED = "MANUAL_OVERRIDE_SUCCESS"
RULE_REJECTED = "MANUAL_REJECTED"


@dataclass
class Retry:
    """One retry the router published when it was due.

    event is the attempt to repeat and decision the router's (a RoutedRecord's two halves);
    attempt is the attempt number to report next, model the model to use (the router's
    suggestion, else the one that failed), feedback the validator's feedback if any.
    """

    event: dict
    decision: dict

    @property
    def task_id(self) -> str:
        return self.event["task_id"]

    @property
    def attempt(self) -> int:
        return self.event["attempt"] + 1

    @property
    def n(self) -> int:
        return (self.decision.get("retry") or {}).get("n", 0)

    @property
    def feedback(self) -> str | None:
        return self.decision.get("feedback")

    @property
    def model(self) -> str | None:
        return self.decision.get("suggested_model") or self.event.get("model")

    def task(self, **fields: Any) -> AbstractContextManager:
        """faultrouter.task(...) for the next attempt: same task ID, attempt + 1, and the
        action, prompt template and SLA of the attempt it repeats."""
        from .context import task

        keep = {k: self.event[k] for k in ("action", "prompt_template", "sla_ms") if self.event.get(k) is not None}
        return task(self.task_id, attempt=self.attempt, **{**keep, **fields})

    def next_event(self, **outcome: Any) -> dict:
        """The next attempt's TaskEvent, for Reporter.report: the same task, attempt + 1, a new
        event_id, the model to use; outcome holds what the new attempt reports."""
        nxt = {k: v for k, v in self.event.items() if k not in ("error", "output", "usage")}
        nxt.update(event_id=str(uuid.uuid4()), attempt=self.attempt, occurred_at=datetime.now(timezone.utc),
                   model=self.model)
        nxt.update(outcome)
        return nxt


class Retries:
    """Iterates the retries the router publishes on the retry topic, for a consumer group.

    Each retry is committed when the caller asks for the next one, so a worker that dies
    while handling a retry gets it again; an exception out of the loop commits nothing.
    source, if given, keeps the retries of this service's events (the others are skipped
    and committed); idle_timeout ends the iteration after that many seconds without a
    retry (None: never).
    """

    def __init__(self, group: str, brokers: str | None = None, *, topic_prefix: str | None = None,
                 source: str | None = None, idle_timeout: float | None = None,
                 registry_url: str | None = None, registry_conf: dict | None = None,
                 consumer_conf: dict | None = None):
        if not group:
            raise ValueError("Retries: group is empty; give this worker's consumer group")
        self.topic = Topics(default_prefix(topic_prefix)).retry
        self.source = source
        self.idle_timeout = idle_timeout
        self.codec = Codec(registry_url, registry_conf)
        self.consumer = Consumer({
            **CLIENT_DEFAULTS, "bootstrap.servers": default_brokers(brokers), "group.id": group,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "enable.auto.commit": False, **(consumer_conf or {}),
        })
        self.consumer.subscribe([self.topic])

    def __iter__(self) -> Iterator[Retry]:
        last = time.monotonic()
        try:
            while self.idle_timeout is None or time.monotonic() - last < self.idle_timeout:
                msg = self.consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    raise KafkaException(msg.error())
                value = msg.value()
                if value is None:  # a tombstone: nothing to retry
                    self.consumer.commit(message=msg, asynchronous=False)
                    continue
                rec = self.codec.decode(self.topic, value)
                if rec.get("event") and (self.source is None or rec["event"].get("source") == self.source):
                    yield Retry(rec["event"], rec["decision"])
                    last = time.monotonic()
                self.consumer.commit(message=msg, asynchronous=False)
        finally:
            self.close()

    def close(self) -> None:
        self.consumer.close()


@dataclass
class ReviewOutcome:
    """A reviewer's decision on a task's review item, as the router applied it."""

    task_id: str
    approved: bool
    reason: str
    user_message: str | None
    decision: dict


class ReviewOutcomes:
    """Reads the router's audit topic for reviewers' decisions, from since (a datetime;
    default: now) on. wait(task_id) returns the decision on that task's review item."""

    def __init__(self, brokers: str | None = None, *, topic_prefix: str | None = None,
                 since: datetime | None = None, registry_url: str | None = None,
                 registry_conf: dict | None = None, consumer_conf: dict | None = None):
        self.topic = Topics(default_prefix(topic_prefix)).audit
        self.codec = Codec(registry_url, registry_conf)
        self.outcomes: dict[str, ReviewOutcome] = {}
        self.consumer = Consumer({
            **CLIENT_DEFAULTS, "bootstrap.servers": default_brokers(brokers), "group.id": f"faultrouter-review-outcomes-{uuid.uuid4()}",
            "isolation.level": "read_committed", "enable.auto.commit": False, **(consumer_conf or {}),
        })
        at = int((since or datetime.now(timezone.utc)).timestamp() * 1000)
        md = self.consumer.list_topics(self.topic, timeout=30).topics[self.topic]
        if md.error is not None:
            raise KafkaException(md.error)
        tps = [TopicPartition(self.topic, p, at) for p in md.partitions]
        offsets = self.consumer.offsets_for_times(tps, timeout=30)
        self.consumer.assign([TopicPartition(self.topic, tp.partition, tp.offset if tp.offset >= 0 else -1)
                              for tp in offsets])  # -1: the end

    def wait(self, task_id: str, timeout: float | None = None) -> ReviewOutcome:
        """Blocks until a reviewer's decision on task_id's review item is audited; raises
        TimeoutError after timeout seconds (None: never)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while task_id not in self.outcomes:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"[TASK:{task_id}] no review decision within {timeout} s")
            msg = self.consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            value, raw_key = msg.value(), msg.key()
            if value is None:
                continue
            rec = self.codec.decode(self.topic, value)
            d, ev = rec["decision"], rec.get("event") or {}
            if d["rule"] in (RULE_APPROVED, RULE_REJECTED):
                key = raw_key.decode() if raw_key else ev.get("task_id", "")
                self.outcomes[key] = ReviewOutcome(key, d["rule"] == RULE_APPROVED, d["reason"],
                                                   d.get("user_message"), d)
        return self.outcomes[task_id]

    def close(self) -> None:
        self.consumer.close()
