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

from scheduler.contract.message_delimiters import MessageDelimiter
from worker.engine.token_search import first_needle_at
from worker.runtime.vocab import Vocab


def user_starts(prompt: list[int], delimiters: list[MessageDelimiter],
                vocab: Vocab) -> tuple[int, ...]:
    """The positions in `prompt` where a user message starts, ascending. One pass over the
    prompt for all delimiters (worker/engine/token_search.py); their count and length were
    bounded by check_completion (scheduler/contract/limits.py) in the api and again in
    worker/engine/requests.py."""
    if not any(d.role == "user" for d in delimiters):
        return ()
    needles = [vocab.tokenize(d.delimiter, add_special=False, parse_special=True)
               for d in delimiters]
    first = first_needle_at(prompt, needles)
    return tuple(sorted(pos for pos, index in first.items()
                        if delimiters[index].role == "user"))
