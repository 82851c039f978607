"""The thinking block of a chat completion, as the worker needs it for the reasoning budget
and /v1/chat/completions/control."""

from __future__ import annotations

from api.chat.reasoning_tags import prompt_opens_thinking, reasoning_tags
from scheduler.contract.jobs import ReasoningSpec


def reasoning_spec(template_source: str, prompt: str, budget: int, message: str,
                   armed: bool) -> ReasoningSpec | None:
    """None when nothing can cut the block short (no budget, no control armed)."""
    if budget < 0 and not armed:
        return None
    start, end = reasoning_tags(template_source)
    return ReasoningSpec(start=start, end=end, budget=budget, message=message,
                         open_at_start=prompt_opens_thinking(prompt, template_source))
