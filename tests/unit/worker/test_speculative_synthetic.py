"""Synthetic acceptance's rates and random numbers are llama.cpp's
(common_speculative_synth_rates_resolve, libstdc++'s uniform_real_distribution on mt19937)."""

from __future__ import annotations

import pytest

from worker.speculative.synthetic import SynthError, SynthRng, conditional, resolve_rates


def test_a_mean_length_becomes_geometric_rates() -> None:
    rates = resolve_rates(3.0, [], 4)
    assert sum(rates) == pytest.approx(2.0, abs=1e-6)  # mean length 3 = 1 + sum of rates
    assert rates[1] == pytest.approx(rates[0] ** 2) and rates[3] == pytest.approx(rates[0] ** 4)
    assert resolve_rates(5.0, [], 4) == [1.0] * 4 and resolve_rates(1.0, [], 2) == [0.0, 0.0]
    assert conditional([0.8, 0.4, 0.0, 0.0]) == [0.8, 0.5, 0.0, 0.0]


@pytest.mark.parametrize(("length", "rates", "n_max", "words"), [
    (2.0, [0.5], 1, "mutually exclusive"),
    (None, [0.5], 2, "must contain 2 values, got 1"),
    (None, [0.5, 0.6], 2, "monotonically non-increasing"),
    (None, [1.5, 0.5], 2, "finite and within [0, 1]"),
    (9.0, [], 4, "length must be finite and within [1, 5]"),
    (2.0, [], 0, "requires at least one speculative token"),
])
def test_bad_settings_get_llama_cpps_words(length: float | None, rates: list[float],
                                           n_max: int, words: str) -> None:
    with pytest.raises(SynthError, match=words.replace("[", r"\[").replace("]", r"\]")):
        resolve_rates(length, rates, n_max)


def test_the_random_numbers_are_libstdcxx_uniform_real_on_mt19937() -> None:
    """std::mt19937 r; r.seed(42); std::uniform_real_distribution<double> d(0, 1): d(r) three
    times, printed with %.17g by a C++ program built with g++."""
    rng = SynthRng(42)
    assert [rng.uniform() for _ in range(3)] == [0.79654298428784598, 0.18343478789336848,
                                                 0.77969099761266125]
