"""The greedy-equality verdict of bench/faults.py --scenario worker-migrate (issue 26): migrated
streams are judged against a baseline of undisturbed runs, and only after their seam."""

from __future__ import annotations

from bench.faults import StreamCheck, equality_verdict, first_difference, stays_equal


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 9, 3], [1, 2, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a shorter text differs where it ends
    assert first_difference([], [1]) == 0


def test_a_line_says_where_the_difference_lies_against_the_seam() -> None:
    assert StreamCheck(0, 3, [17], 9).line() == \
        "  round 1 stream 3: migrated at token 17, differs from token 9 (8 tokens before " \
        "the seam)"
    assert StreamCheck(1, 4, [17], 28).line().endswith("(11 tokens after the seam)")
    assert StreamCheck(-1, 2, [], None).line() == "  baseline stream 2: not migrated, equal"


def baseline(equal: int, differ_at: list[int]) -> list[StreamCheck]:
    return [StreamCheck(-1, i, [], None) for i in range(equal)] + \
        [StreamCheck(-1, equal + i, [], at) for i, at in enumerate(differ_at)]


def test_the_baseline_chance_of_staying_equal_counts_only_streams_equal_up_to_the_seam() -> None:
    checks = baseline(8, [0, 3, 30])
    # equal up to token 10: the 8 equal ones and the one differing at 30
    assert stays_equal(checks, 10) == (8 + 1) / (9 + 2)
    assert stays_equal(checks, 40) == (8 + 1) / (8 + 2)


def test_differences_before_the_seam_are_batching_and_do_not_fail_the_verdict() -> None:
    checks = baseline(12, [0, 3, 30, 40]) + \
        [StreamCheck(0, i, [20], 5) for i in range(6)] + \
        [StreamCheck(0, 6 + i, [20], None) for i in range(6)]
    holds, lines = equality_verdict(checks)
    assert holds, lines
    assert "migrated equal 6/12 (50 %)" in lines[0]
    assert "6 first differ before their seam" in lines[1]


def test_migrated_streams_that_differ_after_the_seam_more_than_the_baseline_fail() -> None:
    checks = baseline(30, [0, 3]) + [StreamCheck(0, i, [20], 25) for i in range(6)] + \
        [StreamCheck(0, 6 + i, [20], None) for i in range(6)]
    holds, lines = equality_verdict(checks)
    assert not holds, lines
    assert "FAILS" in lines[-1]
