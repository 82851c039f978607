"""Every flag of llama-server's README, and what llamaq does with it: works, refused, or no-op.

One table, three lists. A flag that *works* is declared by the settings class of a role (api,
worker, or both) and does what the spec says. A *refused* flag stops every llamaq process
(`llamaq up`, `api`, `worker`, `scheduler`) with exit status 2 and a message that names it and
says why, before anything is loaded -- given on the command line or through its environment
variable. A *no-op* is accepted and does nothing, each for a reason that cannot matter in a
fleet. `llamaq flags` prints the three lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from scheduler.config.spec_envs import SPEC_ENVS


class FlagStatus(StrEnum):
    WORKS = "works"
    REFUSED = "refused"
    NOOP = "no-op"


@dataclass(frozen=True)
class SpecFlag:
    """One row of the spec's flag tables: its names (and environment variable)."""

    names: tuple[str, ...]
    status: FlagStatus
    why: str = ""
    env: str | None = None
    off_names: tuple[str, ...] = ()
    """Of a refused row: the names that only turn its feature off (a no-op)."""
    off_values: tuple[str, ...] = ()
    """Of a refused row: the values that only turn its feature off (a no-op)."""
    switch: bool = False
    """Takes no value: its environment variable turns it on only with a truthy value, as
    llama.cpp reads it (`is_truthy`); a falsey one is off."""

    @property
    def label(self) -> str:
        return ", ".join(self.names)

    @property
    def off_label(self) -> str:
        """The off forms of a refused row, as `llamaq flags` and docs/flags.md list them."""
        long_name = next((n for n in self.names if n.startswith("--")), self.names[0])
        forms = [*self.off_names, *(f"{long_name} {v}" for v in self.off_values)]
        if self.env and (self.switch or self.off_names):
            forms.append(f"{self.env}={'|'.join(FALSEY)}")
        elif self.env:
            forms += [f"{self.env}={v}" for v in self.off_values]
        if self.env and self.off_names:
            forms.append(f"{no_env(self.env)} (any value)")
        return ", ".join(forms)

    def is_off(self, name: str, value: str | None) -> bool:
        """Whether this refused flag, given as `name` (with `value`), only turns its feature
        off: then it is accepted and does nothing."""
        return name in self.off_names or (value is not None
                                          and value.strip().lower() in self.off_values)

    def env_is_off(self, environ: Mapping[str, str]) -> bool:
        """Whether this refused flag's environment (which is set) only turns its feature off:
        `LLAMA_ARG_NO_<X>` whatever its value (as llama.cpp reads it), a falsey value of a
        switch, or an off value."""
        assert self.env is not None
        if self.off_names and self.env.startswith("LLAMA_ARG_") and no_env(self.env) in environ:
            return True
        value = environ.get(self.env, "").strip().lower()
        return value in FALSEY if (self.switch or self.off_names) else value in self.off_values


FALSEY = ("off", "disabled", "false", "0")
"""What llama.cpp reads as false in an environment variable (`common_arg_utils::is_falsey`)."""
TRUTHY = ("on", "enabled", "true", "1")
"""What llama.cpp reads as true (`common_arg_utils::is_truthy`)."""


def no_env(env: str) -> str:
    """A switch's negative environment variable (`LLAMA_ARG_X` → `LLAMA_ARG_NO_X`)."""
    return env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1)


def _off(rows: list[SpecFlag], names: tuple[str, ...] = (), values: tuple[str, ...] = (),
         switch: bool = False) -> list[SpecFlag]:
    """Refused rows whose off forms are no-ops: `names` (the negative forms), `values` (of a
    flag that takes one), `switch` (the row takes no value)."""
    return [replace(row, off_names=tuple(n for n in names if n in row.names),
                    off_values=values, switch=switch) for row in rows]


def _rows(status: FlagStatus, why: str, *rows: str) -> list[SpecFlag]:
    """Rows written as `-mu --model-url LLAMA_ARG_MODEL_URL`: names, then the env variable."""
    flags = []
    for row in rows:
        words = row.split()
        names = tuple(w for w in words if w.startswith("-"))
        env = next((w for w in words if not w.startswith("-")), None)
        flags.append(SpecFlag(names, status, why, env))
    return flags


W, R, N = FlagStatus.WORKS, FlagStatus.REFUSED, FlagStatus.NOOP

NOT_BUILT_DRAFT_SAMPLING = ("probabilistic drafting (rejection sampling) is not built: the draft "
                            "is greedy (--spec-draft-sampling greedy is accepted)")
NOT_BUILT_DRAFT_BACKEND = ("draft sampling on the backend is not built: llamaq takes the draft's "
                           "top token from its logits on the host "
                           "(--no-spec-draft-backend-sampling is accepted)")
CPU_PLACEMENT = ("the draft context gets no thread pool of its own, in llama-server either: "
                 "common_speculative_init_result builds it with llama_init_from_model and "
                 "attaches none (of the draft's CPU flags only -td/-tbd reach it), so the "
                 "draft computes with ggml's per-graph threads; pin the worker "
                 "process with taskset or the container's cpuset instead")
POLL = ("the shipped ggml-cpu computes with OpenMP threads (as llama-server's default build "
        "does), which wait at its barriers by OMP_WAIT_POLICY: the thread pool's polling level "
        "is read only by ggml's own, non-OpenMP threads")
REMOVED_ARG = "the argument has been removed. "
"""llama-server's words for a removed speculative flag (common/arg.cpp arg_removed)."""

_SPEC_ROWS: tuple[SpecFlag, ...] = (
    # --- common params ---
    *_rows(W, "", "-h --help --usage", "--version"),
    *_rows(W, "", "-cl --cache-list", "--completion-bash"),
    *_rows(W, "", "-t --threads LLAMA_ARG_THREADS", "-tb --threads-batch"),
    *_rows(W, "", "-C --cpu-mask", "-Cr --cpu-range", "--cpu-strict"),
    *_rows(N, POLL, "--poll"),
    *_rows(W, "", "-Cb --cpu-mask-batch", "-Crb --cpu-range-batch", "--cpu-strict-batch",
           "--prio-batch"),
    *_rows(N, POLL, "--poll-batch"),
    *_rows(W, "", "--prio"),
    *_rows(W, "", "-c --ctx-size LLAMA_ARG_CTX_SIZE", "-n --predict --n-predict",
           "-b --batch-size", "-ub --ubatch-size", "--keep", "--swa-full", "-fa --flash-attn",
           "--perf --no-perf", "-e --escape --no-escape", "--rope-scaling", "--rope-scale",
           "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx", "--yarn-ext-factor",
           "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast",
           "-kvo --kv-offload -nkvo --no-kv-offload", "--repack -nr --no-repack", "--no-host",
           "-ctk --cache-type-k", "-ctv --cache-type-v"),
    *_rows(N, "deprecated in llama.cpp, which ignores it as well (the KV cache needs no "
           "defragmentation)", "-dt --defrag-thold"),
    *_rows(R, "RPC offloading is not built", "--rpc LLAMA_ARG_RPC"),
    *_rows(W, "", "-lm --load-mode", "-lzm --lazy-mode"),
    *_rows(W, "", "--numa LLAMA_ARG_NUMA"),
    *_rows(W, "", "-dev --device LLAMA_ARG_DEVICE", "--list-devices",
           "-ot --override-tensor LLAMA_ARG_OVERRIDE_TENSOR", "-cmoe --cpu-moe LLAMA_ARG_CPU_MOE",
           "-ncmoe --n-cpu-moe LLAMA_ARG_N_CPU_MOE", "-ncffn --n-cpu-ffn LLAMA_ARG_N_CPU_FFN"),
    *_off(_rows(R, "the GPU cache of CPU-kept MoE experts is not in the vendored llama.cpp",
                "--moe-cache-mib LLAMA_ARG_MOE_CACHE_MIB"), values=("0",)),
    *_rows(W, "", "-ngl --gpu-layers --n-gpu-layers", "-sm --split-mode", "-ts --tensor-split",
           "-mg --main-gpu"),
    *_rows(W, "", "-fit --fit LLAMA_ARG_FIT", "-fitt --fit-target LLAMA_ARG_FIT_TARGET",
           "-fitc --fit-ctx LLAMA_ARG_FIT_CTX"),
    *_rows(W, "", "--check-tensors"),
    *_rows(W, "", "--override-kv"),
    *_rows(W, "", "--op-offload --no-op-offload"),
    *_rows(W, "", "--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled",
           "--control-vector-layer-range"),
    *_rows(W, "", "-m --model"),
    *_rows(W, "", "-mu --model-url LLAMA_ARG_MODEL_URL"),
    *_rows(W, "", "-dr --docker-repo LLAMA_ARG_DOCKER_REPO"),
    *_rows(W, "", "-hf -hfr --hf-repo", "-hff --hf-file", "-hft --hf-token"),
    *_rows(W, "", "--log-disable", "--log-file"),
    *_rows(W, "", "--log-jsonl --no-log-jsonl LLAMA_ARG_LOG_JSONL",
           "--log-colors LLAMA_ARG_LOG_COLORS"),
    *_rows(W, "", "-v --verbose --log-verbose", "--offline", "-lv --verbosity --log-verbosity",
           "--log-prefix --no-log-prefix", "--log-timestamps --no-log-timestamps"),
    *_rows(W, "", "--spec-draft-type-k -ctkd --cache-type-k-draft "
           "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", "--spec-draft-type-v -ctvd --cache-type-v-draft "
           "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V"),
    # --- sampling params ---
    *_rows(W, "", "--samplers", "-s --seed", "--sampler-seq --sampling-seq", "--ignore-eos",
           "--temp --temperature", "--top-k", "--top-p", "--min-p", "--top-nsigma --top-n-sigma",
           "--xtc-probability", "--xtc-threshold", "--typical --typical-p", "--repeat-last-n",
           "--repeat-penalty", "--presence-penalty", "--frequency-penalty", "--dry-multiplier",
           "--dry-base", "--dry-allowed-length", "--dry-penalty-last-n",
           "--dry-sequence-breaker"),
    *_rows(W, "", "--adaptive-target", "--adaptive-decay"),
    *_rows(W, "", "--dynatemp-range", "--dynatemp-exp", "--mirostat", "--mirostat-lr",
           "--mirostat-ent", "-l --logit-bias", "--grammar", "--grammar-file",
           "-j --json-schema", "-jf --json-schema-file"),
    *_off(_rows(R, "backend sampling is not built",
                "-bs --backend-sampling LLAMA_ARG_BACKEND_SAMPLING"), switch=True),
    # --- server-specific params ---
    *_rows(W, "", "-lcs --lookup-cache-static", "-lcd --lookup-cache-dynamic"),
    *_rows(W, "", "--kv-unified-per-slot LLAMA_ARG_KV_UNIFIED_PER_SLOT"),
    *_rows(W, "", "-ctxcp --ctx-checkpoints --swa-checkpoints LLAMA_ARG_CTX_CHECKPOINTS",
           "-cms --checkpoint-min-step LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT",
           "-cram --cache-ram LLAMA_ARG_CACHE_RAM",
           "--cache-idle-slots --no-cache-idle-slots LLAMA_ARG_CACHE_IDLE_SLOTS"),
    *_rows(W, "", "-kvu --kv-unified -no-kvu --no-kv-unified",
           "--context-shift --no-context-shift", "-r --reverse-prompt", "-sp --special",
           "--warmup --no-warmup", "--spm-infill"),
    *_rows(W, "", "--pooling LLAMA_ARG_POOLING",
           "--embedding --embeddings LLAMA_ARG_EMBEDDINGS", "--rerank --reranking "
           "LLAMA_ARG_RERANKING", "--embd-normalize"),
    *_rows(W, "", "-np --parallel", "-cb --cont-batching -nocb --no-cont-batching"),
    *_rows(W, "", "-mm --mmproj LLAMA_ARG_MMPROJ", "--mmproj-offload --no-mmproj-offload "
           "LLAMA_ARG_MMPROJ_OFFLOAD", "--image-min-tokens LLAMA_ARG_IMAGE_MIN_TOKENS",
           "--image-max-tokens LLAMA_ARG_IMAGE_MAX_TOKENS",
           "--mtmd-batch-max-tokens LLAMA_ARG_MTMD_BATCH_MAX_TOKENS",
           "--media-path"),
    *_rows(W, "", "--mmproj-auto --no-mmproj --no-mmproj-auto LLAMA_ARG_MMPROJ_AUTO"),
    *_rows(W, "", "-mmu --mmproj-url LLAMA_ARG_MMPROJ_URL",
           "-mmdev --mmproj-device MTMD_BACKEND_DEVICE"),
    *_rows(W, "", "--video-fps LLAMA_ARG_VIDEO_FPS", "--video-timestamp-interval "
           "LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL", "--video-ffmpeg-dir LLAMA_ARG_VIDEO_FFMPEG_DIR"),
    *_rows(W, "", "-a --alias", "--tags", "--host", "--port", "--reuse-port LLAMA_ARG_REUSE_PORT"),
    *_rows(W, "", "--path", "--cors-origins", "--cors-methods", "--cors-headers",
           "--cors-credentials --no-cors-credentials", "--api-prefix",
           "--ui-config --webui-config", "--ui-config-file --webui-config-file"),
    *_rows(W, "", "--ui-mcp-proxy --webui-mcp-proxy --no-ui-mcp-proxy "
           "--no-webui-mcp-proxy LLAMA_ARG_UI_MCP_PROXY", "--tools LLAMA_ARG_TOOLS",
           "--tools-runtime LLAMA_ARG_TOOLS_RUNTIME",
           "--mcp-servers-config LLAMA_ARG_MCP_SERVERS_CONFIG",
           "--mcp-servers-json LLAMA_ARG_MCP_SERVERS_JSON",
           "-ag --agent -no-ag --no-agent LLAMA_ARG_AGENT"),
    *_rows(W, "", "--ui --webui --no-ui --no-webui", "--api-key", "--api-key-file",
           "--ssl-key-file", "--ssl-cert-file", "--chat-template-kwargs", "-to --timeout",
           "--sse-ping-interval"),
    *_rows(N, "HTTP is served by Sanic's event loop, not by a thread pool; scale with "
           "--workers N or more api pods", "--threads-http"),
    *_rows(W, "", "--cache-prompt --no-cache-prompt", "--cache-reuse", "--metrics", "--props",
           "--slots --no-slots", "--slot-save-path"),
    *_rows(W, "", "--models-dir LLAMA_ARG_MODELS_DIR",
           "--models-preset LLAMA_ARG_MODELS_PRESET", "--models-max LLAMA_ARG_MODELS_MAX",
           "--models-autoload --no-models-autoload LLAMA_ARG_MODELS_AUTOLOAD"),
    *_rows(W, "", "--jinja --no-jinja", "--reasoning-format", "-rea --reasoning",
           "--reasoning-effort", "--reasoning-budget", "--reasoning-budget-message",
           "--reasoning-preserve --no-reasoning-preserve", "--chat-template",
           "--chat-template-file", "--skip-chat-parsing --no-skip-chat-parsing",
           "--prefill-assistant --no-prefill-assistant"),
    *_rows(W, "", "-sps --slot-prompt-similarity"),
    *_rows(W, "", "--lora-init-without-apply"),
    *_rows(W, "", "--sleep-idle-seconds"),
    *_rows(W, "", "--log-prompts-dir"),
    *_rows(W, "", "--spec-draft-hf -hfd -hfrd --hf-repo-draft LLAMA_ARG_SPEC_DRAFT_HF_REPO"),
    *_rows(W, "", "--spec-draft-threads -td --threads-draft",
           "--spec-draft-threads-batch -tbd --threads-batch-draft"),
    *_rows(R, CPU_PLACEMENT, "--spec-draft-cpu-mask -Cd --cpu-mask-draft",
           "--spec-draft-cpu-range -Crd --cpu-range-draft",
           "--spec-draft-cpu-strict --cpu-strict-draft", "--spec-draft-prio --prio-draft",
           "--spec-draft-poll --poll-draft", "--spec-draft-cpu-mask-batch -Cbd "
           "--cpu-mask-batch-draft", "--spec-draft-cpu-strict-batch --cpu-strict-batch-draft",
           "--spec-draft-prio-batch --prio-batch-draft",
           "--spec-draft-poll-batch --poll-batch-draft"),
    *_rows(W, "",
           "--spec-draft-override-tensor -otd --override-tensor-draft",
           "--spec-draft-cpu-moe -cmoed --cpu-moe-draft LLAMA_ARG_SPEC_DRAFT_CPU_MOE",
           "--spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft "
           "LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE"),
    *_rows(W, "", "--spec-draft-n-max LLAMA_ARG_SPEC_DRAFT_N_MAX",
           "--spec-draft-n-min LLAMA_ARG_SPEC_DRAFT_N_MIN",
           "--spec-draft-p-min --draft-p-min LLAMA_ARG_SPEC_DRAFT_P_MIN",
           "--spec-draft-device -devd --device-draft",
           "--spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft "
           "LLAMA_ARG_N_GPU_LAYERS_DRAFT",
           "--spec-draft-model -md --model-draft LLAMA_ARG_SPEC_DRAFT_MODEL"),
    *_rows(N, "read by nothing in llama-server's draft-simple either",
           "--spec-draft-p-split --draft-p-split LLAMA_ARG_SPEC_DRAFT_P_SPLIT"),
    *_rows(W, "", "--spec-draft-n-ubatch LLAMA_ARG_SPEC_DRAFT_N_UBATCH"),
    *_off(_rows(R, NOT_BUILT_DRAFT_SAMPLING,
                "--spec-draft-sampling LLAMA_ARG_SPEC_DRAFT_SAMPLING"), values=("greedy",)),
    *_rows(W, "", "--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max",
           "--spec-ngram-mod-n-match", "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m",
           "--spec-ngram-simple-min-hits", "--spec-default", "--spec-type LLAMA_ARG_SPEC_TYPE",
           "--spec-ngram-map-k-size-n", "--spec-ngram-map-k-size-m",
           "--spec-ngram-map-k-min-hits", "--spec-ngram-map-k4v-size-n",
           "--spec-ngram-map-k4v-size-m", "--spec-ngram-map-k4v-min-hits",
           "--spec-synth-len LLAMA_ARG_SPEC_SYNTH_LEN",
           "--spec-synth-rates LLAMA_ARG_SPEC_SYNTH_RATES"),
    *_off(_rows(R, NOT_BUILT_DRAFT_BACKEND, "--spec-draft-backend-sampling "
                "--no-spec-draft-backend-sampling LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING"),
          names=("--no-spec-draft-backend-sampling",)),
    SpecFlag(("--draft", "--draft-n", "--draft-max"), R,
             REMOVED_ARG + "use --spec-draft-n-max or --spec-ngram-mod-n-max",
             "LLAMA_ARG_DRAFT_MAX"),
    SpecFlag(("--draft-min", "--draft-n-min"), R,
             REMOVED_ARG + "use --spec-draft-n-min or --spec-ngram-mod-n-min",
             "LLAMA_ARG_DRAFT_MIN"),
    SpecFlag(("--spec-ngram-size-n",), R, REMOVED_ARG + "use the respective --spec-ngram-*-size-n"),
    SpecFlag(("--spec-ngram-size-m",), R, REMOVED_ARG + "use the respective --spec-ngram-*-size-m"),
    SpecFlag(("--spec-ngram-min-hits",), R,
             REMOVED_ARG + "use the respective --spec-ngram-*-min-hits"),
    *_rows(W, "", "--embd-gemma-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default",
           "--fim-qwen-7b-default"),
    *_rows(W, "", "--fim-qwen-7b-spec", "--fim-qwen-14b-spec"),
    *_rows(W, "", "--fim-qwen-30b-default", "--gpt-oss-20b-default", "--gpt-oss-120b-default",
           "--vision-gemma-4b-default", "--vision-gemma-12b-default"),
)
"""The spec's flag tables (common, sampling and server-specific params), row by row."""

SPEC_FLAGS: tuple[SpecFlag, ...] = tuple(
    row if row.env else replace(row, env=SPEC_ENVS.get(row.names[0])) for row in _SPEC_ROWS)
"""The rows, each with the spec's environment variable (written in the row, else SPEC_ENVS)."""

BUILT_IN_PARSER = frozenset({"-h", "--help", "--usage", "--version"})
"""Flags every parser answers itself (help and version), not settings fields."""


def by_status(status: FlagStatus) -> list[SpecFlag]:
    return [f for f in SPEC_FLAGS if f.status is status]


def refused_names() -> dict[str, SpecFlag]:
    """Each name of a refused flag, and its row."""
    return {name: f for f in by_status(FlagStatus.REFUSED) for name in f.names}


def refused_envs() -> dict[str, SpecFlag]:
    """Each environment variable of a refused flag, and its row."""
    return {f.env: f for f in by_status(FlagStatus.REFUSED) if f.env}


def refusal(flag: SpecFlag, given_as: str) -> str:
    return f"{given_as} is not supported by llamaq: {flag.why}"
