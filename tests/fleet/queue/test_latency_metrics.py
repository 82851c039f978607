"""Time to first token and inter-token latency histograms (api/latency.py): a real stream on
Gemma through a real api pod shows in its /fleet/metrics and /metrics, per model, one TTFT
and one inter-token gap per later token; a non-streamed completion is not timed."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.conftest import make_fleet
from tests.metrics_text import series

MODEL = 'model="gemma"'


def family(found: dict[str, tuple[str, float]], name: str) -> dict[str, float]:
    """The model's samples of a histogram: `le` (or "sum", "count") -> value."""
    out: dict[str, float] = {}
    for sample, (_, value) in found.items():
        if sample.startswith(f"llamaq:{name}_bucket{{{MODEL},le="):
            out[sample.split('le="')[1].rstrip('"}')] = value
        elif sample == f"llamaq:{name}_sum{{{MODEL}}}":
            out["sum"] = value
        elif sample == f"llamaq:{name}_count{{{MODEL}}}":
            out["count"] = value
    return out


def test_a_stream_is_timed_per_token(redis_url: str, workdir: Path, gemma_path: Path,
                                     api: str) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")  # shares the session's worker
    try:
        url = fleet.add_api("--metrics")
        before = series(httpx.get(f"{url}/fleet/metrics", timeout=10).text)
        for name in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
            assert family(before, name)["count"] == 0  # written at 0 before any stream
            assert before[f"llamaq:{name}_bucket{{{MODEL},le=\"+Inf\"}}"][0] == "histogram"
        httpx.post(f"{url}/completion", timeout=60,
                   json={"prompt": "Hi", "n_predict": 4}).raise_for_status()
        quiet = series(httpx.get(f"{url}/fleet/metrics", timeout=10).text)
        assert family(quiet, "time_to_first_token_seconds")["count"] == 0
        started = time.monotonic()
        with httpx.stream("POST", f"{url}/completion", timeout=60, json={
                "prompt": "Count to ten:", "n_predict": 8, "ignore_eos": True,
                "stream": True}) as response:
            assert response.status_code == 200
            text = "".join(response.iter_text())
        took = time.monotonic() - started
        assert '"stop":true' in text.replace(" ", "")
        for path in ("/fleet/metrics", "/metrics"):
            found = series(httpx.get(f"{url}{path}", timeout=10).text)
            ttft = family(found, "time_to_first_token_seconds")
            itl = family(found, "inter_token_latency_seconds")
            assert ttft["count"] == 1 and 0 < ttft["sum"] <= took, (path, ttft)
            assert itl["count"] == 7 and 0 < itl["sum"] <= took, (path, itl)
            for histogram in (ttft, itl):
                buckets = [v for k, v in histogram.items() if k not in ("sum", "count")]
                assert buckets == sorted(buckets) and histogram["+Inf"] == histogram["count"]
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                "stream": True}) as response:
            assert response.status_code == 200
            "".join(response.iter_text())
        found = series(httpx.get(f"{url}/fleet/metrics", timeout=10).text)
        assert family(found, "time_to_first_token_seconds")["count"] == 2
    finally:
        fleet.stop()
