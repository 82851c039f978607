"""A random-weight GGUF of Llama-3.2-1B's shape, written with the `gguf` package where no model
file can travel (the GPU bench machine has no network; bench/gpu/run quantizes it to Q4_K_M
with the same llama.cpp build's llama-quantize).

    python bench/gpu/llama_1b.py OUT.gguf [--shape 1b|tiny]

`1b`: Llama-3.2-1B's shape (16 layers, 2048 wide, 32 query / 8 key-value heads, 8192 feed
forward, a 128,256-token vocabulary, tied embeddings, rope base 500,000) in F16, ~2.5 GB.
`tiny`: the same vocabulary on a 2-layer, 256-wide body, for rehearsing the bench on a CPU.
Output makes no sense (random weights); the bench sends `ignore_eos`, so only the shapes
matter. The vocabulary is SentencePiece-style (tests/tiny_gguf.py's pieces, padded with
distinct filler pieces to the full size) so prompts tokenize as with any llama model."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.tiny_gguf import add_sentencepiece_vocab, vocabulary  # noqa: E402


@dataclass(frozen=True)
class Shape:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int = 128_256
    n_ctx: int = 131_072


SHAPES = {
    "1b": Shape(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192),
    "tiny": Shape(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512),
}


def padded_vocabulary(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    tokens, scores, types = vocabulary()
    filler = n_vocab - len(tokens)
    tokens += [f"▁f{i}" for i in range(filler)]
    scores += [-10.0 - i * 1e-5 for i in range(filler)]
    types += [int(gguf.TokenType.NORMAL)] * filler
    return tokens, scores, types


def write(path: Path, shape: Shape, seed: int = 1) -> Path:
    rng = np.random.default_rng(seed)

    def weight(*dims: int) -> np.ndarray:
        values = rng.standard_normal(dims, dtype=np.float32)
        values *= 0.5 / np.sqrt(dims[-1])
        return values.astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    head_dim = shape.n_embd // shape.n_head
    tokens, scores, types = padded_vocabulary(shape.n_vocab)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("random-llama-3.2-1b-shape")
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(500_000.0)
    writer.add_vocab_size(shape.n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_sentencepiece_vocab(writer, (tokens, scores, types))
    writer.add_tensor("token_embd.weight", weight(shape.n_vocab, shape.n_embd))  # tied output
    writer.add_tensor("output_norm.weight", ones(shape.n_embd))
    kv = shape.n_head_kv * head_dim
    for i in range(shape.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(shape.n_embd))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(shape.n_embd, shape.n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv, shape.n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv, shape.n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(shape.n_embd, shape.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(shape.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(shape.n_ff, shape.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(shape.n_ff, shape.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(shape.n_embd, shape.n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    args = parser.parse_args()
    write(args.out, SHAPES[args.shape])
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.0f} MiB, {args.shape})")


if __name__ == "__main__":
    main()
