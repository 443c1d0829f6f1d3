"""Reporter: sends attempt outcomes (TaskEvents) to the ingress topic."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import Any

from confluent_kafka import KafkaException, Producer

from . import events
from ._schemas import REVIEW_DECISION, TASK_EVENT, RegistrySerde, Schemas

log = logging.getLogger("faultrouter")


class Topics:
    """faultrouter's topic names, with the router's topic prefix."""

    def __init__(self, prefix: str = ""):
        self.ingress = prefix + "ai.tasks.ingress"
        self.decisions = prefix + "ai.tasks.review.decisions"
        self.retry = prefix + "ai.tasks.retry"
        self.review = prefix + "ai.tasks.review"
        self.audit = prefix + "ai.tasks.audit"
        self.deadletter = prefix + "ai.tasks.deadletter"
        self.alerts = prefix + "ai.tasks.alerts"


def default_brokers(brokers: str | None) -> str:
    return brokers or os.environ.get("FAULTROUTER_BROKERS") or "localhost:9092"


# librdkafka's own log lines at level info and below (its default is info)
# are not written: they go to stderr, into the worker's own output, and say
# nothing a worker acts on (a broker's telemetry subscription, for one).
# Warnings and errors still are; a worker's producer_conf or consumer_conf
# may set "log_level" back.
CLIENT_DEFAULTS = {"log_level": 4}


def default_prefix(prefix: str | None) -> str:
    return os.environ.get("FAULTROUTER_TOPIC_PREFIX", "") if prefix is None else prefix


class Codec:
    """Encodes and decodes faultrouter's records in either wire format."""

    def __init__(self, registry_url: str | None = None, registry_conf: dict | None = None):
        self.schemas = Schemas()
        self.registry = RegistrySerde(registry_url, self.schemas, registry_conf) if registry_url else None

    def encode(self, name: str, topic: str, record: dict) -> bytes:
        if self.registry:
            return self.registry.encode(name, topic, record)
        return self.schemas.encode(name, record)

    def decode(self, topic: str, value: bytes) -> dict:
        """A record of either wire format: the Confluent one (byte 0) needs the registry."""
        if value[:1] == b"\x00":
            if not self.registry:
                raise ValueError(f"{topic}: a record in the Confluent wire format, and no registry_url")
            return self.registry.decode(topic, value)
        return self.schemas.decode(value)[1]


class Reporter:
    """Reports attempt outcomes to faultrouter's ingress topic.

    brokers: bootstrap servers (default: $FAULTROUTER_BROKERS, else localhost:9092);
    topic_prefix: the router's --topic-prefix (default: $FAULTROUTER_TOPIC_PREFIX, else "");
    source: this service's name, the events' `source`;
    registry_url: write the Confluent wire format through this schema registry (the router
    then runs with --wire-format confluent) instead of Avro single-object encoding;
    registry_conf: the registry client's settings (basic.auth.user.info, ssl.ca.location);
    producer_conf: more librdkafka settings (security.protocol, sasl.*, ...).

    Records are keyed by task ID and partitioned as the Java client does (murmur2 of the key,
    positive, modulo the partition count: librdkafka's murmur2_random), so the router never
    has to forward one to its task's partition. The producer is idempotent (a retried send
    is written once), and what is still queued is flushed when the interpreter exits.
    """

    def __init__(self, brokers: str | None = None, *, topic_prefix: str | None = None,
                 source: str = "python-worker", registry_url: str | None = None,
                 registry_conf: dict | None = None, producer_conf: dict | None = None):
        if not source:
            raise ValueError("Reporter: source is empty; give this service's name")
        self.brokers = default_brokers(brokers)
        self.topics = Topics(default_prefix(topic_prefix))
        self.source = source
        self.codec = Codec(registry_url, registry_conf)
        self._errors: list[Any] = []
        self._lock = threading.Lock()
        self.producer = Producer({
            **CLIENT_DEFAULTS,
            "bootstrap.servers": self.brokers,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            **(producer_conf or {}),
        })
        ref = weakref.ref(self)
        def flush_at_exit() -> None:
            r = ref()
            if r is not None:
                r._flush_at_exit()

        atexit.register(flush_at_exit)

    def report(self, event: dict) -> dict:
        """Sends one attempt outcome, a TaskEvent as a dict (field names as in
        avro/task_event.avsc), keyed by its task_id; returns the event as sent.

        event_id, occurred_at, source and usage are filled in when missing; fields that may be
        null may be left out. A bad field raises FieldError naming it; nothing is sent then.
        """
        if not isinstance(event, dict):
            raise TypeError(f"report: event must be a dict, not {type(event).__name__}")
        event = events.complete(event, self.source)
        events.check(self.codec.schemas, TASK_EVENT, event)
        if not event["task_id"]:
            raise events.FieldError("task_id", "is empty")
        if event["attempt"] < 1:
            raise events.FieldError("attempt", f"is {event['attempt']}; allowed: 1 or more")
        self._produce(self.topics.ingress, event["task_id"],
                      self.codec.encode(TASK_EVENT, self.topics.ingress, event))
        log.debug("[TASK:%s] reported attempt %d: %s", event["task_id"], event["attempt"], event["status"])
        return event

    def decide(self, task_id: str, approve: bool, reason: str, reviewer: str | None = None) -> dict:
        """Sends a reviewer's decision on a task's open review item: an approval sends the
        task back as a retry, a rejection ends it."""
        d = {"task_id": task_id, "approve": approve, "reason": reason, "reviewer": reviewer, "at": events.now()}
        events.check(self.codec.schemas, REVIEW_DECISION, d)
        self._produce(self.topics.decisions, task_id, self.codec.encode(REVIEW_DECISION, self.topics.decisions, d))
        return d

    def _produce(self, topic: str, key: str, value: bytes) -> None:
        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                with self._lock:
                    self._errors.append(err)

        self.producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
        self.producer.poll(0)

    def flush(self, timeout: float = 30) -> None:
        """Waits until every record sent is acknowledged; raises the first delivery error."""
        left = self.producer.flush(timeout)
        if left:
            raise KafkaException(f"faultrouter: {left} record(s) not delivered in {timeout} s")
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise KafkaException(errors[0])

    def _flush_at_exit(self) -> None:
        try:
            self.flush(10)
        except KafkaException as e:
            log.error("faultrouter: at exit: %s", e)

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.flush()
