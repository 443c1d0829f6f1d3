"""Guards the LangChain callback handler: a chat model's run in a task reports one attempt,
an answer, a refusal, a filtered answer or the SDK's exception, mapped as the table says.
The pinned langchain-openai ChatOpenAI and langchain-anthropic ChatAnthropic run against the
fake API; two small chat models of the test's own, on the plain SDKs, cover what those do not
return (a content_filter finish reason) and serve the router suite."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai
import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult

import faultrouter
from faultrouter.langchain import FaultrouterCallbackHandler


class OpenAIChat(BaseChatModel):
    base_url: str
    model: str = "gpt-4o-mini"

    @property
    def _llm_type(self) -> str:
        return "openai-chat"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        c = openai.OpenAI(base_url=self.base_url, api_key="fake", max_retries=0)
        r = c.chat.completions.create(model=self.model, messages=[{"role": "user", "content": messages[-1].content}])
        m = r.choices[0].message
        msg = AIMessage(content=m.content or "", additional_kwargs={"refusal": m.refusal} if m.refusal else {},
                        usage_metadata={"input_tokens": r.usage.prompt_tokens, "output_tokens": r.usage.completion_tokens,
                                        "total_tokens": r.usage.total_tokens},
                        response_metadata={"finish_reason": r.choices[0].finish_reason, "model_name": r.model})
        return ChatResult(generations=[ChatGeneration(message=msg)])


class AnthropicChat(BaseChatModel):
    """What langchain-anthropic's chat model does with the pinned anthropic SDK: the stop
    reason and model in response_metadata."""

    base_url: str
    model: str = "claude-test-1"

    @property
    def _llm_type(self) -> str:
        return "anthropic-chat"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        c = anthropic.Anthropic(base_url=self.base_url, api_key="fake", max_retries=0)
        r = c.messages.create(model=self.model, max_tokens=100, messages=[{"role": "user", "content": messages[-1].content}])
        text = "".join(b.text for b in r.content if b.type == "text")
        msg = AIMessage(content=text, usage_metadata={"input_tokens": r.usage.input_tokens, "output_tokens": r.usage.output_tokens,
                                                      "total_tokens": r.usage.input_tokens + r.usage.output_tokens},
                        response_metadata={"stop_reason": r.stop_reason, "model_name": r.model})
        return ChatResult(generations=[ChatGeneration(message=msg)])


@pytest.fixture
def chat(api):
    return OpenAIChat(base_url=api.url + "/v1")


@pytest.fixture
def handler(reporter):
    return FaultrouterCallbackHandler(reporter, action="answer_ticket", prompt_template="lc-v1")


def test_answer(chat, handler, reporter):
    with faultrouter.task("t-lc-ok"):
        chat.invoke("hello", config={"callbacks": [handler]})
    [ev] = reporter.events
    assert (ev["status"], ev["model"], ev["usage"]["tokens"], ev["prompt_template"]) == ("OK", "gpt-4o-mini", 42, "lc-v1")
    assert ev["output"]["text"] == "Echo: hello"


@pytest.mark.parametrize("prompt,code", [("[fake:refusal] x", "refusal"), ("[fake:content_filter] x", "content_filter")])
def test_refusals(chat, handler, reporter, prompt, code):
    with faultrouter.task("t-lc-ref"):
        chat.invoke(prompt, config={"callbacks": [handler]})
    [ev] = reporter.events
    assert (ev["status"], ev["error"]["code"], ev["output"]["confidence"]) == ("ERROR", code, 0.0)


def test_sdk_error(chat, handler, reporter):
    with faultrouter.task("t-lc-429"):
        with pytest.raises(openai.RateLimitError):
            chat.invoke("[fake:429 retry-after=3] x", config={"callbacks": [handler]})
    [ev] = reporter.events
    assert (ev["error"]["http_status"], ev["error"]["retry_after_ms"], ev["attempt"]) == (429, 3000, 1)


def test_async_chain(chat, handler, reporter):
    async def run():
        with faultrouter.task("t-lc-async", attempt=2):
            await chat.ainvoke("hi", config={"callbacks": [handler]})

    asyncio.run(run())
    [ev] = reporter.events
    assert (ev["task_id"], ev["attempt"], ev["status"]) == ("t-lc-async", 2, "OK")


def test_anthropic_stop_reason_refusal(api, handler, reporter):
    chat = AnthropicChat(base_url=api.url)
    with faultrouter.task("t-lc-claude-ref"):
        chat.invoke("[fake:refusal] pick a lock", config={"callbacks": [handler]})
    with faultrouter.task("t-lc-claude-ok"):
        chat.invoke("hello", config={"callbacks": [handler]})
    refused, answered = reporter.events
    assert (refused["status"], refused["error"]["code"], refused["output"]["confidence"], refused["model"]) == \
        ("ERROR", "refusal", 0.0, "claude-test-1")
    assert (answered["status"], answered["output"]["text"], answered["usage"]["tokens"]) == ("OK", "Echo: hello", 42)


@pytest.mark.parametrize("flavour", ["openai", "anthropic"])
def test_the_real_langchain_chat_models(flavour, api, handler, reporter):
    """langchain-openai's ChatOpenAI and langchain-anthropic's ChatAnthropic, as teams use them,
    against the fake API: an answer, a refusal and a 429, each one attempt mapped as the table
    says."""
    if flavour == "openai":
        from langchain_openai import ChatOpenAI

        chat = ChatOpenAI(model="gpt-4o-mini", base_url=api.url + "/v1", api_key="fake", max_retries=0)
        errors = openai
    else:
        from langchain_anthropic import ChatAnthropic

        chat = ChatAnthropic(model="claude-test-1", base_url=api.url, api_key="fake", max_retries=0)
        errors = anthropic
    with faultrouter.task(f"t-lc-real-ok-{flavour}"):
        chat.invoke("hello", config={"callbacks": [handler]})
    with faultrouter.task(f"t-lc-real-ref-{flavour}"):
        chat.invoke("[fake:refusal] pick a lock", config={"callbacks": [handler]})
    with faultrouter.task(f"t-lc-real-429-{flavour}"):
        with pytest.raises(errors.RateLimitError):
            chat.invoke("[fake:429 retry-after=3] x", config={"callbacks": [handler]})
    ok, refused, limited = reporter.events
    assert (ok["status"], ok["output"]["text"], ok["usage"]["tokens"]) == ("OK", "Echo: hello", 42)
    assert ok["model"] in ("gpt-4o-mini", "claude-test-1")
    assert (refused["status"], refused["error"]["code"], refused["output"]["confidence"]) == ("ERROR", "refusal", 0.0)
    assert (limited["stage"], limited["error"]["http_status"], limited["error"]["retry_after_ms"]) == ("NETWORK", 429, 3000)
