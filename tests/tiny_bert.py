"""A tiny BERT rank model (cross-encoder) for rerank tests: random weights, a real WordPiece
vocabulary with BERT's special tokens, a classification head; written through
worker/runtime/convert_bert.py, as a converted checkpoint would be."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from worker.runtime.convert_bert import BertCheckpoint, BertVocab, write_gguf

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "a", "is", "it", "what", "panda", "bear", "giant", "china", "species", "hi",
         "animal", "eats", "bamboo", "lives", "in", "of", "and", "called", "simply", "car",
         "red", "fast", "road", "sometimes", "endemic", "to", "?", ".", ",", "(", ")"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]


def tiny_vocab() -> BertVocab:
    words = WORDS + [c for c in LETTERS if c not in WORDS]
    tokens = SPECIAL + words + ["##" + c for c in LETTERS]
    ids = {"pad": 0, "unk": 1, "bos": 2, "eos": 3, "sep": 3, "mask": 4}
    return BertVocab(tokens, set(range(len(SPECIAL))), ids)


def write_tiny_rank_bert(path: Path, seed: int = 7, n_embd: int = 32, n_layer: int = 2,
                         n_head: int = 4, n_ff: int = 64, n_ctx: int = 128) -> Path:
    vocab = tiny_vocab()
    rng = np.random.default_rng(seed)

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm() -> tuple[np.ndarray, np.ndarray]:
        return (1.0 + weight(n_embd, scale=0.05)), weight(n_embd, scale=0.05)

    tensors: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": weight(len(vocab.tokens), n_embd),
        "embeddings.position_embeddings.weight": weight(n_ctx, n_embd),
        "embeddings.token_type_embeddings.weight": weight(2, n_embd),
    }
    tensors["embeddings.LayerNorm.weight"], tensors["embeddings.LayerNorm.bias"] = norm()
    for i in range(n_layer):
        p = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            tensors[f"{p}attention.self.{part}.weight"] = weight(n_embd, n_embd)
            tensors[f"{p}attention.self.{part}.bias"] = weight(n_embd, scale=0.05)
        tensors[f"{p}attention.output.dense.weight"] = weight(n_embd, n_embd)
        tensors[f"{p}attention.output.dense.bias"] = weight(n_embd, scale=0.05)
        (tensors[f"{p}attention.output.LayerNorm.weight"],
         tensors[f"{p}attention.output.LayerNorm.bias"]) = norm()
        tensors[f"{p}intermediate.dense.weight"] = weight(n_ff, n_embd)
        tensors[f"{p}intermediate.dense.bias"] = weight(n_ff, scale=0.05)
        tensors[f"{p}output.dense.weight"] = weight(n_embd, n_ff)
        tensors[f"{p}output.dense.bias"] = weight(n_embd, scale=0.05)
        tensors[f"{p}output.LayerNorm.weight"], tensors[f"{p}output.LayerNorm.bias"] = norm()
    tensors["classifier.dense.weight"] = weight(n_embd, n_embd, scale=0.5)
    tensors["classifier.dense.bias"] = weight(n_embd, scale=0.1)
    tensors["classifier.out_proj.weight"] = weight(1, n_embd, scale=1.0)
    tensors["classifier.out_proj.bias"] = weight(1, scale=0.1)
    hparams = {"num_hidden_layers": n_layer, "max_position_embeddings": n_ctx,
               "hidden_size": n_embd, "intermediate_size": n_ff, "num_attention_heads": n_head,
               "layer_norm_eps": 1e-12, "type_vocab_size": 2}
    return write_gguf(BertCheckpoint(hparams, tensors, vocab, "rank"), path, name="tiny-rank")
