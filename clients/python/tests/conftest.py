"""Fixtures shared by the package's tests: the fake API, and a reporter that keeps what it is
given after the same checks and encoding as Reporter."""

from __future__ import annotations

import pytest

from faultrouter import events
from faultrouter._schemas import TASK_EVENT, Schemas
from faultrouter.fake import FakeAPI


class MemoryReporter:
    """Reporter's checks and Avro encoding, without Kafka: events holds what was reported."""

    def __init__(self, source: str = "test"):
        self.schemas = Schemas()
        self.source = source
        self.events: list[dict] = []

    def report(self, event: dict) -> dict:
        event = events.complete(event, self.source)
        events.check(self.schemas, TASK_EVENT, event)
        self.schemas.encode(TASK_EVENT, event)
        self.events.append(event)
        return event


@pytest.fixture
def reporter() -> MemoryReporter:
    return MemoryReporter()


@pytest.fixture(scope="session")
def api():
    with FakeAPI() as a:
        yield a
