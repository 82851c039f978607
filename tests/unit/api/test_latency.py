"""api/latency.py's histograms: Prometheus `le` buckets (a value on a bound counts in it),
an event of k tokens counted k times, and text prometheus_client's parser reads."""

from __future__ import annotations

import asyncio

from api.latency import Histogram, Latency
from scheduler.contract.results import StartedEvent, TokenEvent
from tests.metrics_text import series


def test_a_value_on_a_bound_counts_in_its_bucket() -> None:
    histogram = Histogram((0.1, 1.0))
    histogram.observe(0.1)
    histogram.observe(0.5, 3)
    histogram.observe(7.0)
    lines = histogram.lines("x", "m")
    assert lines[:3] == ['llamaq:x_bucket{model="m",le="0.1"} 1',
                         'llamaq:x_bucket{model="m",le="1"} 4',
                         'llamaq:x_bucket{model="m",le="+Inf"} 5']
    assert lines[3:] == ['llamaq:x_sum{model="m"} 8.6', 'llamaq:x_count{model="m"} 5']


def test_a_stream_gives_one_ttft_and_a_gap_per_later_token() -> None:
    latency = Latency()
    seen: list[object] = []

    async def then(event: object) -> None:
        seen.append(event)

    async def run() -> None:
        watch = latency.watch("m", then)  # type: ignore[arg-type]
        await watch(StartedEvent())
        await watch(TokenEvent(content="", tokens=[], progress=None))  # no token: not timed
        await watch(TokenEvent(content="a", tokens=[1]))
        await watch(TokenEvent(content="bc", tokens=[2, 3]))

    asyncio.run(run())
    assert len(seen) == 4
    found = series("\n".join([*latency.lines(["other"]), ""]))
    assert found['llamaq:time_to_first_token_seconds_count{model="m"}'][1] == 1
    assert found['llamaq:inter_token_latency_seconds_count{model="m"}'][1] == 2
    assert found['llamaq:time_to_first_token_seconds_count{model="other"}'][1] == 0
