"""The simulated engine's flags (ours: `llamaq worker --simulate`), a part of WorkerSettings
(worker/runtime/settings.py); worker/simulate/ reads them."""

from __future__ import annotations

from pydantic import field_validator

from scheduler.config.settings import flag
from scheduler.contract.deferred import DeferredModel


class SimulateSettings(DeferredModel):
    simulate: bool = flag(False, "--simulate", env="LLAMAQ_SIMULATE",
                          help="no model: a simulated engine with a timing model serves the "
                          "jobs (fleet tests and load measurements; the registry, /props, "
                          "/slots and /metrics say `simulated`)")
    sim_workers: int = flag(1, "--sim-workers", env="LLAMAQ_SIM_WORKERS",
                            help="with --simulate: this many simulated workers in one process")
    sim_prefill_tps: float = flag(4000.0, "--sim-prefill-tps", env="LLAMAQ_SIM_PREFILL_TPS",
                                  help="simulated prompt evaluation speed (uncached prompt "
                                  "tokens per second per slot): TTFT = uncached / this")
    sim_itl_ms: float = flag(20.0, "--sim-itl-ms", env="LLAMAQ_SIM_ITL_MS",
                             help="simulated inter-token latency of one slot alone (ms)")
    sim_itl_jitter: float = flag(0.0, "--sim-itl-jitter", env="LLAMAQ_SIM_ITL_JITTER",
                                 help="each inter-token latency is drawn uniformly within "
                                 "± this fraction of its mean (0..1)")
    sim_batch_slowdown: float = flag(0.0, "--sim-batch-slowdown",
                                     env="LLAMAQ_SIM_BATCH_SLOWDOWN",
                                     help="the inter-token latency grows by this fraction per "
                                     "other active slot (a batch of n: itl × (1 + s × (n-1)))")
    sim_step: str = flag("batched", "--sim-step", env="LLAMAQ_SIM_STEP",
                         choices=("batched", "slot"),
                         help="batched: one step gives every generating slot its next token "
                         "at once, one inter-token latency for all, and hands the step's "
                         "events over together, as the real engine's decode of all active "
                         "slots does; slot: each slot draws its own next-token time")
    sim_kv_tokens: int = flag(262144, "--sim-kv-tokens", env="LLAMAQ_SIM_KV_TOKENS",
                              help="simulated KV budget in tokens: the prefix cache keeps "
                              "blocks while the running requests leave room")
    sim_kv_block: int = flag(16, "--sim-kv-block", env="LLAMAQ_SIM_KV_BLOCK",
                             help="simulated prefix cache block size in tokens")
    sim_eos_tokens: int = flag(256, "--sim-eos-tokens", env="LLAMAQ_SIM_EOS_TOKENS",
                               help="the simulated model ends its text (EOS) after this many "
                               "tokens, unless ignore_eos")

    @field_validator("sim_workers", "sim_kv_block", "sim_eos_tokens")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value

    @field_validator("sim_prefill_tps", "sim_itl_ms")
    @classmethod
    def _above_zero(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be above 0")
        return value

    @field_validator("sim_itl_jitter")
    @classmethod
    def _jitter(cls, value: float) -> float:
        if not 0 <= value <= 1:
            raise ValueError("must be a fraction from 0 to 1")
        return value

    @field_validator("sim_batch_slowdown")
    @classmethod
    def _slowdown(cls, value: float) -> float:
        if not value >= 0:
            raise ValueError("must be at least 0")
        return value
