"""Token probabilities (worker/engine/token_probs.py): top candidates before and after sampling, as
llama-server reports them."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine.token_probs import candidate, post_sampling, pre_sampling, valid_utf8_prefix

PIECES = {0: b"a", 1: b"b", 2: "é".encode(), 3: "日".encode()[:2]}


def piece(token: int) -> bytes:
    return PIECES[token]


def test_before_sampling_the_most_probable_tokens_in_order() -> None:
    probs = np.array([0.1, 0.6, 0.25, 0.05])
    result = pre_sampling(probs, token=2, n_probs=2, piece=piece)
    assert (result.id, result.p) == (2, pytest.approx(0.25))
    assert [(c.id, c.p) for c in result.top] == [(1, pytest.approx(0.6)),
                                                  (2, pytest.approx(0.25))]
    assert result.token == "" and result.bytes == []  # filled in once the text is final


def test_before_sampling_over_a_large_vocabulary_the_top_in_order() -> None:
    """The top n of a Gemma-sized vocabulary by a partition: the same tokens, in the same
    order, as a full sort; asking more than the vocabulary gives all of it."""
    probs = np.random.default_rng(7).random(262_144)
    probs /= probs.sum()
    result = pre_sampling(probs, token=3, n_probs=10, piece=lambda token: b"x")
    assert [c.id for c in result.top] == list(np.argsort(-probs)[:10])
    small = pre_sampling(np.array([0.2, 0.5, 0.3]), token=0, n_probs=8, piece=piece)
    assert [c.id for c in small.top] == [1, 2, 0]


def test_after_sampling_the_candidates_left_with_a_probability() -> None:
    candidates = [(1, 0.7), (0, 0.3), (2, 0.0)]
    result = post_sampling(candidates, token=0, n_probs=5, piece=piece)
    assert result.p == pytest.approx(0.3)
    assert [c.id for c in result.top] == [1, 0]
    assert post_sampling(candidates, token=3, n_probs=1, piece=piece).p == 0.0
    assert [c.id for c in post_sampling(candidates, 1, 1, piece).top] == [1]


def test_a_candidate_carries_its_bytes_and_whole_utf8_text() -> None:
    assert candidate(2, 0.5, piece).model_dump() == {"id": 2, "token": "é",
                                                     "bytes": list("é".encode()), "p": 0.5}
    cut = candidate(3, 0.5, piece)
    assert cut.token == "" and cut.bytes == list("日".encode()[:2])


def test_valid_utf8_prefix() -> None:
    assert valid_utf8_prefix("ab日".encode()[:-1]) == "ab"
    assert valid_utf8_prefix(b"plain") == "plain"
    assert valid_utf8_prefix(b"") == ""
