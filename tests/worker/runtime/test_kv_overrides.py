"""--override-kv on a real model load (worker/runtime/kv_overrides.py): the tiny GGUF says
add_bos_token true; overridden to false, the loaded vocabulary adds no BOS (tokenizing shows
it), as llama-server's `--override-kv tokenizer.ggml.add_bos_token=bool:false` does; an int
override reaches the loader too (the training context)."""

from __future__ import annotations

from pathlib import Path

from worker.process.startup import load_model
from worker.runtime.settings import WorkerSettings


def load(path: Path, *argv: str) -> tuple[bool, list[int], int]:
    settings = WorkerSettings.from_args(["-m", str(path), "--no-warmup", "-c", "256",
                                         "-np", "1", "-fit", "off", *argv], environ={})
    model = load_model(settings, path)
    try:
        tokens = model.vocab.tokenize("hello", add_special=True, parse_special=False)
        return model.vocab.add_bos, tokens, model.n_ctx_train
    finally:
        model.close()


def test_add_bos_token_overridden(tiny_model_path: Path) -> None:
    add_bos, tokens, n_ctx_train = load(tiny_model_path)
    assert add_bos and tokens[0] == 1 and n_ctx_train == 4096  # the file's values
    add_bos, plain, n_ctx_train = load(
        tiny_model_path, "--override-kv",
        "tokenizer.ggml.add_bos_token=bool:false,llama.context_length=int:2048")
    assert not add_bos and plain == tokens[1:]
    assert n_ctx_train == 2048
