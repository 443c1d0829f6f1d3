"""faultrouter's Avro schemas (bundled from the repository's avro/ directory) and its two
wire formats: Avro single-object encoding, and the Confluent wire format through a registry.

Single-object encoding: the marker C3 01, the 8-byte CRC-64-AVRO fingerprint of the writer
schema's Parsing Canonical Form (little-endian), then the Avro binary body.
"""

from __future__ import annotations

import io
import json
from importlib import resources
from pathlib import Path
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import expand_schema, fingerprint, to_parsing_canonical_form

MARKER = b"\xc3\x01"

# Shared named types first (class.avsc, task_event.avsc): the others refer to them by name.
SCHEMA_FILES = ["class.avsc", "task_event.avsc", "routed_record.avsc", "breaker_event.avsc",
                "review_decision.avsc", "task_state.avsc"]

TASK_EVENT = "faultrouter.TaskEvent"
ROUTED_RECORD = "faultrouter.RoutedRecord"
REVIEW_DECISION = "faultrouter.ReviewDecision"


def full_name(schema: dict) -> str:
    name = schema["name"]
    return name if "." in name else f"{schema['namespace']}.{name}"


def _read(avro_dir: str | Path | None, name: str) -> dict:
    if avro_dir is None:
        return json.loads(resources.files("faultrouter").joinpath("avro").joinpath(name).read_text())
    return json.loads((Path(avro_dir) / name).read_text())


class Schemas:
    """The schemas parsed by fastavro, with their single-object headers. avro_dir None: the
    schemas bundled with this package."""

    def __init__(self, avro_dir: str | Path | None = None):
        raw = [_read(avro_dir, f) for f in SCHEMA_FILES]
        self.raw = {full_name(r): r for r in raw}
        named: dict = {}
        self.parsed: dict[str, Any] = {}
        for r in raw:
            self.parsed[full_name(r)] = parse_schema(r, named)
        self.headers: dict[str, bytes] = {}
        self.expanded: dict[str, dict] = {}  # references inlined: for a registry, and the fingerprint
        for x in expand_schema(raw):
            if not isinstance(x, dict):
                raise ValueError(f"a schema file holds {type(x).__name__}, not a record or enum")
            self.expanded[full_name(x)] = x
            canonical = to_parsing_canonical_form(parse_schema(x))
            # fastavro gives the fingerprint's bytes in wire order (little-endian), as hex
            self.headers[full_name(x)] = MARKER + bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
        self.names = {h: n for n, h in self.headers.items()}
        # the current schemas complete on their own, to resolve an older writer's records into
        # (fastavro before 1.13 does not resolve a writer's enum against a reader's reference
        # to a named type parsed elsewhere)
        self.readers = {n: parse_schema(r, {}) for n, r in self.expanded.items()}
        # earlier versions (history/): records an older router wrote are read into the current
        # schema by Avro's schema resolution
        self.writers: dict[bytes, Any] = {}
        for raw_h in _history(avro_dir):
            canonical = to_parsing_canonical_form(parse_schema(raw_h))
            header = MARKER + bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
            if header not in self.names:
                self.names[header] = full_name(raw_h)
                self.writers[header] = parse_schema(raw_h, {})

    def fingerprint(self, name: str) -> str:
        """The fingerprint as faultrouter prints it: hex of the number, most significant first."""
        return self.headers[name][2:][::-1].hex()

    def encode(self, name: str, record: dict) -> bytes:
        buf = io.BytesIO()
        buf.write(self.headers[name])
        schemaless_writer(buf, self.parsed[name], record)
        return buf.getvalue()

    def decode(self, value: bytes) -> tuple[str, dict]:
        """(full name, record) of a single-object encoded value, read into the current schema."""
        header = bytes(value[:10])
        name = self.names.get(header)
        if name is None:
            raise ValueError(f"not a record of a faultrouter schema this package knows: header {header.hex()} "
                             "(a newer router's schema? upgrade the faultrouter package)")
        writer = self.writers.get(header)
        if writer is None:
            rec = schemaless_reader(io.BytesIO(value[10:]), self.parsed[name], None)
        else:
            rec = schemaless_reader(io.BytesIO(value[10:]), writer, self.readers[name])
        if not isinstance(rec, dict):
            raise ValueError(f"a {name} record decoded to {type(rec).__name__}, not a record")
        return name, rec


class RegistrySerde:
    """confluent-kafka's Avro serializer and deserializer on a schema registry (the Confluent
    wire format: the byte 0, the 4-byte schema ID, the body), subjects <topic>-value."""

    def __init__(self, url: str, schemas: Schemas, conf: dict | None = None):
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

        self.client = SchemaRegistryClient({"url": url, "timeout": 10, **(conf or {})})
        # TopicNameStrategy, <topic>-value, as faultrouter names the subjects; without it,
        # confluent-kafka first asks for the topic's "associated" subject, an API registries
        # other than Confluent's (Apicurio's) may not answer
        topic_subjects = {"subject.name.strategy.type": "TOPIC"}
        self.serializers = {n: AvroSerializer(self.client, json.dumps(schemas.expanded[n]), conf=topic_subjects)
                            for n in (TASK_EVENT, REVIEW_DECISION)}
        self.deserializer = AvroDeserializer(self.client, conf=topic_subjects)

    def encode(self, name: str, topic: str, record: dict) -> bytes:
        from confluent_kafka.serialization import MessageField, SerializationContext

        return self.serializers[name](record, SerializationContext(topic, MessageField.VALUE))

    def decode(self, topic: str, value: bytes) -> dict:
        from confluent_kafka.serialization import MessageField, SerializationContext

        return self.deserializer(value, SerializationContext(topic, MessageField.VALUE))


def _history(avro_dir: str | Path | None) -> list[dict]:
    """The frozen earlier versions of the schemas, each complete on its own."""
    if avro_dir is None:
        d = resources.files("faultrouter").joinpath("avro").joinpath("history")
        return [json.loads(f.read_text()) for f in sorted(d.iterdir(), key=lambda f: f.name) if f.name.endswith(".avsc")]
    return [json.loads(h.read_text()) for h in sorted((Path(avro_dir) / "history").glob("*.avsc"))]


def schema_fingerprints(avro_dir: str | Path | None = None) -> list[tuple[str, str, str]]:
    """(file, full name, fingerprint) of every record schema; with avro_dir, the frozen
    versions in its history/ too (each complete on its own)."""
    s = Schemas(avro_dir)
    out = []
    for f in SCHEMA_FILES:
        n = full_name(_read(avro_dir, f))
        if n != "faultrouter.Class":
            out.append((f, n, s.fingerprint(n)))
    if avro_dir is not None:
        for h in sorted((Path(avro_dir) / "history").glob("*.avsc")):
            raw = json.loads(h.read_text())
            fp = fingerprint(to_parsing_canonical_form(parse_schema(raw)), "CRC-64-AVRO")
            out.append((f"history/{h.name}", full_name(raw), bytes.fromhex(fp)[::-1].hex()))
    return out
