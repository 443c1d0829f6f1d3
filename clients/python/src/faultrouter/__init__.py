"""faultrouter for Python: report every attempt of an AI worker to faultrouter, and take the
retries it publishes when they are due.

    import faultrouter
    from openai import OpenAI

    reporter = faultrouter.Reporter(source="support-bot")
    client = faultrouter.instrument(OpenAI(), reporter, action="answer_ticket")
    with faultrouter.task(faultrouter.task_id(ticket_text, user="alice", action="answer_ticket")):
        client.chat.completions.create(model="gpt-4o-mini", messages=[...])

See docs/getting-started.md in the faultrouter repository, and faultrouter.mapping for how
each SDK outcome is reported.
"""

from .context import Task, attempt, current_task, task
from .events import FieldError
from .instrument import instrument
from .mapping import OutputInvalid
from .reporter import Reporter, Topics
from .retries import Retries, Retry, ReviewOutcome, ReviewOutcomes
from .taskid import task_id

__all__ = ["FieldError", "OutputInvalid", "Reporter", "Retries", "Retry", "ReviewOutcome", "ReviewOutcomes", "Task",
           "Topics", "attempt", "current_task", "instrument", "task", "task_id"]
__version__ = "0.1.0"
