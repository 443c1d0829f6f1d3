"""TaskEvent checks: a bad field is one clear error naming it and what is allowed."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from ._schemas import Schemas


class FieldError(ValueError):
    """A TaskEvent (or ReviewDecision) field is missing, unknown or of the wrong type.
    field is its dotted path, e.g. "error.http_status"."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


def now() -> datetime:
    return datetime.now(timezone.utc)


def complete(event: dict, source: str) -> dict:
    """The event with event_id, occurred_at, source and usage filled in where missing."""
    return {"event_id": str(uuid.uuid4()), "occurred_at": now(), "source": source, "usage": {}, **event}


_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "string": (str,), "boolean": (bool,), "int": (int,), "long": (int,),
    "double": (int, float), "float": (int, float),
}
_INT32 = (-(1 << 31), (1 << 31) - 1)


def check(schemas: Schemas, name: str, record: Any) -> None:
    """Raises FieldError for the first field of record that schema name does not accept."""
    _check(schemas.raw[name], record, "", schemas)


def _named(schemas: Schemas, t: Any) -> Any:
    if isinstance(t, str) and t not in _PRIMITIVES and t != "null":
        full = t if "." in t else "faultrouter." + t
        if full in schemas.raw:
            return schemas.raw[full]
        for r in schemas.raw.values():  # a type defined inside another schema
            found = _find(r, full)
            if found is not None:
                return found
    return t


def _find(schema: Any, full: str) -> Any:
    if isinstance(schema, dict):
        if schema.get("name") in (full, full.split(".")[-1]) and schema.get("type") in ("record", "enum"):
            return schema
        for v in schema.values():
            f = _find(v, full)
            if f is not None:
                return f
    elif isinstance(schema, list):
        for v in schema:
            f = _find(v, full)
            if f is not None:
                return f
    return None


def _describe(t: Any) -> str:
    if isinstance(t, dict):
        if t.get("logicalType") == "timestamp-millis":
            return "a datetime (or integer milliseconds)"
        if t["type"] == "enum":
            return "one of " + ", ".join(t["symbols"])
        if t["type"] == "record":
            return "an object"
        if t["type"] == "array":
            return "a list"
        if t["type"] == "map":
            return "a dict of str"
    if isinstance(t, list):
        return " or ".join("None" if x == "null" else _describe(x) for x in t)
    return {"string": "a str", "int": "an int", "long": "an int", "double": "a number", "boolean": "a bool"}.get(t, str(t))


def _check(t: Any, v: Any, path: str, schemas: Schemas) -> None:
    t = _named(schemas, t)
    where = path or "the record"
    if isinstance(t, list):  # a union: null and one other type, in these schemas
        if v is None and "null" in t:
            return
        others = [x for x in t if x != "null"]
        if v is None:
            raise FieldError(where, f"is None; allowed: {_describe(t)}")
        _check(others[0], v, path, schemas)
        return
    if isinstance(t, dict):
        kind = t["type"]
        if t.get("logicalType") == "timestamp-millis":
            if isinstance(v, datetime):
                if v.tzinfo is None:
                    raise FieldError(where, "is a naive datetime; give one with a time zone (UTC)")
                return
            if isinstance(v, int) and not isinstance(v, bool):
                return
            raise FieldError(where, f"is {v!r}; allowed: {_describe(t)}")
        if kind == "record":
            if not isinstance(v, dict):
                raise FieldError(where, f"is {type(v).__name__}; allowed: an object with fields "
                                 + ", ".join(f["name"] for f in t["fields"]))
            names = [f["name"] for f in t["fields"]]
            for k in v:
                if k not in names:
                    raise FieldError(_join(path, k), f"unknown field; allowed: {', '.join(names)}")
            for f in t["fields"]:
                if f["name"] not in v:
                    if "default" in f:
                        continue
                    raise FieldError(_join(path, f["name"]), "is required")
                _check(f["type"], v[f["name"]], _join(path, f["name"]), schemas)
            return
        if kind == "enum":
            if v not in t["symbols"]:
                raise FieldError(where, f"is {v!r}; allowed: {', '.join(t['symbols'])}")
            return
        if kind == "array":
            if not isinstance(v, (list, tuple)):
                raise FieldError(where, f"is {type(v).__name__}; allowed: a list")
            for i, x in enumerate(v):
                _check(t["items"], x, f"{where}[{i}]", schemas)
            return
        if kind == "map":
            if not isinstance(v, dict):
                raise FieldError(where, f"is {type(v).__name__}; allowed: a dict of str")
            for k, x in v.items():
                _check(t["values"], x, f"{where}[{k!r}]", schemas)
            return
        _check(kind, v, path, schemas)
        return
    allowed = _PRIMITIVES.get(t)
    if allowed is None:
        raise FieldError(where, f"has the unsupported type {t}")
    if isinstance(v, bool) and t != "boolean" or not isinstance(v, allowed):
        raise FieldError(where, f"is {v!r} ({type(v).__name__}); allowed: {_describe(t)}")
    if t == "int" and isinstance(v, int) and not _INT32[0] <= v <= _INT32[1]:
        raise FieldError(where, f"is {v}, outside a 32-bit int")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
