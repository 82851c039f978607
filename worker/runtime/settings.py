"""Settings of a worker: llama-server's model, context, slot and sampling flags, plus ours."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import field_validator

from scheduler.common_settings import RoleSettings
from scheduler.config.settings import flag, flag_group
from scheduler.config.spec_flags import FALSEY, TRUTHY
from scheduler.contract.jobs import SamplingSettings
from worker.runtime.cpu_settings import CpuSettings
from worker.runtime.kv_overrides import parse_kv_overrides
from worker.runtime.simulate_settings import SimulateSettings
from worker.runtime.speculative_settings import CACHE_TYPES, SpeculativeSettings

ON_OFF_AUTO = ("on", "off", "auto")


class WorkerSettings(CpuSettings, SimulateSettings, SpeculativeSettings, RoleSettings):
    """llamaq worker: one engine (model, context, slots) fed by arq jobs."""

    prog: ClassVar[str] = "llamaq-worker"

    # CPU
    threads: int = flag(-1, "-t", "--threads", env="LLAMA_ARG_THREADS",
                        help="number of CPU threads to use during generation")
    threads_batch: int | None = flag(None, "-tb", "--threads-batch",
                                     help="number of threads to use during batch and prompt "
                                     "processing (none: same as --threads)")
    # context and batching
    ctx_size: int = flag(0, "-c", "--ctx-size", env="LLAMA_ARG_CTX_SIZE",
                         help="size of the prompt context (0 = loaded from model)")
    n_predict: int = flag(-1, "-n", "--predict", "--n-predict", env="LLAMA_ARG_N_PREDICT",
                          help="number of tokens to predict (-1 = infinity)")
    batch_size: int = flag(2048, "-b", "--batch-size", env="LLAMA_ARG_BATCH",
                           help="logical maximum batch size")
    ubatch_size: int = flag(512, "-ub", "--ubatch-size", env="LLAMA_ARG_UBATCH",
                            help="physical maximum batch size")
    keep: int = flag(0, "--keep", help="number of tokens to keep from the initial prompt "
                     "(-1 = all)")
    swa_full: bool = flag(False, "--swa-full", env="LLAMA_ARG_SWA_FULL",
                          help="use full-size SWA cache")
    flash_attn: str = flag("auto", "-fa", "--flash-attn", env="LLAMA_ARG_FLASH_ATTN",
                           choices=ON_OFF_AUTO, help="set Flash Attention use")
    perf: bool = flag(False, "--perf", env="LLAMA_ARG_PERF", negative=("--no-perf",),
                      help="whether to enable internal libllama performance timings")
    escape: bool = flag(True, "-e", "--escape", negative=("--no-escape",),
                        help="whether to process escapes sequences (\\n, \\r, \\t, ', \", \\)")
    # RoPE / YaRN
    rope_scaling: str | None = flag(None, "--rope-scaling", env="LLAMA_ARG_ROPE_SCALING_TYPE",
                                    choices=("none", "linear", "yarn"),
                                    help="RoPE frequency scaling method (none: the model's, "
                                    "else linear)")
    rope_scale: float | None = flag(None, "--rope-scale", env="LLAMA_ARG_ROPE_SCALE",
                                    help="RoPE context scaling factor, expands context by N")
    rope_freq_base: float | None = flag(None, "--rope-freq-base", env="LLAMA_ARG_ROPE_FREQ_BASE",
                                        help="RoPE base frequency (none: loaded from model)")
    rope_freq_scale: float | None = flag(None, "--rope-freq-scale",
                                         env="LLAMA_ARG_ROPE_FREQ_SCALE",
                                         help="RoPE frequency scaling factor, expands context "
                                         "by 1/N")
    yarn_orig_ctx: int = flag(0, "--yarn-orig-ctx", env="LLAMA_ARG_YARN_ORIG_CTX",
                              help="YaRN: original context size of model (0 = training context)")
    yarn_ext_factor: float = flag(-1.0, "--yarn-ext-factor", env="LLAMA_ARG_YARN_EXT_FACTOR",
                                  help="YaRN: extrapolation mix factor (0.0 = full "
                                  "interpolation)")
    yarn_attn_factor: float = flag(-1.0, "--yarn-attn-factor", env="LLAMA_ARG_YARN_ATTN_FACTOR",
                                   help="YaRN: scale sqrt(t) or attention magnitude")
    yarn_beta_slow: float = flag(-1.0, "--yarn-beta-slow", env="LLAMA_ARG_YARN_BETA_SLOW",
                                 help="YaRN: high correction dim or alpha")
    yarn_beta_fast: float = flag(-1.0, "--yarn-beta-fast", env="LLAMA_ARG_YARN_BETA_FAST",
                                 help="YaRN: low correction dim or beta")
    # KV cache and memory
    kv_offload: bool = flag(True, "-kvo", "--kv-offload", env="LLAMA_ARG_KV_OFFLOAD",
                            negative=("-nkvo", "--no-kv-offload"),
                            help="whether to enable KV cache offloading")
    repack: bool = flag(True, "--repack", env="LLAMA_ARG_REPACK",
                        negative=("-nr", "--no-repack"),
                        help="whether to enable weight repacking")
    no_host: bool = flag(False, "--no-host", env="LLAMA_ARG_NO_HOST",
                         help="bypass host buffer allowing extra buffers to be used")
    cache_type_k: str = flag("f16", "-ctk", "--cache-type-k", env="LLAMA_ARG_CACHE_TYPE_K",
                             choices=CACHE_TYPES, help="KV cache data type for K")
    cache_type_v: str = flag("f16", "-ctv", "--cache-type-v", env="LLAMA_ARG_CACHE_TYPE_V",
                             choices=CACHE_TYPES, help="KV cache data type for V")
    defrag_thold: float = flag(-1.0, "-dt", "--defrag-thold", env="LLAMA_ARG_DEFRAG_THOLD",
                               help="no-op: deprecated in llama.cpp, which ignores it too")
    load_mode: str = flag("auto", "-lm", "--load-mode", env="LLAMA_ARG_LOAD_MODE",
                          choices=("auto", "none", "mmap", "mlock", "mmap+mlock", "dio"),
                          help="model loading mode")
    lazy_mode: str = flag("auto", "-lzm", "--lazy-mode", env="LLAMA_ARG_LAZY_MODE",
                          choices=ON_OFF_AUTO,
                          help="on-demand reading of certain tensors (e.g. per-layer embeddings)")
    check_tensors: bool = flag(False, "--check-tensors",
                               help="check model tensor data for invalid values")
    override_kv: list[str] = flag([], "--override-kv",
                                  help="override model metadata by key: KEY=TYPE:VALUE,... "
                                  "(types: int, float, bool, str; the flag may repeat)")
    # devices
    n_gpu_layers: str = flag("auto", "-ngl", "--gpu-layers", "--n-gpu-layers",
                             env="LLAMA_ARG_N_GPU_LAYERS",
                             help="max. number of layers to store in VRAM: a number, 'auto' "
                             "or 'all'")
    split_mode: str = flag("layer", "-sm", "--split-mode", env="LLAMA_ARG_SPLIT_MODE",
                           choices=("none", "layer", "row", "tensor"),
                           help="how to split the model across multiple GPUs")
    tensor_split: list[float] = flag([], "-ts", "--tensor-split", env="LLAMA_ARG_TENSOR_SPLIT",
                                     help="fraction of the model to offload to each GPU, "
                                     "comma-separated proportions, e.g. 3,1")
    main_gpu: int = flag(0, "-mg", "--main-gpu", env="LLAMA_ARG_MAIN_GPU",
                         help="the GPU to use for the model (split-mode none) or for "
                         "intermediate results and KV (split-mode row)")
    op_offload: bool = flag(True, "--op-offload", negative=("--no-op-offload",),
                            help="whether to offload host tensor operations to device")
    devices: str | None = flag(None, "-dev", "--device", env="LLAMA_ARG_DEVICE",
                               help="comma-separated list of devices to use for offloading "
                               "(none = don't offload); --list-devices lists them")
    list_devices: bool = flag(False, "--list-devices",
                              help="print list of available devices and exit")
    override_tensor: list[str] = flag([], "-ot", "--override-tensor",
                                      env="LLAMA_ARG_OVERRIDE_TENSOR",
                                      help="override tensor buffer type: "
                                      "<tensor name pattern>=<buffer type>,...")
    cpu_moe: bool = flag(False, "-cmoe", "--cpu-moe", env="LLAMA_ARG_CPU_MOE",
                         help="keep all Mixture of Experts (MoE) weights in the CPU")
    n_cpu_moe: int = flag(0, "-ncmoe", "--n-cpu-moe", env="LLAMA_ARG_N_CPU_MOE",
                          help="keep the MoE weights of the first N layers in the CPU")
    n_cpu_ffn: int = flag(0, "-ncffn", "--n-cpu-ffn", env="LLAMA_ARG_N_CPU_FFN",
                          help="keep the dense FFN weights of the first N layers in the CPU")
    fit: str = flag("on", "-fit", "--fit", env="LLAMA_ARG_FIT",
                    help="whether to adjust unset arguments to fit in device memory "
                    "('on' or 'off')")
    fit_target: str = flag("1024", "-fitt", "--fit-target", env="LLAMA_ARG_FIT_TARGET",
                           help="target margin per device for --fit in MiB, comma-separated; "
                           "a single value is broadcast across all devices")
    fit_ctx: int = flag(4096, "-fitc", "--fit-ctx", env="LLAMA_ARG_FIT_CTX",
                        help="minimum ctx size that can be set by --fit option")
    # slots and prompt cache
    n_parallel: int = flag(-1, "-np", "--parallel", env="LLAMA_ARG_N_PARALLEL",
                           help="number of server slots (-1 = auto)")
    cont_batching: bool = flag(True, "-cb", "--cont-batching", env="LLAMA_ARG_CONT_BATCHING",
                               negative=("-nocb", "--no-cont-batching"),
                               help="whether to enable continuous batching")
    kv_unified: bool | None = flag(None, "-kvu", "--kv-unified", env="LLAMA_ARG_KV_UNIFIED",
                                   negative=("-no-kvu", "--no-kv-unified"),
                                   help="use single unified KV buffer shared across all "
                                   "sequences (none: enabled if number of slots is auto)")
    kv_unified_per_slot: int | None = flag(None, "--kv-unified-per-slot",
                                           env="LLAMA_ARG_KV_UNIFIED_PER_SLOT",
                                           help="context limit per parallel slot")
    cache_prompt: bool = flag(True, "--cache-prompt", env="LLAMA_ARG_CACHE_PROMPT",
                              negative=("--no-cache-prompt",),
                              help="whether to enable prompt caching")
    cache_reuse: int = flag(0, "--cache-reuse", env="LLAMA_ARG_CACHE_REUSE",
                            help="min chunk size to attempt reusing from the cache via KV "
                            "shifting")
    slot_prompt_similarity: float = flag(0.1, "-sps", "--slot-prompt-similarity",
                                         help="how much the prompt of a request must match "
                                         "the prompt of a slot in order to use that slot "
                                         "(0.0 = disabled)")
    ctx_checkpoints: int = flag(32, "-ctxcp", "--ctx-checkpoints", "--swa-checkpoints",
                                env="LLAMA_ARG_CTX_CHECKPOINTS",
                                help="max number of context checkpoints to create per slot")
    checkpoint_min_step: int = flag(8192, "-cms", "--checkpoint-min-step",
                                    env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT",
                                    help="minimum spacing between context checkpoints in "
                                    "tokens (0 = no minimum)")
    cache_ram: int = flag(8192, "-cram", "--cache-ram", env="LLAMA_ARG_CACHE_RAM",
                          help="set the maximum cache size in MiB (-1 - no limit, 0 - disable; "
                          "0 on a worker that serves decisions)")
    cache_idle_slots: bool = flag(True, "--cache-idle-slots", env="LLAMA_ARG_CACHE_IDLE_SLOTS",
                                  negative=("--no-cache-idle-slots",),
                                  help="save idle slots to the prompt cache on new task "
                                  "(requires cache-ram; llamaq keeps them in their slots, "
                                  "also with a unified KV)")
    context_shift: bool = flag(False, "--context-shift", env="LLAMA_ARG_CONTEXT_SHIFT",
                               negative=("--no-context-shift",),
                               help="whether to use context shift on infinite text generation")
    slot_save_path: str | None = flag(None, "--slot-save-path", env="LLAMA_ARG_SLOT_SAVE_PATH",
                                      help="path to save slot kv cache")
    # LoRA adapters
    lora: list[str] = flag([], "--lora", help="path to LoRA adapter (use comma-separated values "
                           "to load multiple adapters)")
    lora_scaled: list[str] = flag([], "--lora-scaled",
                                  help="path to LoRA adapter with user defined scaling "
                                  "(format: FNAME:SCALE,...)")
    lora_init_without_apply: bool = flag(False, "--lora-init-without-apply",
                                         help="load LoRA adapters without applying them (scale "
                                         "0; apply later via POST /lora-adapters)")
    # control vectors
    control_vector: list[str] = flag([], "--control-vector",
                                     help="add a control vector (use comma-separated values to "
                                     "add multiple control vectors)")
    control_vector_scaled: list[str] = flag([], "--control-vector-scaled",
                                            help="add a control vector with user defined "
                                            "scaling SCALE (format: FNAME:SCALE,...)")
    control_vector_layer_range: list[int] = flag([], "--control-vector-layer-range", nargs=2,
                                                 help="layer range to apply the control "
                                                 "vector(s) to, START END, both inclusive")
    # sampling
    sampling: SamplingSettings = flag_group(
        SamplingSettings, help="the server-wide sampling defaults a request falls back on (each "
        "field's flag is declared in scheduler/contract/sampling.py SamplingSettings)")
    sampling_seq: str = flag("edskypmxt", "--sampler-seq", "--sampling-seq",
                             help="simplified sequence for samplers that will be used")
    logit_bias: list[str] = flag([], "-l", "--logit-bias",
                                 help="modify the likelihood of a token: TOKEN_ID(+/-)BIAS, "
                                 "e.g. 15043+1")
    grammar: str | None = flag(None, "--grammar",
                               help="BNF-like grammar to constrain generations")
    grammar_file: str | None = flag(None, "--grammar-file", help="file to read grammar from")
    json_schema: str | None = flag(None, "-j", "--json-schema",
                                   help="JSON schema to constrain generations")
    json_schema_file: str | None = flag(None, "-jf", "--json-schema-file",
                                        help="file containing a JSON schema to constrain "
                                        "generations")
    sleep_idle_seconds: int = flag(-1, "--sleep-idle-seconds",
                                   help="number of seconds of idleness after which the server "
                                   "will sleep (unload the model; the next job loads it again) "
                                   "(-1 = disabled)")
    # embeddings and rerank
    embedding: bool = flag(False, "--embedding", "--embeddings", env="LLAMA_ARG_EMBEDDINGS",
                           help="restrict to only support embedding use case; use only with "
                           "dedicated embedding models")
    rerank: bool = flag(False, "--rerank", "--reranking", env="LLAMA_ARG_RERANKING",
                        help="enable reranking endpoint on server (embeddings with rank "
                        "pooling)")
    pooling: str | None = flag(None, "--pooling", env="LLAMA_ARG_POOLING",
                               choices=("none", "mean", "cls", "last", "rank"),
                               help="pooling type for embeddings, use model default if "
                               "unspecified")
    embd_normalize: int = flag(2, "--embd-normalize",
                               help="normalisation for embeddings (-1=none, 0=max absolute "
                               "int16, 1=taxicab, 2=euclidean, >2=p-norm)")
    # multimodal (worker/runtime/media.py)
    mmproj: str | None = flag(None, "-mm", "--mmproj", env="LLAMA_ARG_MMPROJ",
                              help="path to a multimodal projector file")
    mmproj_url: str | None = flag(None, "-mmu", "--mmproj-url", env="LLAMA_ARG_MMPROJ_URL",
                                  help="URL to a multimodal projector file (downloaded once "
                                  "into the cache and the store, as -mu)")
    mmproj_device: str | None = flag(None, "-mmdev", "--mmproj-device",
                                     env="MTMD_BACKEND_DEVICE",
                                     help="device to use for the multimodal projector (none = "
                                     "don't offload; default: follows --device)")
    mmproj_auto: bool = flag(True, "--mmproj-auto", env="LLAMA_ARG_MMPROJ_AUTO",
                             negative=("--no-mmproj", "--no-mmproj-auto"),
                             help="with -hf, load the repo's multimodal projector too, if it "
                             "has one")
    mmproj_offload: bool = flag(True, "--mmproj-offload", env="LLAMA_ARG_MMPROJ_OFFLOAD",
                                negative=("--no-mmproj-offload",),
                                help="whether to enable GPU offloading for the multimodal "
                                "projector")
    image_min_tokens: int = flag(-1, "--image-min-tokens", env="LLAMA_ARG_IMAGE_MIN_TOKENS",
                                 help="minimum number of tokens each image can take, only "
                                 "used by vision models with dynamic resolution (-1: the "
                                 "model's)")
    image_max_tokens: int = flag(-1, "--image-max-tokens", env="LLAMA_ARG_IMAGE_MAX_TOKENS",
                                 help="maximum number of tokens each image can take, only "
                                 "used by vision models with dynamic resolution (-1: the "
                                 "model's)")
    mtmd_batch_max_tokens: int = flag(-1, "--mtmd-batch-max-tokens",
                                      env="LLAMA_ARG_MTMD_BATCH_MAX_TOKENS",
                                      help="the most tokens mtmd encodes in one batch (-1: "
                                      "mtmd's default)")
    video_fps: float = flag(4.0, "--video-fps", env="LLAMA_ARG_VIDEO_FPS",
                            help="target video frame rate (default: 4.0)")
    video_timestamp_interval: int = flag(5000, "--video-timestamp-interval",
                                         env="LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL",
                                         help="interval in milliseconds between text "
                                         "timestamps (default: 5000)")
    video_ffmpeg_dir: str | None = flag(None, "--video-ffmpeg-dir",
                                        env="LLAMA_ARG_VIDEO_FFMPEG_DIR",
                                        help="path to the directory containing ffmpeg and "
                                        "ffprobe (default: search in PATH)")
    # ours
    decisions: bool = flag(False, "--decisions", env="LLAMAQ_DECISIONS",
                           negative=("--no-decisions",),
                           help="serve POST /v1/systemone with this text model by prompting "
                           "(prompted decisions; a native decision model serves it without); "
                           "the model does not advertise \"decisions\" in /v1/models")
    worker_id: str | None = flag(None, "--worker-id", env="LLAMAQ_WORKER_ID",
                                 help="worker id in the registry (none: generated)")
    kv_store: bool = flag(False, "--kv-store", env="LLAMAQ_KV_STORE", negative=("--no-kv-store",),
                          help="the fleet-wide KV tier: long prompts' prefix states go to the "
                          "object store and any worker of the model restores them instead of "
                          "prefilling (docs/architecture.md)")
    kv_store_max: int = flag(10240, "--kv-store-max", env="LLAMAQ_KV_STORE_MAX",
                             help="MiB of KV states the tier keeps per model fingerprint "
                             "(least recently used evicted first)")
    kv_store_block: int = flag(256, "--kv-store-block", env="LLAMAQ_KV_STORE_BLOCK",
                               help="tokens per block: states are taken at block boundaries")
    kv_store_min: int = flag(1024, "--kv-store-min", env="LLAMAQ_KV_STORE_MIN",
                             help="prompts shorter than this many tokens do not use the tier")
    batch_reserve: int = flag(1, "--batch-reserve", env="LLAMAQ_BATCH_RESERVE",
                              help="slots that batch lines (the Batch API) leave free for "
                              "online requests (at most -np minus 1)")
    preempt: str = flag("priority", "--preempt", env="LLAMAQ_PREEMPT",
                        choices=("off", "priority", "fair"),
                        help="when every slot is busy and a job of a lower priority value "
                        "waits, the least urgent generation gives its slot up and continues "
                        "later from its tokens; fair: also when a job of a tenant below its "
                        "share of the slots waits (docs/fairness.md)")
    poll_delay: float = flag(1.0, "--poll-delay", env="LLAMAQ_POLL_DELAY",
                             help="arq fallback poll interval in seconds")
    idle_poll_delay: float = flag(30.0, "--idle-poll-delay", env="LLAMAQ_IDLE_POLL_DELAY",
                                  help="seconds between two polls of a queue by a worker "
                                  "that waits for its jobs there and hears its wake channel "
                                  "(a queued job wakes it: the poll is only the safety net "
                                  "of a lost wake-up; never below --poll-delay)")
    admit_lag_ms: float = flag(0.0, "--admit-lag-ms", env="LLAMAQ_ADMIT_LAG_MS",
                               help="a worker whose event loop lags more than this many ms "
                               "(smoothed) starts no new job while it runs some (admission "
                               "under overload, docs/scale.md); 0 = off: its slots alone "
                               "bound what it takes")
    stream_interval: float = flag(0.0, "--stream-interval", env="LLAMAQ_STREAM_INTERVAL",
                                  help="ms between two sends of a running job's later tokens: "
                                  "the tokens of one job in between go as one event (fewer "
                                  "Redis commands and SSE chunks; 0 = one event per token, as "
                                  "llama-server)")

    @field_validator("checkpoint_min_step")
    @classmethod
    def _checkpoint_step(cls, value: int) -> int:
        if value < 0:  # llama-server's message
            raise ValueError("checkpoint-min-step must be non-negative")
        return value

    @field_validator("override_kv")
    @classmethod
    def _kv_overrides(cls, value: list[str]) -> list[str]:
        parse_kv_overrides(value)  # llama.cpp's message for the first bad item
        return value

    @field_validator("fit")
    @classmethod
    def _fit_on_or_off(cls, value: str) -> str:
        """llama.cpp reads --fit's value as truthy or falsey, anything else is an error."""
        word = value.strip().lower()
        if word in TRUTHY:
            return "on"
        if word in FALSEY:
            return "off"
        raise ValueError(f"unknown value for --fit: '{value}'")

    @field_validator("fit_target")
    @classmethod
    def _fit_target_mib(cls, value: str) -> str:
        if not all(part.strip().isdigit() for part in re.split(r"[,/]+", value)):
            raise ValueError(f"invalid value for --fit-target: '{value}' (MiB per device)")
        return value

    def fit_margins(self, n_devices: int) -> list[int]:
        """--fit-target in bytes, one per device (a single value is broadcast)."""
        mib = [int(part) for part in re.split(r"[,/]+", self.fit_target)]
        if len(mib) == 1:
            mib *= max(1, n_devices)
        return [m * 1024 * 1024 for m in mib] + [1024 * 1024 * 1024] * (n_devices - len(mib))
