"""The engine's step batch (worker/engine/step_batch.py): what put_span writes, which the
engine's prompt chunks, drafts and the embedder's sequences all go through."""

from __future__ import annotations

import llama_cpp as lc

from worker.engine.step_batch import StepBatch


def rows(batch: StepBatch, n: int) -> list[tuple[int, int, int, int, int]]:
    raw = batch.raw
    return [(raw.token[i], raw.pos[i], raw.n_seq_id[i], raw.seq_id[i][0], raw.logits[i])
            for i in range(n)]


def test_a_span_takes_positions_from_its_first_and_outputs_as_asked() -> None:
    batch = StepBatch(16)
    try:
        n = batch.put_span(0, [7, 8, 9], 5, 2, False, True)
        assert n == 3
        n = batch.put_span(n, [4, 5], 0, 1, True, False)
        n = batch.put_span(n, [6, 6], 10, 0, False, False)
        assert n == 7
        assert rows(batch, n) == [(7, 5, 1, 2, 0), (8, 6, 1, 2, 0), (9, 7, 1, 2, 1),
                                  (4, 0, 1, 1, 1), (5, 1, 1, 1, 1),
                                  (6, 10, 1, 0, 0), (6, 11, 1, 0, 0)]
        assert batch.put_span(n, [], 3, 0, False, True) == n
    finally:
        batch.free()


def test_a_span_overwrites_what_an_earlier_step_left() -> None:
    batch = StepBatch(4)
    try:
        batch.put_span(0, [1, 2, 3, 4], 0, 3, True, False)
        batch.put_span(0, [5, 6], 20, 0, False, False)
        assert rows(batch, 4)[:2] == [(5, 20, 1, 0, 0), (6, 21, 1, 0, 0)]
        view = batch.view(0, 2)
        assert view.n_tokens == 2
        tail = batch.view(2, 2)
        assert (tail.token[0], tail.pos[0], tail.seq_id[0][0], tail.logits[0]) == (3, 2, 3, 1)
        assert isinstance(tail, lc.llama_batch)
    finally:
        batch.free()
