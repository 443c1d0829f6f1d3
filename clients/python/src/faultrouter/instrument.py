"""instrument(client): every call made through an OpenAI or Anthropic client reports its
attempt, and the router's shared retry budget is the only retry layer.

Why the client's own retries are turned off: the SDKs retry inside one call (the OpenAI
client's max_retries defaults to 2), so one call can hide three HTTP attempts, their cost and
their 429s, and a second 429 inside the router's window would be retried by the SDK when the
router would have stopped the task. instrument() sets the client's max_retries to 0, and a
per-request max_retries to 0 too, so that each HTTP attempt is one call, one reported
attempt, and the router decides whether and when there is another (a 429 is retried after its
retry-after, as a retry the worker takes from faultrouter.Retries).
"""

from __future__ import annotations

import copy
import functools
import inspect
import time
import warnings
from typing import Any, Callable, TypeVar

from . import mapping
from .context import Reports, build, current_attempt, current_task

C = TypeVar("C")


def _provider(client: Any) -> str:
    return type(client).__module__.split(".")[0]


def instrument(client: C, reporter: Reports, *, action: str | None = None, prompt_template: str | None = None,
               prices: dict | None = None, validate: Callable[[Any], None] | None = None) -> C:
    """Instruments an openai.OpenAI / AsyncOpenAI or anthropic.Anthropic / AsyncAnthropic
    client (in place; returned for convenience).

    Every call inside `with faultrouter.task(task_id):` reports one attempt of that task to
    reporter: its outcome mapped as faultrouter.mapping's table says, its model, tokens and
    elapsed time, its cost from prices ({model prefix: (USD per 1M input tokens, per 1M output
    tokens)}), with action and prompt_template (the task's own win). validate(response), if
    given, runs on each answer before it is reported: raise faultrouter.OutputInvalid (or a
    pydantic ValidationError) there to report a schema violation; it is raised to the caller.
    Inside faultrouter.attempt(...), calls add to that attempt instead of reporting. A call
    outside any task is made and not reported (a warning says so, once). The client's own
    retries are turned off (see the module's doc). Copies made with client.with_options(...)
    are instrumented alike. A streamed call (stream=True, or the SDKs' stream helpers) reports
    when its stream ends: read to its end, closed, or failed on the way; its text, refusal,
    finish or stop reason and usage are those the stream carried (OpenAI sends usage in a
    stream only with stream_options={"include_usage": True}).
    """
    if getattr(client, "_faultrouter", None) is not None:
        return client
    if not hasattr(client, "request") or not hasattr(client, "max_retries"):
        raise TypeError(f"instrument: {type(client).__name__} is not an OpenAI or Anthropic client")
    defaults: dict[str, Any] = {"provider": _provider(client)}
    if action:
        defaults["action"] = action
    if prompt_template:
        defaults["prompt_template"] = prompt_template
    client.max_retries = 0  # type: ignore[attr-defined]
    client._faultrouter = True  # type: ignore[attr-defined]
    warned = [False]

    def no_retries(options: Any) -> Any:
        if isinstance(getattr(options, "max_retries", None), int) and options.max_retries:
            options = copy.copy(options)
            options.max_retries = 0
        return options

    def settle(t0: float, outcome: dict, model: Any, where: tuple | None = None) -> None:
        """Reports (or adds to the open attempt) one call's outcome: in the task (or attempt)
        current now, or in where's, (attempt, task) as they were when a stream was opened."""
        elapsed = round((time.monotonic() - t0) * 1000)
        tokens = mapping.tokens_of(model) if model is not None else (0, 0)
        outcome.setdefault("provider", defaults["provider"])
        outcome["usage"] = {"tokens": sum(tokens), "cost_usd": mapping.cost_usd(outcome.get("model"), tokens, prices),
                            "elapsed_ms": elapsed}
        a, t = where if where is not None else (current_attempt(), current_task())
        if a is not None:
            a.add_call(outcome)
            return
        if t is None:
            if not warned[0]:
                warned[0] = True
                warnings.warn("faultrouter: a call outside faultrouter.task(...) is not reported", stacklevel=4)
            return
        if not (t.fields.get("action") or defaults.get("action")):
            raise ValueError("faultrouter: no action: give instrument(..., action=) or task(..., action=)")
        t.events.append(reporter.report(build(t, outcome, elapsed, defaults)))

    def on_answer(resp: Any, model_hint: Any, options: Any) -> dict:
        outcome = mapping.cut_off_structured(resp, getattr(options, "json_data", None)) or mapping.from_response(resp)
        if not outcome.get("model") and isinstance(model_hint, str):
            outcome["model"] = model_hint
        return outcome

    def requested_model(options: Any) -> Any:
        body = getattr(options, "json_data", None)
        return body.get("model") if isinstance(body, dict) else None

    def streamed(resp: Any, kind: str, t0: float, model: Any) -> Any:
        """The stream resp (of SDK kind), wrapped to report its attempt when it ends (read to
        its end, closed, or failed), from what it carried."""
        where = (current_attempt(), current_task())
        acc = mapping.StreamAccumulator(kind)

        def end(exc: BaseException | None) -> None:
            if exc is not None:
                settle(t0, {**mapping.from_exception(exc), "model": acc.model or model}, acc.response(), where)
                return
            body = acc.response()
            outcome = on_answer(body, model, None)
            settle(t0, outcome, body, where)

        cls = _AsyncReportingStream if hasattr(resp, "__aiter__") else _ReportingStream
        return cls(resp, acc, end)

    original = client.request  # type: ignore[attr-defined]
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def request_async(cast_to: Any, options: Any, *a: Any, **kw: Any) -> Any:
            options, t0, model = no_retries(options), time.monotonic(), requested_model(options)
            try:
                resp = await original(cast_to, options, *a, **kw)
            except Exception as e:
                settle(t0, {**mapping.from_exception(e), "model": model}, None)
                raise
            if (kind := mapping.stream_kind(resp)) is not None:
                return streamed(resp, kind, t0, model)
            outcome = on_answer(resp, model, options)
            try:
                if validate is not None and outcome["status"] == "OK":
                    validate(resp)
            except Exception as e:
                settle(t0, {**mapping.from_exception(e), "model": outcome.get("model")}, resp)
                raise
            settle(t0, outcome, resp)
            return resp
        client.request = request_async  # type: ignore[attr-defined]
    else:
        @functools.wraps(original)
        def request(cast_to: Any, options: Any, *a: Any, **kw: Any) -> Any:
            options, t0, model = no_retries(options), time.monotonic(), requested_model(options)
            try:
                resp = original(cast_to, options, *a, **kw)
            except Exception as e:
                settle(t0, {**mapping.from_exception(e), "model": model}, None)
                raise
            if (kind := mapping.stream_kind(resp)) is not None:
                return streamed(resp, kind, t0, model)
            outcome = on_answer(resp, model, options)
            try:
                if validate is not None and outcome["status"] == "OK":
                    validate(resp)
            except Exception as e:
                settle(t0, {**mapping.from_exception(e), "model": outcome.get("model")}, resp)
                raise
            settle(t0, outcome, resp)
            return resp
        client.request = request  # type: ignore[attr-defined]

    copier = client.copy  # type: ignore[attr-defined]

    @functools.wraps(copier)
    def instrumented_copy(*a: Any, **kw: Any) -> Any:
        return instrument(copier(*a, **kw), reporter, action=action, prompt_template=prompt_template,
                          prices=prices, validate=validate)

    client.copy = client.with_options = instrumented_copy  # type: ignore[attr-defined]
    return client


class _StreamReport:
    """What both stream wrappers share: the stream, what its chunks carried, and the report
    made once, when it ends; every other attribute is the stream's."""

    def __init__(self, stream: Any, acc: Any, end: Callable[[BaseException | None], None]):
        self._stream, self._acc, self._end, self._done = stream, acc, end, False

    def _finish(self, exc: BaseException | None) -> None:
        if not self._done:
            self._done = True
            self._end(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _ReportingStream(_StreamReport):
    """An SDK stream that reports its attempt once, when it ends."""

    def __init__(self, stream: Any, acc: Any, end: Callable[[BaseException | None], None]):
        super().__init__(stream, acc, end)
        self._it = iter(stream)

    def __iter__(self) -> Any:
        return self

    def __next__(self) -> Any:
        try:
            chunk = next(self._it)
        except StopIteration:
            self._finish(None)
            raise
        except Exception as e:
            self._finish(e)
            raise
        self._acc.add(chunk)
        return chunk

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._finish(None)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _AsyncReportingStream(_StreamReport):
    """_ReportingStream for the SDKs' async streams."""

    def __init__(self, stream: Any, acc: Any, end: Callable[[BaseException | None], None]):
        super().__init__(stream, acc, end)
        self._it = stream.__aiter__()

    def __aiter__(self) -> Any:
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self._it.__anext__()
        except StopAsyncIteration:
            self._finish(None)
            raise
        except Exception as e:
            self._finish(e)
            raise
        self._acc.add(chunk)
        return chunk

    async def close(self) -> None:
        try:
            await self._stream.close()
        finally:
            self._finish(None)

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
