"""The server-wide defaults a worker's flags give its requests."""

from __future__ import annotations

from worker.process.startup import context_plan, engine_defaults
from worker.runtime.settings import WorkerSettings


def breakers(*argv: str) -> list[str]:
    settings = WorkerSettings.from_args(list(argv), environ={})
    return engine_defaults(settings, "m", "w").sampling.dry_sequence_breakers


def test_dry_sequence_breaker_none_clears_the_list() -> None:
    assert breakers() == ["\n", ":", "\"", "*"]
    assert breakers("--dry-sequence-breaker", "none") == []
    assert breakers("--dry-sequence-breaker", "a", "--dry-sequence-breaker", "none",
                    "--dry-sequence-breaker", "b") == ["b"]  # as llama.cpp: none clears, then b
    assert breakers("--dry-sequence-breaker", "\\n") == ["\n"]


def defaults(*argv: str) -> tuple[int, int, int, bool]:
    d = engine_defaults(WorkerSettings.from_args(list(argv), environ={}), "m", "w")
    return d.cache_ram_mib, d.ctx_checkpoints, d.checkpoint_min_step, d.cache_idle_slots


def test_the_kv_cache_flags_reach_the_engine() -> None:
    assert defaults() == (8192, 32, 8192, True)  # llama-server's defaults
    assert defaults("--cache-ram", "-1", "-ctxcp", "2", "-cms", "64",
                    "--no-cache-idle-slots") == (-1, 2, 64, False)
    assert defaults("--decisions", "--cache-ram", "512")[0] == 0  # the spec's 0 for them


def test_the_swa_cache_is_full_size_only_when_asked_or_for_decisions() -> None:
    def swa_full(*argv: str) -> bool:
        return context_plan(WorkerSettings.from_args(list(argv), environ={})).swa_full

    assert not swa_full()  # prompt caching on (the default) no longer forces it
    assert swa_full("--swa-full")
    assert swa_full("--decisions")


def test_kv_unified_per_slot_without_c_sizes_the_pool() -> None:
    """llama-server's server.cpp: --kv-unified-per-slot N without -c sizes the shared KV pool
    to n_parallel × N (auto -np counts 4); -c, or -c 0 (the model's whole context), wins."""
    def n_ctx(*argv: str, environ: dict[str, str] | None = None) -> int:
        return context_plan(WorkerSettings.from_args(list(argv), environ=environ or {})).n_ctx

    assert n_ctx("--kv-unified-per-slot", "512", "-np", "3") == 1536
    assert n_ctx("--kv-unified-per-slot", "512") == 2048
    assert n_ctx("-np", "2", environ={"LLAMA_ARG_KV_UNIFIED_PER_SLOT": "300"}) == 600
    assert n_ctx("--kv-unified-per-slot", "512", "-np", "3", "-c", "4096") == 4096
    assert n_ctx("--kv-unified-per-slot", "512", "-np", "3", "-c", "0") == 0
    assert n_ctx("--kv-unified-per-slot", "512", "-np", "3",
                 environ={"LLAMA_ARG_CTX_SIZE": "0"}) == 0
    assert n_ctx("-np", "3") == 0


def test_mtmd_batch_max_tokens_reads_its_environment_name() -> None:
    settings = WorkerSettings.from_args([], environ={"LLAMA_ARG_MTMD_BATCH_MAX_TOKENS": "256"})
    assert settings.mtmd_batch_max_tokens == 256
