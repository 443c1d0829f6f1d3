"""A faultrouter worker in Python, on confluent-kafka and fastavro.

A worker reports the outcome of every attempt to the ingress topic, keyed by
task ID; it takes the retries faultrouter publishes when they are due, with the
validator's feedback and the model to use; reviewers' decisions go to the
decisions topic. Every record is Avro in the single-object encoding: the
marker C3 01, the 8-byte CRC-64-AVRO fingerprint of the writer schema's Parsing
Canonical Form (little-endian), then the Avro binary body. The schemas are the
files of faultrouter's avro/ directory.

With a schema registry (Worker(..., registry_url=URL)), records are written
with confluent-kafka's AvroSerializer instead, in the Confluent wire format
(the byte 0, the 4-byte schema ID, the body), under the subjects
<topic>-value, and read with its AvroDeserializer: run the router with
--registry-url URL --wire-format confluent.
"""

import io
import json
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import expand_schema, fingerprint, to_parsing_canonical_form

MARKER = b"\xc3\x01"

# Shared named types first (class.avsc, task_event.avsc): the others refer to them by name.
SCHEMA_FILES = ["class.avsc", "task_event.avsc", "routed_record.avsc", "breaker_event.avsc", "review_decision.avsc",
                "task_state.avsc"]

TASK_EVENT = "faultrouter.TaskEvent"
ROUTED_RECORD = "faultrouter.RoutedRecord"
REVIEW_DECISION = "faultrouter.ReviewDecision"


class Schemas:
    """faultrouter's schemas, parsed by fastavro, with their single-object headers."""

    def __init__(self, avro_dir):
        raw = [json.loads((Path(avro_dir) / f).read_text()) for f in SCHEMA_FILES]
        named = {}
        self.parsed = {}  # full name -> schema for fastavro's reader and writer
        for r in raw:
            self.parsed[full_name(r)] = parse_schema(r, named)
        self.headers = {}  # full name -> C3 01 + fingerprint, as on the wire
        self.expanded = {}  # full name -> the schema with references inlined, for a registry
        for r in expand_schema(raw):  # references inlined: the fingerprint covers the whole schema
            self.expanded[full_name(r)] = r
            canonical = to_parsing_canonical_form(parse_schema(r))
            # fastavro gives the fingerprint's bytes in wire order (little-endian), as hex.
            self.headers[full_name(r)] = MARKER + bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
        self.names = {h: n for n, h in self.headers.items()}

    def fingerprint(self, name):
        """The fingerprint as faultrouter prints it: hex of the number, most significant digit first."""
        return self.headers[name][2:][::-1].hex()

    def encode(self, name, record):
        buf = io.BytesIO()
        buf.write(self.headers[name])
        schemaless_writer(buf, self.parsed[name], record)
        return buf.getvalue()

    def decode(self, value):
        """Returns (full name, record) of a single-object encoded value."""
        name = self.names.get(bytes(value[:10]))
        if name is None:
            raise ValueError(f"not a faultrouter record: header {bytes(value[:10]).hex()}")
        return name, schemaless_reader(io.BytesIO(value[10:]), self.parsed[name], None)


def full_name(schema):
    name = schema["name"]
    return name if "." in name else f"{schema['namespace']}.{name}"


class RegistrySerde:
    """confluent-kafka's Avro serializer and deserializer against a schema registry."""

    def __init__(self, url, schemas, **conf):
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

        # a registry that does not answer a request fails it after 10 s instead of hanging
        self.client = SchemaRegistryClient({"url": url, "timeout": 10, **conf})
        # subjects by TopicNameStrategy, <topic>-value, as faultrouter names them: without it,
        # confluent-kafka 2.16 first asks the registry for the topic's "associated" subject, an
        # API that registries other than Confluent's (Apicurio's) may not answer
        topic_subjects = {"subject.name.strategy.type": "TOPIC"}
        # auto.register.schemas (the default): the schema is registered under <topic>-value if
        # it is not yet; `faultrouter schemas register` registers them ahead of the workers
        self.serializers = {n: AvroSerializer(self.client, json.dumps(schemas.expanded[n]), conf=topic_subjects)
                            for n in (TASK_EVENT, REVIEW_DECISION)}
        # the writer's schema, by the record's ID
        self.deserializer = AvroDeserializer(self.client, conf=topic_subjects)

    def encode(self, name, topic, record):
        from confluent_kafka.serialization import MessageField, SerializationContext

        return self.serializers[name](record, SerializationContext(topic, MessageField.VALUE))

    def decode(self, topic, value):
        from confluent_kafka.serialization import MessageField, SerializationContext

        return self.deserializer(value, SerializationContext(topic, MessageField.VALUE))


class Topics:
    """faultrouter's topic names, with the router's topic prefix."""

    def __init__(self, prefix=""):
        self.ingress = prefix + "ai.tasks.ingress"
        self.decisions = prefix + "ai.tasks.review.decisions"
        self.retry = prefix + "ai.tasks.retry"
        self.review = prefix + "ai.tasks.review"
        self.audit = prefix + "ai.tasks.audit"
        self.deadletter = prefix + "ai.tasks.deadletter"


def now():
    return datetime.now(timezone.utc)


class Worker:
    """Reports attempt outcomes and review decisions; reads retries and routed records."""

    def __init__(self, brokers, avro_dir, topic_prefix="", source="python-worker", registry_url=None,
                 registry_conf=None, **config):
        self.brokers = brokers
        self.schemas = Schemas(avro_dir)
        # the Confluent wire format through a schema registry, else the single-object encoding
        self.registry = RegistrySerde(registry_url, self.schemas, **(registry_conf or {})) if registry_url else None
        self.framings = {}  # topic -> the wire formats of the records read from it
        self.topics = Topics(topic_prefix)
        self.source = source
        # librdkafka's default partitioner; idempotence: a retried send is written once.
        self.producer = Producer({"bootstrap.servers": brokers, "enable.idempotence": True, **config})
        self.errors = []

    def _produce(self, topic, key, value):
        def delivered(err, _msg):
            if err is not None:
                self.errors.append(err)

        self.producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
        self.producer.poll(0)

    def report(self, event):
        """Sends one attempt outcome (a TaskEvent as a dict) to ingress, keyed by its task_id.

        Fields that may be null can be left out; event_id, occurred_at and source are filled in
        when missing.
        """
        event = {"event_id": str(uuid.uuid4()), "occurred_at": now(), "source": self.source,
                 "usage": {}, **event}
        if not event.get("task_id"):
            raise ValueError("task_id is required")
        self._produce(self.topics.ingress, event["task_id"], self._encode(TASK_EVENT, self.topics.ingress, event))
        return event

    def decide(self, task_id, approve, reason, reviewer=None):
        """Sends a reviewer's decision on a task's open review item."""
        d = {"task_id": task_id, "approve": approve, "reason": reason, "reviewer": reviewer, "at": now()}
        self._produce(self.topics.decisions, task_id, self._encode(REVIEW_DECISION, self.topics.decisions, d))

    def _encode(self, name, topic, record):
        if self.registry:
            return self.registry.encode(name, topic, record)
        return self.schemas.encode(name, record)

    def decode(self, topic, value):
        """A record of either wire format: the Confluent one (byte 0) needs the registry."""
        if value[:1] == b"\x00":
            self.framings.setdefault(topic, set()).add("confluent")
            if not self.registry:
                raise ValueError(f"{topic}: a record in the Confluent wire format, and no registry_url")
            return self.registry.decode(topic, value)
        self.framings.setdefault(topic, set()).add("single-object")
        return self.schemas.decode(value)[1]

    def flush(self, timeout=30):
        """Waits until every record sent is acknowledged; raises the first delivery error."""
        if self.producer.flush(timeout) != 0:
            raise KafkaException(f"{len(self.producer)} record(s) not delivered in {timeout} s")
        if self.errors:
            raise KafkaException(self.errors[0])

    def consume(self, topic, group_id, timeout=60):
        """Yields (key, routed record) of topic as they arrive, from the group's position
        (the beginning for a new group), for at most timeout seconds."""
        c = Consumer({"bootstrap.servers": self.brokers, "group.id": group_id,
                      "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
        c.subscribe([topic])
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    raise KafkaException(msg.error())
                yield msg.key().decode(), self.decode(topic, msg.value())
        finally:
            c.close()

    def retries(self, group_id, timeout=60):
        """Yields the retries faultrouter publishes when due: routed records whose event is the
        attempt to repeat and whose decision carries the retry number, the feedback and the
        suggested model."""
        yield from (r for _, r in self.consume(self.topics.retry, group_id, timeout))


def next_attempt(retry, **outcome):
    """The next attempt's event for a retry: same task, attempt + 1, a new event_id, the model
    the router suggests (if any); outcome holds what the new attempt reports (status, error...)."""
    e, d = retry["event"], retry["decision"]
    nxt = {k: v for k, v in e.items() if k not in ("error", "output")}
    nxt.update(event_id=str(uuid.uuid4()), attempt=e["attempt"] + 1, occurred_at=now(),
               model=d.get("suggested_model") or e.get("model"))
    nxt.update(outcome)
    return nxt


def schema_fingerprints(avro_dir):
    """(file, full name, fingerprint) of every record schema in avro_dir, frozen versions in
    history/ included (each complete on its own)."""
    s = Schemas(avro_dir)
    out = [(f, full_name(json.loads((Path(avro_dir) / f).read_text())), None) for f in SCHEMA_FILES]
    out = [(f, n, s.fingerprint(n)) for f, n, _ in out if n != "faultrouter.Class"]
    for h in sorted((Path(avro_dir) / "history").glob("*.avsc")):
        raw = json.loads(h.read_text())
        fp = fingerprint(to_parsing_canonical_form(parse_schema(raw)), "CRC-64-AVRO")
        out.append((f"history/{h.name}", full_name(raw), bytes.fromhex(fp)[::-1].hex()))
    return out


if __name__ == "__main__":
    # python faultrouter_worker.py fingerprints AVRO_DIR: what faultrouter's catalog must say.
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "fingerprints":
        sys.exit("usage: faultrouter_worker.py fingerprints AVRO_DIR")
    for row in schema_fingerprints(sys.argv[2]):
        print("\t".join(row))
