"""The settings every llamaq process reads (the model, where files live, Redis, logging):
CommonSettings; RoleSettings, what the api and the worker both read (a limit the api checks
and the worker applies: one flag, so they cannot disagree); the Redis URL in force.

Declared with the framework of scheduler/config/settings.py; above storage (a model's name
comes from storage/models.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from pydantic import field_validator

from scheduler.config.settings import ProcessSettings, flag
from scheduler.config.spec_flags import FALSEY, TRUTHY
from scheduler.contract.limits import DEFAULT_N_PROBS_MAX
from storage.models import DEFAULT_MODEL_FILE, url_model_name

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class CommonSettings(ProcessSettings):
    """Settings every llamaq process reads: the model, where files live, Redis, logging."""

    model: str | None = flag(None, "-m", "--model", env="LLAMA_ARG_MODEL",
                             help="model path to load")
    alias: list[str] = flag([], "-a", "--alias", env="LLAMA_ARG_ALIAS",
                            help="set model name aliases, comma-separated (to be used by API)")
    model_url: str | None = flag(None, "-mu", "--model-url", env="LLAMA_ARG_MODEL_URL",
                                 help="model download url (http/https; fetched once into the "
                                 "object store)")
    docker_repo: str | None = flag(None, "-dr", "--docker-repo", env="LLAMA_ARG_DOCKER_REPO",
                                   help="Docker Hub model repository [<repo>/]<model>[:quant] "
                                   "(default repo ai/, default quant latest; fetched once into "
                                   "the object store)")
    hf_repo: str | None = flag(None, "-hf", "-hfr", "--hf-repo", env="LLAMA_ARG_HF_REPO",
                               help="Hugging Face model repository <user>/<model>[:quant]")
    hf_file: str | None = flag(None, "-hff", "--hf-file", env="LLAMA_ARG_HF_FILE",
                               help="Hugging Face model file, overrides the quant in --hf-repo")
    hf_token: str | None = flag(None, "-hft", "--hf-token", env="HF_TOKEN",
                                help="Hugging Face access token")
    default_model: bool = flag(False, "--default-model", env="LLAMAQ_DEFAULT_MODEL",
                               negative=("--no-default-model",),
                               help="without -m or -hf, serve the default model (Gemma 3 270M) "
                               "instead of router mode (`scripts/up` sets it)")
    offline: bool = flag(False, "--offline", env="LLAMA_ARG_OFFLINE",
                         help="offline mode: forces use of cache, prevents network access")
    log_verbosity: int = flag(3, "-lv", "--verbosity", "--log-verbosity",
                              env="LLAMA_ARG_LOG_VERBOSITY",
                              help="verbosity threshold: 0 generic, 1 error, 2 warning, 3 info, "
                              "4 trace, 5 debug")
    log_file: str | None = flag(None, "--log-file", env="LLAMA_ARG_LOG_FILE",
                                help="log to file")
    verbose: bool = flag(False, "-v", "--verbose", "--log-verbose",
                         help="set verbosity level to infinity (log all messages); OpenAI "
                         "completion and chat responses carry a `__verbose` debug object")
    log_disable: bool = flag(False, "--log-disable", help="log disable")
    log_prefix: bool = flag(True, "--log-prefix", env="LLAMA_ARG_LOG_PREFIX",
                            negative=("--no-log-prefix",),
                            help="prefix in log messages (level and logger name)")
    log_timestamps: bool = flag(True, "--log-timestamps", env="LLAMA_ARG_LOG_TIMESTAMPS",
                                negative=("--no-log-timestamps",),
                                help="timestamps in log messages")
    cache_list: bool = flag(False, "-cl", "--cache-list",
                            help="show list of models in cache (and exit)")
    completion_bash: bool = flag(False, "--completion-bash",
                                 help="print source-able bash completion script for llamaq "
                                 "(and exit)")
    embd_gemma_default: bool = flag(False, "--embd-gemma-default",
                                    help="use default EmbeddingGemma model (-hf preset)")
    fim_qwen_1_5b_default: bool = flag(False, "--fim-qwen-1.5b-default",
                                       help="use default Qwen 2.5 Coder 1.5B (-hf preset)")
    fim_qwen_3b_default: bool = flag(False, "--fim-qwen-3b-default",
                                     help="use default Qwen 2.5 Coder 3B (-hf preset)")
    fim_qwen_7b_default: bool = flag(False, "--fim-qwen-7b-default",
                                     help="use default Qwen 2.5 Coder 7B (-hf preset)")
    fim_qwen_30b_default: bool = flag(False, "--fim-qwen-30b-default",
                                      help="use default Qwen 3 Coder 30B A3B Instruct (-hf "
                                      "preset)")
    fim_qwen_7b_spec: bool = flag(False, "--fim-qwen-7b-spec",
                                  help="use Qwen 2.5 Coder 7B + 0.5B draft for speculative "
                                  "decoding (-hf and -hfd preset)")
    fim_qwen_14b_spec: bool = flag(False, "--fim-qwen-14b-spec",
                                   help="use Qwen 2.5 Coder 14B + 0.5B draft for speculative "
                                   "decoding (-hf and -hfd preset)")
    gpt_oss_20b_default: bool = flag(False, "--gpt-oss-20b-default",
                                     help="use gpt-oss-20b (-hf preset)")
    gpt_oss_120b_default: bool = flag(False, "--gpt-oss-120b-default",
                                      help="use gpt-oss-120b (-hf preset)")
    vision_gemma_4b_default: bool = flag(False, "--vision-gemma-4b-default",
                                         help="use Gemma 3 4B QAT (-hf preset)")
    vision_gemma_12b_default: bool = flag(False, "--vision-gemma-12b-default",
                                          help="use Gemma 3 12B QAT (-hf preset)")
    log_jsonl: bool = flag(False, "--log-jsonl", env="LLAMA_ARG_LOG_JSONL",
                           negative=("--no-log-jsonl",),
                           help="log as JSONL (one JSON object per line) to stdout, this also "
                           "disables colored logging")
    log_colors: str = flag("auto", "--log-colors", env="LLAMA_ARG_LOG_COLORS",
                           help="set colored logging ('on', 'off', or 'auto'); 'auto' enables "
                           "colors when output is to a terminal")
    prio: int = flag(0, "--prio", choices=(-1, 0, 1, 2, 3),
                     help="set process priority: low(-1), normal(0), medium(1), high(2), "
                     "realtime(3)")
    redis_url: str | None = flag(None, "--redis-url", env="LLAMAQ_REDIS_URL",
                                 help="Redis URL (none = start or use a local redis-server)")
    store_url: str = flag(".llamaq/store", "--store-url", env="LLAMAQ_STORE_URL",
                          help="object store: a folder, or s3://bucket/prefix")
    s3_endpoint_url: str | None = flag(None, "--s3-endpoint-url", env="LLAMAQ_S3_ENDPOINT_URL",
                                       help="S3 endpoint URL (MinIO, moto, ...)")
    cache_dir: str = flag(".llamaq/cache", "--cache-dir", env="LLAMAQ_CACHE_DIR",
                          help="folder where model files are materialised (the spec's "
                          "LLAMA_CACHE, when set, wins over LLAMAQ_CACHE_DIR)")
    drain_timeout: float = flag(30.0, "--drain-timeout", env="LLAMAQ_DRAIN_TIMEOUT",
                                help="on SIGTERM, how long running requests may finish (seconds):"
                                " a worker then ends the rest with an error event, an api pod "
                                "closes its open streams")

    @field_validator("log_colors")
    @classmethod
    def _log_colors(cls, value: str) -> str:
        """llama.cpp's is_truthy / is_falsey / is_autoy; anything else is an error."""
        if value in TRUTHY:
            return "on"
        if value in FALSEY:
            return "off"
        if value in ("auto", "-1"):
            return "auto"
        raise ValueError(f"unknown value for --log-colors: '{value}'")

    def verbosity(self) -> int:
        """The log verbosity in force: -v means everything (llama-server's INT_MAX)."""
        return 99 if self.verbose else self.log_verbosity

    def debug_responses(self) -> bool:
        """Responses carry `__verbose` (llama-server: verbosity above 9)."""
        return self.verbosity() > 9

    def router_mode(self) -> bool:
        """No model named and no default-model opt-in: the api routes by each request's model
        and a worker waits to be told which model to load (the spec's router mode)."""
        return not (self.model or self.hf_repo or self.model_url or self.docker_repo
                    or self.default_model)

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None,
                  environ: Mapping[str, str] | None = None) -> Self:
        """As ProcessSettings.from_args; then the spec's LLAMA_CACHE, when set, names the model
        cache unless --cache-dir is on the command line (it wins over LLAMAQ_CACHE_DIR)."""
        settings = super().from_args(argv, environ)
        args = sys.argv[1:] if argv is None else argv
        env = os.environ if environ is None else environ
        given = any(a == "--cache-dir" or a.startswith("--cache-dir=") for a in args)
        if env.get("LLAMA_CACHE") and not given:
            return settings.model_copy(update={"cache_dir": env["LLAMA_CACHE"]})
        return settings

    def model_cache_dir(self) -> Path:
        """Where model files are kept on this machine."""
        return Path(self.cache_dir).expanduser()

    def model_id(self) -> str:
        """The model's name in the API and in queue names: the alphabetically first alias (as
        llama-server, which keeps them in a sorted set), else what -m or -hf named, else the
        file name of -mu, else what -dr named, else the default model's file name."""
        if self.alias:
            return min(self.alias)
        if self.model_url and not (self.model or self.hf_repo):
            return url_model_name(self.model_url)
        if self.docker_repo and not (self.model or self.hf_repo):
            return self.docker_repo
        return self.model or self.hf_repo or DEFAULT_MODEL_FILE


class RoleSettings(CommonSettings):
    """The base of ApiSettings and WorkerSettings: flags both roles read."""

    n_probs_max: int = flag(DEFAULT_N_PROBS_MAX, "--n-probs-max", env="LLAMAQ_N_PROBS_MAX",
                            help="largest n_probs (logprobs, top_logprobs) a request gets; "
                            "larger values are capped (the api caps a job, the worker caps "
                            "what it computes)")


def redis_url_of(settings: CommonSettings) -> str:
    """The Redis URL a process uses: --redis-url, else a local redis-server's."""
    return settings.redis_url or DEFAULT_REDIS_URL
