"""llama-server's `message_delimiters` of a completion: where messages start in a rendered chat
prompt."""

from __future__ import annotations

from typing import Any

from scheduler.contract.deferred import DeferredModel


class MessageDelimiter(DeferredModel):
    """Text that starts a message of `role` in a rendered chat prompt (llama-server's
    `message_delimiters`, from its chat template analysis): the worker finds where user
    messages start in the prompt's tokens and cuts and checkpoints the prefill there."""

    role: str = ""
    delimiter: str = ""


def parse_message_delimiters(value: Any) -> list[MessageDelimiter]:
    """llama-server's common_chat_msg_delimiters_parse: an array's objects, each with string
    `role` and `delimiter` (default ""); anything else in it is skipped, and a value that is
    not an array is no delimiters."""
    if not isinstance(value, list):
        return []
    return [MessageDelimiter.model_validate(d, strict=True) for d in value
            if isinstance(d, dict)]
