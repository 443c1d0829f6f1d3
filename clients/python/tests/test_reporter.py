"""Guards the Reporter's checks and wire format without a broker: a bad field is one error
naming it, events are completed as documented, and the single-object encoding's header is
the bundled schema's fingerprint, the same schemas as the repository's avro/."""

import filecmp
import io
from pathlib import Path

import pytest
from fastavro import schemaless_reader

from faultrouter import FieldError, Reporter
from faultrouter._schemas import SCHEMA_FILES, TASK_EVENT, Schemas

AVRO = Path(__file__).resolve().parents[3] / "avro"


def good(**kw):
    e = {"task_id": "t-1", "attempt": 1, "action": "answer_ticket", "status": "OK"}
    e.update(kw)
    return e


@pytest.fixture
def rep():
    # nothing reaches a broker: sent keeps what report() would produce
    r = Reporter("127.0.0.1:1", source="test")
    r.sent = []
    r._produce = lambda topic, key, value: r.sent.append((topic, key, value))
    return r


@pytest.mark.parametrize("event,field,allowed", [
    (good(stage="network"), "stage", "NETWORK, PROTOCOL, MODEL, BUSINESS"),
    (good(status="FAILED"), "status", "OK, ERROR"),
    (good(attempt="1"), "attempt", "an int"),
    (good(attempt=0), "attempt", "1 or more"),
    (good(colour="red"), "colour", "unknown field"),
    (good(error={"type": "X", "http_status": "429"}), "error.http_status", "an int"),
    (good(error={"kind": "X"}), "error.kind", "unknown field"),
    (good(usage={"tokens": 1.5}), "usage.tokens", "an int"),
    (good(output={"flags": "refusal"}), "output.flags", "a list"),
    (good(attributes={"a": 1}), "attributes['a']", "a str"),
    ({"attempt": 1, "action": "a", "status": "OK"}, "task_id", "required"),
    (good(task_id=""), "task_id", "empty"),
])
def test_a_bad_field_is_named(rep, event, field, allowed):
    with pytest.raises(FieldError) as e:
        rep.report(event)
    assert e.value.field == field
    assert str(e.value).startswith(field + ":") and allowed in str(e.value)
    assert rep.sent == [], "nothing is sent for a bad event"


def test_report_completes_and_encodes(rep):
    ev = rep.report(good(error=None))
    assert ev["source"] == "test" and ev["event_id"] and ev["occurred_at"].tzinfo is not None
    [(topic, key, value)] = rep.sent
    assert topic == "ai.tasks.ingress" and key == "t-1"
    assert Schemas().decode(value)[1]["event_id"] == ev["event_id"]


def test_single_object_encoding_roundtrip():
    s = Schemas()
    ev = {"event_id": "e", "task_id": "t", "attempt": 1, "occurred_at": 1_700_000_000_000, "source": "s",
          "action": "a", "status": "ERROR", "error": {"type": "RateLimitError", "http_status": 429,
                                                      "retry_after_ms": 2000}, "usage": {}}
    b = s.encode(TASK_EVENT, ev)
    assert b[:2] == b"\xc3\x01" and b[2:10][::-1].hex() == s.fingerprint(TASK_EVENT)
    back = schemaless_reader(io.BytesIO(b[10:]), s.parsed[TASK_EVENT], None)
    assert back["error"]["retry_after_ms"] == 2000 and back["stage"] is None


BUNDLED = SCHEMA_FILES + sorted(f"history/{p.name}" for p in (AVRO / "history").glob("*.avsc"))


@pytest.mark.skipif(not AVRO.is_dir(), reason="not in a faultrouter checkout")
@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_schemas_are_the_repositorys(name):
    bundled = Path(__file__).resolve().parents[1] / "src" / "faultrouter" / "avro" / name
    assert filecmp.cmp(bundled, AVRO / name, shallow=False), (
        f"clients/python/src/faultrouter/avro/{name} differs from avro/{name}: copy it over")


def test_an_older_routers_record_is_read():
    # a RoutedRecord written with the frozen first version is read into the current schema
    import json
    from fastavro import parse_schema, schemaless_writer
    from fastavro.schema import fingerprint, to_parsing_canonical_form

    v1 = json.loads((Path(__file__).resolve().parents[1] / "src/faultrouter/avro/history/routed_record.v1.avsc").read_text())
    parsed = parse_schema(v1)
    rec = {"event": None, "decision": {"class": "SUCCEEDED", "route": "COMPLETE", "rule": "r", "reason": "x",
                                       "retry": None, "totals": {"attempts": 1, "retries": 0, "cost_usd": 0.0,
                                                                 "tokens": 0, "elapsed_ms": 0},
                                       "review": None, "feedback": None, "suggested_model": None,
                                       "user_message": None, "decided_at": 0},
           "input": {"topic": "t", "partition": 0, "offset": 1, "timestamp": 0}}
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO")))
    schemaless_writer(buf, parsed, rec)
    name, back = Schemas().decode(buf.getvalue())
    assert name == "faultrouter.RoutedRecord" and back["decision"]["rule"] == "r"
    assert back["decision"].get("prevented") is None
