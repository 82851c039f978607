"""The message delimiters' search (worker/engine/token_search.py): one pass for all of them,
the same answer as a search per delimiter (issue 43, item 10)."""

from __future__ import annotations

import random
import time

from worker.engine.token_search import first_needle_at


def per_needle(haystack: list[int], needles: list[list[int]]) -> dict[int, int]:
    """The search message_spans.py made before: each needle in turn, the first in order wins."""
    found: dict[int, int] = {}
    for index, needle in enumerate(needles):
        if not needle:
            continue
        for pos in range(len(haystack) - len(needle) + 1):
            if haystack[pos:pos + len(needle)] == needle:
                found.setdefault(pos, index)
    return found


def test_one_pass_finds_what_a_search_per_needle_finds() -> None:
    rng = random.Random(43)
    for _ in range(2000):
        alphabet = rng.randint(1, 5)
        haystack = [rng.randint(-1, alphabet) for _ in range(rng.randint(0, 60))]
        needles = [[rng.randint(0, alphabet) for _ in range(rng.randint(0, 5))]
                   for _ in range(rng.randint(0, 8))]
        if needles and rng.random() < 0.3:  # a needle inside another, duplicates
            needles.append(needles[0][1:])
            needles.append(list(needles[0]))
        assert first_needle_at(haystack, needles) == per_needle(haystack, needles)


def test_matches_overlap_and_the_first_needle_in_order_wins() -> None:
    assert first_needle_at([1, 1, 1, 2], [[1, 1], [1], [1, 1, 2]]) == {0: 0, 1: 0, 2: 1}
    assert first_needle_at([7, 8, 9], [[], [8, 9, 10]]) == {}
    assert first_needle_at([], [[1]]) == {}


def test_the_search_is_linear_in_the_prompt_whatever_the_needles() -> None:
    """64 needles of 1024 tokens that all nearly match a prompt of one token repeated: a search
    per needle is 64 x 1024 x the prompt's length; one pass stays in milliseconds."""
    prompt = [5] * 20_000
    needles = [[5] * 1023 + [i] for i in range(100, 164)]
    started = time.process_time()
    assert first_needle_at(prompt, needles) == {}
    assert time.process_time() - started < 1.0
    rare = [1] * 100_000  # a long prompt without the delimiters' first token
    started = time.process_time()
    assert first_needle_at(rare, [[2, 3], [4]]) == {}
    assert time.process_time() - started < 0.1
