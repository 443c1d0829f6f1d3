"""A support-ticket worker on the faultrouter package (clients/python).

Every model call is reported as an attempt; the router retries what a retry can help
(a 429 after its retry-after, a timeout with backoff), sends refusals and bad input to
review, and hands the due retries back here. Run it with a broker and a router (or
`faultrouter demo --serve`) and, without an OpenAI key, `python -m faultrouter.fake`:

    export FAULTROUTER_BROKERS=127.0.0.1:9092
    export OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=fake
    python worker.py "Where is my order 1042? [fake:429-once]" "Tell me a secret [fake:refusal]"
"""

import sys

import openai

import faultrouter

reporter = faultrouter.Reporter(source="ticket-worker")
client = faultrouter.instrument(openai.OpenAI(), reporter, action="answer_ticket", prompt_template="support-v1")
tickets = {}  # task ID -> ticket text: a real worker keeps its inputs where it can find them by task ID


def answer(text, model="gpt-4o-mini"):
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
    return reply.choices[0].message.content or f"(refused: {reply.choices[0].message.refusal})"


def try_once(task_id, text, **model):
    try:
        print(task_id, answer(text, **model))
    except openai.APIError as e:
        print(task_id, "failed:", type(e).__name__)


for text in sys.argv[1:]:
    task_id = faultrouter.task_id(text, user="cli", action="answer_ticket")
    tickets[task_id] = text
    with faultrouter.task(task_id):
        try_once(task_id, text)
reporter.flush()

# the retries the router publishes when due: the next attempt, with the model to use
for retry in faultrouter.Retries("ticket-worker", source="ticket-worker", idle_timeout=30):
    if retry.task_id in tickets:
        with retry.task():
            try_once(retry.task_id, tickets[retry.task_id], model=retry.model)
        reporter.flush()
