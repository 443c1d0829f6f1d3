"""A LangChain callback handler that reports every model call of a chain as an attempt.

    from faultrouter.langchain import FaultrouterCallbackHandler
    handler = FaultrouterCallbackHandler(reporter, action="answer_ticket")
    with faultrouter.task(task_id):
        chain.invoke(inputs, config={"callbacks": [handler]})

Give the chat model max_retries=0 (ChatOpenAI(max_retries=0), ChatAnthropic(max_retries=0)):
as with instrument(), the router's retry budget is then the only retry layer. Use the handler
or an instrumented client underneath the chain, not both: each would report the call.
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from . import mapping
from .context import Reports, build, current_attempt, current_task


def _provider(serialized: dict | None) -> str | None:
    ids = (serialized or {}).get("id") or []
    for part in ids:  # ["langchain", "chat_models", "openai", "ChatOpenAI"]
        if part in ("openai", "anthropic", "google_genai", "mistralai", "ollama", "bedrock"):
            return part
    return None


class FaultrouterCallbackHandler(BaseCallbackHandler):
    """Reports each LLM or chat model run of the current faultrouter.task as one attempt."""

    raise_error = True  # a bad field is the caller's to see, not LangChain's to log

    def __init__(self, reporter: Reports, *, action: str, prompt_template: str | None = None,
                 prices: dict | None = None):
        self.reporter = reporter
        self.defaults: dict[str, Any] = {"action": action}
        if prompt_template:
            self.defaults["prompt_template"] = prompt_template
        self.prices = prices
        self.runs: dict[UUID, tuple[float, dict]] = {}

    def _start(self, serialized: dict | None, run_id: UUID, kwargs: dict) -> None:
        params = kwargs.get("invocation_params") or {}
        meta = kwargs.get("metadata") or {}
        model = params.get("model") or params.get("model_name") or meta.get("ls_model_name")
        provider = _provider(serialized) or meta.get("ls_provider")
        self.runs[run_id] = (time.monotonic(), {"model": model, "provider": provider})

    def on_llm_start(self, serialized: dict, prompts: list[str], *, run_id: UUID, **kwargs: Any) -> None:
        self._start(serialized, run_id, kwargs)

    def on_chat_model_start(self, serialized: dict, messages: list, *, run_id: UUID, **kwargs: Any) -> None:
        self._start(serialized, run_id, kwargs)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        gen = response.generations[0][0] if response.generations and response.generations[0] else None
        msg = getattr(gen, "message", None)
        info = {**(getattr(gen, "generation_info", None) or {}), **(getattr(msg, "response_metadata", None) or {})}
        text = getattr(gen, "text", None) or None
        refusal = (getattr(msg, "additional_kwargs", None) or {}).get("refusal")
        if refusal:
            outcome = mapping.refusal("refusal", refusal)
        elif info.get("finish_reason") == "content_filter":
            outcome = mapping.refusal("content_filter", text)
        elif info.get("stop_reason") == "refusal":
            outcome = mapping.refusal("refusal", text)
        else:
            outcome = {"status": "OK", "stage": "MODEL"}
            if text:
                outcome["output"] = {"text": text[:mapping.TEXT_LIMIT]}
        tokens = (0, 0)
        um = getattr(msg, "usage_metadata", None)
        if um:
            tokens = (um.get("input_tokens", 0), um.get("output_tokens", 0))
        else:
            tu = (response.llm_output or {}).get("token_usage") or (response.llm_output or {}).get("usage") or {}
            tokens = mapping.tokens_of({"usage": tu})
        model = info.get("model_name") or info.get("model")
        self._settle(run_id, outcome, tokens, model)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._settle(run_id, mapping.from_exception(error), (0, 0), None)

    def _settle(self, run_id: UUID, outcome: dict, tokens: tuple[int, int], model: str | None) -> None:
        t0, seen = self.runs.pop(run_id, (time.monotonic(), {}))
        elapsed = round((time.monotonic() - t0) * 1000)
        outcome["model"] = model or seen.get("model")
        outcome["provider"] = seen.get("provider")
        outcome["usage"] = {"tokens": sum(tokens), "cost_usd": mapping.cost_usd(outcome["model"], tokens, self.prices),
                            "elapsed_ms": elapsed}
        a = current_attempt()
        if a is not None:
            a.add_call(outcome)
            return
        t = current_task()
        if t is None:
            return
        t.events.append(self.reporter.report(build(t, outcome, elapsed, self.defaults)))
