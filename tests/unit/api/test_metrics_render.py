"""/metrics text as llama-server writes it (series names exact, spec-decode counters at 0), valid
Prometheus text (read with prometheus_client's parser)."""

from __future__ import annotations

from api.endpoints.monitor.metrics import render_metrics
from scheduler.metrics_window import Throughput
from scheduler.registry import WorkerMetrics
from tests.metrics_text import series


def test_spec_decode_counters_are_zero_when_it_is_off() -> None:
    found = series(render_metrics([WorkerMetrics(n_decode_total=3)]).decode())
    for name in ("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
                 "spec_decode_num_drafts_total"):
        assert found[f"llamacpp:{name}"] == ("counter", 0.0)
    assert not any("per_pos" in name for name in found)


def test_n_tokens_max_keeps_its_name_as_a_counter() -> None:
    workers = [WorkerMetrics(n_tokens_max=40), WorkerMetrics(n_tokens_max=90)]
    found = series(render_metrics(workers).decode())
    assert found["llamacpp:n_tokens_max"] == ("counter", 90.0)
    assert "llamacpp:n_tokens_max_total" not in found


def test_sums_over_workers_and_averages() -> None:
    workers = [WorkerMetrics(tokens_predicted_total=5, tokens_predicted_seconds_total=0.5,
                             n_decode_total=4, n_busy_slots_total=8),
               WorkerMetrics(tokens_predicted_total=15, tokens_predicted_seconds_total=1.5,
                             n_decode_total=6, n_busy_slots_total=12)]
    window = Throughput(predicted_tokens=30, predicted_s=1.5)  # since the last scrape
    found = series(render_metrics(workers, window=window).decode())
    assert found["llamacpp:tokens_predicted_total"] == ("counter", 20.0)
    assert found["llamacpp:predicted_tokens_seconds"] == ("gauge", 20.0)
    assert found["llamacpp:prompt_tokens_seconds"] == ("gauge", 0.0)  # nothing in the window
    assert found["llamacpp:prompt_tokens_cached_total"] == ("counter", 0.0)
    assert found["llamacpp:n_busy_slots_per_decode"] == ("gauge", 2.0)
    assert found["llamacpp:requests_processing"] == ("gauge", 0.0)


def test_llamaqs_own_queue_series() -> None:
    from api.queue_stats import QueueStats

    text = render_metrics([WorkerMetrics(requests_deferred=1)],
                          QueueStats(depth=3, oldest_s=1.5, retried=2, failed={"poison": 1}))
    found = series(text.decode())
    assert found["llamacpp:requests_deferred"] == ("gauge", 4.0)
    assert found["llamaq:jobs_retried_total"] == ("counter", 2.0)
    assert found['llamaq:jobs_failed_total{cause="poison"}'] == ("counter", 1.0)
    assert found['llamaq:jobs_failed_total{cause="worker_died"}'] == ("counter", 0.0)


def test_migrations_and_their_stall_histogram() -> None:
    from api.queue_stats import QueueStats

    text = render_metrics([], QueueStats(migrated=3, stall_buckets={"3": 1, "5": 2, "10": 3},
                                         stall_count=3, stall_sum_s=14.5))
    found = series(text.decode())
    assert found["llamaq:jobs_migrated_total"] == ("counter", 3.0)
    name = "llamaq:migration_stall_seconds"
    assert found[f'{name}_bucket{{le="2"}}'] == ("histogram", 0.0)
    assert found[f'{name}_bucket{{le="3"}}'] == ("histogram", 1.0)
    assert found[f'{name}_bucket{{le="10"}}'] == ("histogram", 3.0)
    assert found[f'{name}_bucket{{le="+Inf"}}'] == ("histogram", 3.0)
    assert found[f"{name}_count"] == ("histogram", 3.0)
    assert found[f"{name}_sum"] == ("histogram", 14.5)


def test_per_model_series_are_labelled_and_valid() -> None:
    """model_series.py: one sample per model (and state, cause), every state
    written (0 included), read back by prometheus_client's parser."""
    from api.endpoints.monitor.model_series import ModelSeries, model_lines
    from api.queue_stats import QueueStats

    items = [ModelSeries("gemma", QueueStats(depth=5, oldest_s=2.5, failed={"poison": 1}),
                         {"idle": 0, "busy": 0, "sleeping": 0}, cold_waiting=5),
             ModelSeries('org/m:Q4', QueueStats(), {"idle": 1, "busy": 2, "sleeping": 0},
                         requests_running=3, tokens={"tokens_predicted_total": 7.0})]
    found = series("\n".join(model_lines(items)) + "\n")
    assert found['llamaq:queue_depth{model="gemma"}'] == ("gauge", 5.0)
    assert found['llamaq:queue_oldest_seconds{model="gemma"}'] == ("gauge", 2.5)
    assert found['llamaq:cold_start_waiting{model="gemma"}'] == ("gauge", 5.0)
    assert found['llamaq:workers{model="gemma",state="idle"}'] == ("gauge", 0.0)
    assert found['llamaq:workers{model="org/m:Q4",state="busy"}'] == ("gauge", 2.0)
    assert found['llamaq:requests_running{model="org/m:Q4"}'] == ("gauge", 3.0)
    assert found['llamaq:tokens_predicted_total{model="org/m:Q4"}'] == ("counter", 7.0)
    assert found['llamaq:jobs_failed_total{model="gemma",cause="poison"}'] == ("counter", 1.0)
    short = series("\n".join(model_lines(items, full=False)) + "\n")
    assert not any(name.startswith("llamaq:tokens_") for name in short)
