"""Where a set of token sequences occurs in a prompt, in one pass: an Aho–Corasick automaton
over token ids (worker/engine/message_spans.py finds a chat's message delimiters with it).

The cost is the prompt's length plus the matches found, whatever the needles' number and
length; a search per needle cost the prompt times the needles, which a request with 200,000
delimiters turned into seconds of Python holding the GIL while every slot of the worker waited
(issue 43, item 10). The needles' count and length are bounded as well
(scheduler/contract/limits.py MAX_MESSAGE_DELIMITERS), so matches are at most the prompt's
length times their count. Between partial matches the search jumps to the next token that
starts a needle (found by list.index, at C speed): a chat's delimiters start with rare
(special) tokens, so a long prompt costs Python steps only where they occur.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class _Automaton:
    goto: list[dict[int, int]]
    """Per node: token -> child (node 0 is the root)."""
    fail: list[int]
    """Per node: the longest proper suffix of its path that is also a node."""
    ends: list[list[int]]
    """Per node: the indices of the needles that end there."""
    out: list[int]
    """Per node: the nearest node along its failure links (itself excluded) where a needle
    ends, 0 for none."""


def first_needle_at(haystack: Sequence[int],
                    needles: Sequence[Sequence[int]]) -> dict[int, int]:
    """For every position of `haystack` where some needle starts, the index of the first needle
    (in `needles`' order) that occurs there. Empty needles match nowhere."""
    auto = _build(needles)
    if not auto.goto[0] or not haystack:
        return {}
    lengths = [len(n) for n in needles]
    candidates = _positions(list(haystack), auto.goto[0])
    goto, fail, ends, out = auto.goto, auto.fail, auto.ends, auto.out
    found: dict[int, int] = {}
    state = pos = 0
    size = len(haystack)
    while pos < size:
        if not state:  # at the root: jump to the next token that starts a needle
            at = bisect_left(candidates, pos)
            if at == len(candidates):
                break
            pos = candidates[at]
        token = haystack[pos]
        while state and token not in goto[state]:
            state = fail[state]
        state = goto[state].get(token, 0)
        node = state if ends[state] else out[state]
        while node:
            for index in ends[node]:
                start = pos - lengths[index] + 1
                if found.get(start, index) >= index:
                    found[start] = index
            node = out[node]
        pos += 1
    return found


def _positions(haystack: list[int], tokens: Iterable[int]) -> list[int]:
    """Where any of `tokens` occurs in `haystack`, ascending."""
    found: list[int] = []
    for token in tokens:
        pos = -1
        try:
            while True:
                pos = haystack.index(token, pos + 1)
                found.append(pos)
        except ValueError:
            pass
    found.sort()
    return found


def _build(needles: Sequence[Sequence[int]]) -> _Automaton:
    goto: list[dict[int, int]] = [{}]
    ends: list[list[int]] = [[]]
    for index, needle in enumerate(needles):
        if not needle:
            continue
        node = 0
        for token in needle:
            child = goto[node].get(token)
            if child is None:
                child = len(goto)
                goto[node][token] = child
                goto.append({})
                ends.append([])
            node = child
        ends[node].append(index)
    fail = [0] * len(goto)
    out = [0] * len(goto)
    queue: deque[int] = deque(goto[0].values())  # depth 1: fail and out are the root
    while queue:
        node = queue.popleft()
        for token, child in goto[node].items():
            link = fail[node]
            while link and token not in goto[link]:
                link = fail[link]
            fail[child] = goto[link].get(token, 0)
            out[child] = fail[child] if ends[fail[child]] else out[fail[child]]
            queue.append(child)
    return _Automaton(goto, fail, ends, out)
