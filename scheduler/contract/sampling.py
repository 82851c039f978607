"""Sampling as both roles see it: `SamplingSettings`, the one declaration of what a sampler
chain is built from (llama.cpp's defaults, and the worker's sampling flags), `SamplingParams`, a
request's overrides of it, the one-letter sampler names, and a token's logit bias.

Jobs carry these (scheduler/contract/jobs.py, which re-exports every name here); results report
the settings a job ran with (scheduler/contract/results.py GenerationSettings).
"""

from __future__ import annotations

from pydantic import ConfigDict

from scheduler.contract.deferred import DeferredModel
from scheduler.contract.flag_fields import flag

SAMPLER_LETTERS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p",
                   "p": "top_p", "m": "min_p", "x": "xtc", "t": "temperature", "a": "adaptive_p"}
"""The one-letter sampler names of --sampling-seq (and of a `samplers` string)."""


def samplers_from_letters(letters: str) -> list[str]:
    return [SAMPLER_LETTERS[c] for c in letters if c in SAMPLER_LETTERS]


class LogitBias(DeferredModel):
    """A bias for a token id, or for every token of a string; `bias` None bans the token."""

    token: int | str
    bias: float | None


DEFAULT_SEED = 0xFFFFFFFF
"""LLAMA_DEFAULT_SEED: a random seed."""
DEFAULT_SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                    "temperature"]
DEFAULT_DRY_BREAKERS = ["\n", ":", '"', "*"]


class SamplingSettings(DeferredModel):
    """The sampling parameters, with llama.cpp's defaults (common_params_sampling): the one
    declaration of what a sampler chain is built from. Its fields are the worker's sampling
    flags too (worker/runtime/settings.py `sampling`, a flag_group: names, environment variables and
    defaults are declared here once); a job's SamplingParams override them
    (`worker/engine/sampling.py` resolve_sampling: `defaults.model_copy(update=…)`); the result is
    reported as is, inside `generation_settings` (scheduler/contract/results.py
    GenerationSettings extends this model)."""

    seed: int = flag(DEFAULT_SEED, "-s", "--seed",
                     help="RNG seed (-1 or 4294967295 = random seed)")
    temperature: float = flag(0.8, "--temp", "--temperature", env="LLAMA_ARG_TEMPERATURE",
                              help="temperature")
    dynatemp_range: float = flag(0.0, "--dynatemp-range",
                                 help="dynamic temperature range (0.0 = disabled)")
    dynatemp_exponent: float = flag(1.0, "--dynatemp-exp", help="dynamic temperature exponent")
    top_k: int = flag(40, "--top-k", env="LLAMA_ARG_TOP_K", help="top-k sampling (0 = disabled)")
    top_p: float = flag(0.95, "--top-p", env="LLAMA_ARG_TOP_P",
                        help="top-p sampling (1.0 = disabled)")
    min_p: float = flag(0.05, "--min-p", env="LLAMA_ARG_MIN_P",
                        help="min-p sampling (0.0 = disabled)")
    top_n_sigma: float = flag(-1.0, "--top-nsigma", "--top-n-sigma",
                              help="top-n-sigma sampling (-1.0 = disabled)")
    xtc_probability: float = flag(0.0, "--xtc-probability",
                                  help="xtc probability (0.0 = disabled)")
    xtc_threshold: float = flag(0.1, "--xtc-threshold", help="xtc threshold (1.0 = disabled)")
    typical_p: float = flag(1.0, "--typical", "--typical-p",
                            help="locally typical sampling, parameter p (1.0 = disabled)")
    repeat_last_n: int = flag(64, "--repeat-last-n",
                              help="last n tokens to consider for penalize (0 = disabled)")
    repeat_penalty: float = flag(1.0, "--repeat-penalty", env="LLAMA_ARG_REPEAT_PENALTY",
                                 help="penalize repeat sequence of tokens (1.0 = disabled)")
    presence_penalty: float = flag(0.0, "--presence-penalty", env="LLAMA_ARG_PRESENCE_PENALTY",
                                   help="repeat alpha presence penalty (0.0 = disabled)")
    frequency_penalty: float = flag(0.0, "--frequency-penalty",
                                    env="LLAMA_ARG_FREQUENCY_PENALTY",
                                    help="repeat alpha frequency penalty (0.0 = disabled)")
    dry_multiplier: float = flag(0.0, "--dry-multiplier",
                                 help="DRY sampling multiplier (0.0 = disabled)")
    dry_base: float = flag(1.75, "--dry-base", help="DRY sampling base value")
    dry_allowed_length: int = flag(2, "--dry-allowed-length",
                                   help="allowed length for DRY sampling")
    dry_penalty_last_n: int = flag(64, "--dry-penalty-last-n",
                                   help="DRY penalty for the last n tokens (0 = disable, "
                                   "-1 = context size)")
    dry_sequence_breakers: list[str] = flag(
        list(DEFAULT_DRY_BREAKERS), "--dry-sequence-breaker", sep=None,
        help="add sequence breaker for DRY sampling, one per flag, clearing the default "
        "breakers ('\\n', ':', '\"', '*'); 'none' for no breakers")
    mirostat: int = flag(0, "--mirostat", choices=(0, 1, 2),
                         help="use Mirostat sampling (0 = disabled, 1 = Mirostat, "
                         "2 = Mirostat 2.0)")
    mirostat_tau: float = flag(5.0, "--mirostat-ent",
                               help="Mirostat target entropy, parameter tau")
    mirostat_eta: float = flag(0.1, "--mirostat-lr", help="Mirostat learning rate, parameter eta")
    adaptive_target: float = flag(-1.0, "--adaptive-target",
                                  help="adaptive-p: select tokens near this probability (valid "
                                  "range 0.0 to 1.0; negative = disabled; the sampler runs when "
                                  "--samplers names adaptive_p)")
    adaptive_decay: float = flag(0.9, "--adaptive-decay",
                                 help="adaptive-p: decay rate for target adaptation over time "
                                 "(valid range 0.0 to 0.99)")
    ignore_eos: bool = flag(False, "--ignore-eos",
                            help="ignore end of stream token and continue generating")
    min_keep: int = 0
    """No flag (llama-server has none either); a request may set it."""
    samplers: list[str] = flag(list(DEFAULT_SAMPLERS), "--samplers", sep=";",
                               help="samplers used for generation in order, separated by ';'")


class SamplingParams(DeferredModel):
    """A request's overrides of SamplingSettings: the same fields, each `None` (the worker's
    default) unless given. tests/unit/scheduler/test_sampling_settings.py keeps the two field lists
    equal; the wire models inherit these fields rather than declaring them again."""

    model_config = ConfigDict(extra="forbid")

    seed: int | None = None
    temperature: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    top_n_sigma: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    typical_p: float | None = None
    repeat_last_n: int | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    adaptive_target: float | None = None
    adaptive_decay: float | None = None
    ignore_eos: bool | None = None
    min_keep: int | None = None
    samplers: list[str] | None = None
