"""llama-server's `--*-default` model presets (common/arg.cpp): each a `-hf` model with the
flags llama.cpp sets beside it, as preset keys (flag names without dashes). A role applies the
keys it takes to the fields its own command line and environment left unset (so `-c 8192`
beside a preset wins, wherever it stands). The two `--fim-qwen-*-spec` presets also name
their draft model on the Hub (`-hfd`, its file as `-md`); as in llama-server, drafting with it
still takes `--spec-type draft-simple`."""

from __future__ import annotations

FIM = {"port": "8012", "ubatch-size": "1024", "batch-size": "1024", "cache-reuse": "256"}
GPT_OSS = {"port": "8013", "ubatch-size": "2048", "batch-size": "32768", "parallel": "2",
           "ctx-size": str(131072 * 2), "temp": "1.0", "top-p": "1.0", "top-k": "0",
           "min-p": "0.01", "jinja": "true"}
VISION = {"port": "8014", "jinja": "true"}
QWEN_DRAFT = {"hf-repo-draft": "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF",
              "model-draft": "qwen2.5-coder-0.5b-q8_0.gguf"}

MODEL_PRESETS: dict[str, dict[str, str]] = {
    "--embd-gemma-default": {
        "hf-repo": "ggml-org/embeddinggemma-300M-qat-q4_0-GGUF",
        "hf-file": "embeddinggemma-300M-qat-Q4_0.gguf", "port": "8011", "ubatch-size": "2048",
        "batch-size": "2048", "parallel": "32", "ctx-size": str(2048 * 32),
        "embedding": "true"},
    "--fim-qwen-1.5b-default": {"hf-repo": "ggml-org/Qwen2.5-Coder-1.5B-Q8_0-GGUF",
                                "hf-file": "qwen2.5-coder-1.5b-q8_0.gguf", **FIM},
    "--fim-qwen-3b-default": {"hf-repo": "ggml-org/Qwen2.5-Coder-3B-Q8_0-GGUF",
                              "hf-file": "qwen2.5-coder-3b-q8_0.gguf", **FIM},
    "--fim-qwen-7b-default": {"hf-repo": "ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF",
                              "hf-file": "qwen2.5-coder-7b-q8_0.gguf", **FIM},
    "--fim-qwen-30b-default": {"hf-repo": "ggml-org/Qwen3-Coder-30B-A3B-Instruct-Q8_0-GGUF",
                               "hf-file": "qwen3-coder-30b-a3b-instruct-q8_0.gguf", **FIM},
    "--fim-qwen-7b-spec": {"hf-repo": "ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF",
                           "hf-file": "qwen2.5-coder-7b-q8_0.gguf", **QWEN_DRAFT, **FIM},
    "--fim-qwen-14b-spec": {"hf-repo": "ggml-org/Qwen2.5-Coder-14B-Q8_0-GGUF",
                            "hf-file": "qwen2.5-coder-14b-q8_0.gguf", **QWEN_DRAFT, **FIM},
    "--gpt-oss-20b-default": {"hf-repo": "ggml-org/gpt-oss-20b-GGUF",
                              "hf-file": "gpt-oss-20b-mxfp4.gguf", **GPT_OSS},
    "--gpt-oss-120b-default": {"hf-repo": "ggml-org/gpt-oss-120b-GGUF", **GPT_OSS},
    "--vision-gemma-4b-default": {"hf-repo": "ggml-org/gemma-3-4b-it-qat-GGUF", **VISION},
    "--vision-gemma-12b-default": {"hf-repo": "ggml-org/gemma-3-12b-it-qat-GGUF", **VISION},
}
"""The presets llamaq builds (llama.cpp's `n_ctx = 0` is the default here: not written)."""
