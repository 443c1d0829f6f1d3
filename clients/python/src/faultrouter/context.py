"""The task context a caller sets once, and attempt(): one reported event per attempt."""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Literal, Protocol

from . import mapping


class Reports(Protocol):
    def report(self, event: dict) -> dict: ...


class Task:
    """The task of the calls made in a `with faultrouter.task(...)` block: its ID, the next
    attempt number and the fields every attempt of it reports (action, prompt_template,
    sla_ms, attributes, ...)."""

    def __init__(self, task_id: str, attempt: int, fields: dict):
        if not task_id:
            raise ValueError("task: task_id is empty")
        if not isinstance(attempt, int) or attempt < 1:
            raise ValueError(f"task: attempt is {attempt!r}; allowed: an int, 1 or more")
        self.task_id = task_id
        self.attempt = attempt
        self.fields = fields
        self.events: list[dict] = []  # what was reported in this block, in order

    def take_attempt(self) -> int:
        n = self.attempt
        self.attempt += 1
        return n


_task: contextvars.ContextVar[Task | None] = contextvars.ContextVar("faultrouter_task", default=None)
_attempt: contextvars.ContextVar["attempt | None"] = contextvars.ContextVar("faultrouter_attempt", default=None)


def current_task() -> Task | None:
    return _task.get()


def current_attempt() -> "attempt | None":
    return _attempt.get()


@contextmanager
def task(task_id: str, *, attempt: int = 1, **fields: Any) -> Iterator[Task]:
    """Every attempt reported inside this block (by an instrumented client, a LangChain
    handler or faultrouter.attempt) belongs to task_id; the first is attempt number attempt,
    each next one is one more. fields are TaskEvent fields every attempt reports (action,
    prompt_template, sla_ms, attributes, input_ref, operation). Works across await: the
    context is a contextvar."""
    token = _task.set(Task(task_id, attempt, fields))
    try:
        yield _task.get()  # type: ignore[misc]
    finally:
        _task.reset(token)


def build(t: Task, outcome: dict, elapsed_ms: int, defaults: dict) -> dict:
    """One TaskEvent of task t: the defaults, then the task's fields, then the outcome's."""
    ev = {**defaults, **t.fields}
    usage = dict(outcome.pop("usage", None) or {})
    ev.update({k: v for k, v in outcome.items() if v is not None or k not in ev})
    usage.setdefault("elapsed_ms", elapsed_ms)
    ev["usage"] = usage
    ev["task_id"] = t.task_id
    ev["attempt"] = t.take_attempt()
    return ev


class attempt:
    """One attempt of the current task, reported exactly once when it ends.

    As a context manager (`with faultrouter.attempt(reporter):`, or `async with`) or a
    decorator (sync or async functions): it times the block, catches its exception, maps it
    (faultrouter.mapping) and re-raises it; calls through instrumented clients inside it add
    their model, tokens and cost, and a refusal they saw, instead of reporting themselves.
    The task is the enclosing `faultrouter.task(...)`, or task_id= here (then attempt
    number attempt_no, default 1). fields are more TaskEvent fields (action, provider,...).
    Use output(...) to report what your checks found in the answer, and raise
    faultrouter.OutputInvalid when it fails your schema.
    """

    def __init__(self, reporter: Reports, *, task_id: str | None = None, attempt_no: int = 1, **fields: Any):
        self.reporter = reporter
        self.task_id = task_id
        self.attempt_no = attempt_no
        self.fields = fields
        self.seen: dict = {}
        self.tokens = 0
        self.cost = 0.0
        self.event: dict | None = None

    # --- what happened inside ---

    def add_call(self, fields: dict) -> None:
        """Called by instrumented clients: one SDK call's outcome inside this attempt."""
        usage = fields.get("usage") or {}
        self.tokens += usage.get("tokens", 0)
        self.cost += usage.get("cost_usd", 0.0)
        for k in ("provider", "model"):
            if fields.get(k):
                self.seen[k] = fields[k]
        if fields.get("status") == "ERROR" and fields.get("error", {}).get("type") == "Refusal":
            self.seen["refusal"] = {k: fields[k] for k in ("stage", "error", "output")}
        elif "output" in fields:
            self.seen["output"] = fields["output"]

    def output(self, text: str | None = None, *, schema_valid: bool | None = None,
               confidence: float | None = None, flags: list[str] | None = None) -> None:
        """What your checks found in the model's answer (output.* of the event)."""
        self.seen["output"] = {"text": text[:mapping.TEXT_LIMIT] if text else None, "schema_valid": schema_valid,
                               "confidence": confidence, "flags": list(flags or [])}

    # --- context manager ---

    def __enter__(self) -> "attempt":
        self._token = _attempt.set(self)
        self._owned = None
        if _task.get() is None:
            if not self.task_id:
                _attempt.reset(self._token)
                raise ValueError("attempt: no task: give task_id= or use it inside faultrouter.task(...)")
            self._owned = _task.set(Task(self.task_id, self.attempt_no, {}))
        self._t0 = time.monotonic()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        elapsed = round((time.monotonic() - self._t0) * 1000)
        try:
            t = _task.get()
            assert t is not None
            if exc is not None:
                outcome = mapping.from_exception(exc)
            elif "refusal" in self.seen:
                outcome = {"status": "ERROR", **self.seen["refusal"]}
            else:
                outcome = {"status": "OK", "stage": "MODEL"}
                if "output" in self.seen:
                    outcome["output"] = self.seen["output"]
                    if self.seen["output"].get("schema_valid") is False:
                        outcome["status"] = "ERROR"
            outcome.update({k: self.seen[k] for k in ("provider", "model") if k in self.seen})
            outcome["usage"] = {"tokens": self.tokens, "cost_usd": self.cost}
            self.event = self.reporter.report(build(t, outcome, elapsed, self.fields))
            t.events.append(self.event)
        finally:
            if self._owned is not None:
                _task.reset(self._owned)
            _attempt.reset(self._token)
        return False  # what was caught is raised again

    async def __aenter__(self) -> "attempt":
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> Literal[False]:
        return self.__exit__(*exc)

    # --- decorator ---

    def __call__(self, fn: Callable) -> Callable:
        make = lambda: attempt(self.reporter, task_id=self.task_id, attempt_no=self.attempt_no, **self.fields)  # noqa: E731
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*a: Any, **kw: Any) -> Any:
                async with make():
                    return await fn(*a, **kw)
            return run_async

        @functools.wraps(fn)
        def run(*a: Any, **kw: Any) -> Any:
            with make():
                return fn(*a, **kw)
        return run
