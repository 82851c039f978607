"""Synthetic speculative acceptance (--spec-synth-len, --spec-synth-rates; benchmarking only:
the output is not the model's): each draft position is accepted at random with a given
probability instead of by match with the target (llama.cpp's
common_speculative_synth_rates_resolve and llama-server's server_sample_and_accept_synth).

Owns: the per-position rates (from a mean acceptance length, by bisection, or given), their
conditional probabilities, and the run's random numbers, drawn as libstdc++'s
std::uniform_real_distribution<double> on std::mt19937 seeded with the request's seed.
"""

from __future__ import annotations

import math
import random


class SynthError(ValueError):
    pass


def resolve_rates(synth_len: float | None, synth_rates: list[float], n_max: int) -> list[float]:
    """The unconditional acceptance rate of each draft position (empty: off)."""
    if synth_len is None and not synth_rates:
        return []
    if synth_len is not None and synth_rates:
        raise SynthError("synthetic acceptance length and rates are mutually exclusive")
    if n_max <= 0:
        raise SynthError("synthetic acceptance requires at least one speculative token")
    if synth_rates:
        if len(synth_rates) != n_max:
            raise SynthError(f"synthetic acceptance rates must contain {n_max} values, got "
                             f"{len(synth_rates)}")
        for i, rate in enumerate(synth_rates):
            if not math.isfinite(rate) or not 0.0 <= rate <= 1.0:
                raise SynthError("synthetic acceptance rates must be finite and within [0, 1]")
            if i > 0 and rate > synth_rates[i - 1]:
                raise SynthError("synthetic acceptance rates must be monotonically "
                                 "non-increasing")
        return list(synth_rates)
    assert synth_len is not None
    length_max = n_max + 1.0
    if not math.isfinite(synth_len) or not 1.0 <= synth_len <= length_max:
        raise SynthError("synthetic acceptance length must be finite and within "
                         f"[1, {length_max:.0f}]")
    p = 0.0
    if synth_len == length_max:
        p = 1.0
    elif synth_len > 1.0:
        p_min, p_max = 0.0, 1.0
        for _ in range(32):
            p_mid = 0.5 * (p_min + p_max)
            total, term = 0.0, p_mid
            for _ in range(n_max):
                total += term
                term *= p_mid
            if total < synth_len - 1.0:
                p_min = p_mid
            else:
                p_max = p_mid
        p = 0.5 * (p_min + p_max)
    rates, rate = [], p
    for _ in range(n_max):
        rates.append(rate)
        rate *= p
    return rates


def conditional(rates: list[float]) -> list[float]:
    """P(position i accepted | position i - 1 accepted), as common_speculative_init keeps."""
    probs, previous = [], 1.0
    for rate in rates:
        probs.append(rate / previous if previous > 0.0 else 0.0)
        previous = rate
    return probs


class SynthRng:
    """std::mt19937 seeded with a 32-bit seed (init_genrand, which numpy's legacy seeding
    is) and std::uniform_real_distribution<double>(0, 1) over it (libstdc++'s
    generate_canonical: two 32-bit draws, (x0 + x1 * 2^32) / 2^64)."""

    def __init__(self, seed: int | None) -> None:
        import numpy as np

        self._state = np.random.RandomState(
            random.getrandbits(32) if seed is None else seed & 0xFFFFFFFF)

    def uniform(self) -> float:
        import numpy as np

        x0, x1 = (int(x) for x in self._state.randint(0, 2**32, size=2, dtype=np.uint64))
        value = (x0 + x1 * 2.0**32) / 2.0**64
        return value if value < 1.0 else math.nextafter(1.0, 0.0)
