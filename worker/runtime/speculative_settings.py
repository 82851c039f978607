"""The worker's speculative decoding flags (llama-server's --spec-*, -lcs/-lcd, draft model),
a part of WorkerSettings (worker/runtime/settings.py); worker/runtime/flags.py turns them into
the drafters' SpecConfig (worker/speculative/config.py)."""

from __future__ import annotations

from scheduler.config.settings import flag
from scheduler.contract.deferred import DeferredModel

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


class SpeculativeSettings(DeferredModel):
    spec_type: list[str] = flag([], "--spec-type", env="LLAMA_ARG_SPEC_TYPE", sep=None,
                                help="comma-separated list of types of speculative decoding "
                                "to use (default: none; llamaq drafts with none, draft-simple, "
                                "ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, "
                                "ngram-cache)")
    spec_synth_len: float | None = flag(None, "--spec-synth-len", env="LLAMA_ARG_SPEC_SYNTH_LEN",
                                        help="target mean synthetic acceptance length, "
                                        "including the target token (benchmarking only)")
    spec_synth_rates: list[float] = flag([], "--spec-synth-rates",
                                         env="LLAMA_ARG_SPEC_SYNTH_RATES",
                                         help="comma-separated unconditional per-position "
                                         "synthetic acceptance probabilities (benchmarking "
                                         "only)")
    lookup_cache_static: str | None = flag(None, "-lcs", "--lookup-cache-static",
                                           help="path to static lookup cache to use for "
                                           "lookup decoding (not updated by generation)")
    lookup_cache_dynamic: str | None = flag(None, "-lcd", "--lookup-cache-dynamic",
                                            help="path to dynamic lookup cache to use for "
                                            "lookup decoding (llamaq: grown by generation, "
                                            "saved and shared through the object store by every "
                                            "worker of the model; created when missing)")
    spec_default: bool = flag(False, "--spec-default",
                              help="enable default speculative decoding config (ngram-mod, "
                              "n_match 24, n_min 48, n_max 64)")
    spec_draft_model: str | None = flag(None, "-md", "--spec-draft-model", "--model-draft",
                                        env="LLAMA_ARG_SPEC_DRAFT_MODEL",
                                        help="draft model for speculative decoding (a local "
                                        "GGUF file, or with -hfd the file in that repo; used "
                                        "with --spec-type draft-simple)")
    spec_draft_hf: str | None = flag(None, "--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft",
                                     env="LLAMA_ARG_SPEC_DRAFT_HF_REPO",
                                     help="Same as --hf-repo, but for the draft model (fetched "
                                     "once into the object store)")
    spec_draft_n_max: int = flag(3, "--spec-draft-n-max", env="LLAMA_ARG_SPEC_DRAFT_N_MAX",
                                 help="number of tokens to draft for speculative decoding")
    spec_draft_n_min: int = flag(0, "--spec-draft-n-min", env="LLAMA_ARG_SPEC_DRAFT_N_MIN",
                                 help="minimum number of draft tokens to use for speculative "
                                 "decoding")
    spec_draft_p_min: float = flag(0.0, "--spec-draft-p-min", "--draft-p-min",
                                   env="LLAMA_ARG_SPEC_DRAFT_P_MIN",
                                   help="minimum speculative decoding probability (greedy)")
    spec_draft_p_split: float = flag(0.1, "--spec-draft-p-split", "--draft-p-split",
                                     env="LLAMA_ARG_SPEC_DRAFT_P_SPLIT",
                                     help="speculative decoding split probability (read by "
                                     "nothing, as in llama-server)")
    spec_draft_ngl: str = flag("auto", "-ngld", "--spec-draft-ngl", "--gpu-layers-draft",
                               "--n-gpu-layers-draft", env="LLAMA_ARG_N_GPU_LAYERS_DRAFT",
                               help="max. number of draft model layers to store in VRAM: a "
                               "number, 'auto' or 'all'")
    spec_draft_type_k: str = flag("f16", "-ctkd", "--spec-draft-type-k", "--cache-type-k-draft",
                                  env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", choices=CACHE_TYPES,
                                  help="KV cache data type for K for the draft model")
    spec_draft_type_v: str = flag("f16", "-ctvd", "--spec-draft-type-v", "--cache-type-v-draft",
                                  env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", choices=CACHE_TYPES,
                                  help="KV cache data type for V for the draft model")
    spec_draft_device: str | None = flag(None, "-devd", "--spec-draft-device", "--device-draft",
                                         help="comma-separated list of devices to use for "
                                         "offloading the draft model (none = don't offload, "
                                         "default: follows --device)")
    spec_draft_threads: int = flag(0, "-td", "--spec-draft-threads", "--threads-draft",
                                   help="number of threads to use during generation for the "
                                   "draft model (default: same as --threads)")
    spec_draft_threads_batch: int = flag(0, "-tbd", "--spec-draft-threads-batch",
                                         "--threads-batch-draft",
                                         help="number of threads to use during batch and "
                                         "prompt processing for the draft model (default: "
                                         "same as --threads-draft)")
    spec_draft_n_ubatch: int = flag(0, "--spec-draft-n-ubatch",
                                    env="LLAMA_ARG_SPEC_DRAFT_N_UBATCH",
                                    help="physical maximum batch size of the draft context, use "
                                    "a smaller value to spare VRAM (default: 0 - same as "
                                    "--n-ubatch)")
    spec_draft_override_tensor: list[str] = flag([], "-otd", "--spec-draft-override-tensor",
                                                 "--override-tensor-draft",
                                                 help="override tensor buffer type for draft "
                                                 "model: <tensor name pattern>=<buffer "
                                                 "type>,...")
    spec_draft_cpu_moe: bool = flag(False, "-cmoed", "--spec-draft-cpu-moe", "--cpu-moe-draft",
                                    env="LLAMA_ARG_SPEC_DRAFT_CPU_MOE",
                                    help="keep all Mixture of Experts (MoE) weights in the CPU "
                                    "for the draft model")
    spec_draft_n_cpu_moe: int = flag(0, "-ncmoed", "--spec-draft-n-cpu-moe",
                                     "--spec-draft-ncmoe", "--n-cpu-moe-draft",
                                     env="LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE",
                                     help="keep the Mixture of Experts (MoE) weights of the "
                                     "first N layers in the CPU for the draft model")
    spec_ngram_mod_n_min: int = flag(48, "--spec-ngram-mod-n-min",
                                     help="minimum number of ngram tokens to use for "
                                     "ngram-based speculative decoding")
    spec_ngram_mod_n_max: int = flag(64, "--spec-ngram-mod-n-max",
                                     help="maximum number of ngram tokens to use for "
                                     "ngram-based speculative decoding")
    spec_ngram_mod_n_match: int = flag(24, "--spec-ngram-mod-n-match",
                                       help="ngram-mod lookup length")
    spec_ngram_simple_size_n: int = flag(12, "--spec-ngram-simple-size-n",
                                         help="ngram size N for ngram-simple speculative "
                                         "decoding, length of lookup n-gram")
    spec_ngram_simple_size_m: int = flag(48, "--spec-ngram-simple-size-m",
                                         help="ngram size M for ngram-simple speculative "
                                         "decoding, length of draft m-gram")
    spec_ngram_simple_min_hits: int = flag(1, "--spec-ngram-simple-min-hits",
                                           help="minimum hits for ngram-simple speculative "
                                           "decoding")
    spec_ngram_map_k_size_n: int = flag(12, "--spec-ngram-map-k-size-n",
                                     help="ngram size N for ngram-map-k speculative decoding, "
                                     "length of lookup n-gram")
    spec_ngram_map_k_size_m: int = flag(48, "--spec-ngram-map-k-size-m",
                                     help="ngram size M for ngram-map-k speculative decoding, "
                                     "length of draft m-gram")
    spec_ngram_map_k_min_hits: int = flag(1, "--spec-ngram-map-k-min-hits",
                                       help="minimum hits for ngram-map-k speculative decoding")
    spec_ngram_map_k4v_size_n: int = flag(12, "--spec-ngram-map-k4v-size-n",
                                     help="ngram size N for ngram-map-k4v speculative decoding, "
                                     "length of lookup n-gram")
    spec_ngram_map_k4v_size_m: int = flag(48, "--spec-ngram-map-k4v-size-m",
                                     help="ngram size M for ngram-map-k4v speculative decoding, "
                                     "length of draft m-gram")
    spec_ngram_map_k4v_min_hits: int = flag(1, "--spec-ngram-map-k4v-min-hits",
                                       help="minimum hits for ngram-map-k4v speculative decoding")
    reverse_prompt: list[str] = flag([], "-r", "--reverse-prompt", sep=None,
                                     help="halt generation at PROMPT: the stop strings of a "
                                     "request that gives none, one per flag")
    special: bool = flag(False, "-sp", "--special", help="special tokens output enabled")
    warmup: bool = flag(True, "--warmup", negative=("--no-warmup",),
                        help="whether to perform warmup with an empty run")
    spm_infill: bool = flag(False, "--spm-infill",
                            help="use Suffix/Prefix/Middle pattern for infill")
