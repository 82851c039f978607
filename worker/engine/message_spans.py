"""Where a prompt's user messages start, in tokens: the job's message delimiters (a chat
template's, api/chat/delimiters.py) found in its prompt tokens, as llama-server's
common_chat_msg_delimiters::split finds them. The engine cuts the prefill there and takes
context checkpoints there (worker/kv/checkpoints.py), so a chat that goes on from an earlier
user message restores its cache as llama-server's does.

At each position the first delimiter in the job's order that matches is the message that
starts there (matches may overlap). Media chunks need no skipping: their placeholders are
negative and match no delimiter. A delimiter that tokenizes to nothing is left out (in
llama-server it would match at every position).
"""

from __future__ import annotations

from scheduler.contract.jobs import MessageDelimiter
from worker.runtime.vocab import Vocab


def user_starts(prompt: list[int], delimiters: list[MessageDelimiter],
                vocab: Vocab) -> tuple[int, ...]:
    """The positions in `prompt` where a user message starts, ascending."""
    if not any(d.role == "user" for d in delimiters):
        return ()
    first_match: dict[int, str] = {}
    for delimiter in delimiters:
        tokens = vocab.tokenize(delimiter.delimiter, add_special=False, parse_special=True)
        for pos in _matches(prompt, tokens):
            first_match.setdefault(pos, delimiter.role)
    return tuple(sorted(pos for pos, role in first_match.items() if role == "user"))


def _matches(prompt: list[int], needle: list[int]) -> list[int]:
    """Where `needle` occurs in `prompt` (list.index finds its first token at C speed)."""
    if not needle:
        return []
    found: list[int] = []
    pos = -1
    end = len(prompt) - len(needle)
    while True:
        try:
            pos = prompt.index(needle[0], pos + 1, end + 1)
        except ValueError:
            return found
        if prompt[pos:pos + len(needle)] == needle:
            found.append(pos)
