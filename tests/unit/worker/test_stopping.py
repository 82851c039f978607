"""The stop rules as one pure function (worker/engine/stopping.py), rule by rule and in order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from worker.engine.stopping import StepState, StopReason, StopType, indent_cut, stop_reason

GOING = StepState(is_eog=False, ignore_eos=False, stopping_word=False, n_generated=3,
                  n_predict=10, context_full=False, elapsed_ms=5.0, t_max_predict_ms=0,
                  has_new_line=False, under_indented=False)


def test_nothing_stops_a_run_in_the_middle() -> None:
    assert stop_reason(GOING) is None
    assert stop_reason(replace(GOING, n_predict=-1, n_generated=10**6)) is None


@pytest.mark.parametrize(("change", "reason"), [
    ({"is_eog": True}, StopReason.EOS),
    ({"stopping_word": True}, StopReason.WORD),
    ({"n_generated": 10}, StopReason.N_PREDICT),
    ({"context_full": True}, StopReason.CONTEXT),
    ({"t_max_predict_ms": 4, "has_new_line": True}, StopReason.TIME_LIMIT),
    ({"under_indented": True}, StopReason.N_INDENT),
])
def test_each_rule(change: dict[str, object], reason: StopReason) -> None:
    assert stop_reason(replace(GOING, **change)) is reason  # type: ignore[arg-type]


def test_ignore_eos() -> None:
    assert stop_reason(replace(GOING, is_eog=True, ignore_eos=True)) is None


def test_the_time_limit_waits_for_a_new_line() -> None:
    assert stop_reason(replace(GOING, t_max_predict_ms=4)) is None


def test_order_eos_word_n_predict_context_time_indent() -> None:
    everything = replace(GOING, is_eog=True, stopping_word=True, n_generated=10,
                         context_full=True, t_max_predict_ms=1, has_new_line=True,
                         under_indented=True)
    order = [StopReason.EOS, StopReason.WORD, StopReason.N_PREDICT, StopReason.CONTEXT,
             StopReason.TIME_LIMIT, StopReason.N_INDENT]
    fields = ["is_eog", "stopping_word", "n_generated", "context_full", "t_max_predict_ms",
              "under_indented"]
    off = {"is_eog": False, "stopping_word": False, "n_generated": 0, "context_full": False,
           "t_max_predict_ms": 0, "under_indented": False}
    state = everything
    for reason, name in zip(order, fields, strict=True):
        assert stop_reason(state) is reason
        state = replace(state, **{name: off[name]})  # type: ignore[arg-type]
    assert stop_reason(state) is None


def test_wire_stop_types() -> None:
    assert StopReason.EOS.stop_type is StopType.EOS
    assert StopReason.WORD.stop_type is StopType.WORD
    assert {r.stop_type for r in StopReason} - {StopType.EOS, StopType.WORD} == {StopType.LIMIT}


def test_indent_cut() -> None:
    text = "    x = 1\n    y = 2\nz = 3"
    assert indent_cut(text, 0, 0) == (None, 0)  # off
    cut, start = indent_cut(text, 0, 4)
    assert cut is None and start == text.index("\n") + 1
    assert indent_cut(text, start, 4) == (None, text.index("y = 2") + 6)
    last = text.index("z")
    assert indent_cut(text, last, 4) == (last, last)  # cut before its first character
    assert indent_cut("a\n  ", 2, 4) == (None, 2)  # the line's indentation is not known yet
