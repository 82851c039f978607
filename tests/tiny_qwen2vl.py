"""A tiny Qwen2-VL-shaped pair written with the `gguf` package: a text model of llama.cpp's
`qwen2vl` architecture (M-RoPE: `qwen2vl.rope.dimension_sections`) and a `qwen2vl` (or
`qwen25vl`) vision projector with the metadata keys and tensor names that
`tools/mtmd/clip.cpp` reads (two patch convolutions merged over time, a ViT with M-RoPE, a
2×2 merge and a two-layer MLP). Random weights: the real mtmd path runs (preprocessing,
encode, 2-D positions of the image's embeddings), what the model says means nothing.

An image's chunk holds nx × ny tokens but advances the positions by max(nx, ny) only
(mtmd_input_chunk_get_n_pos), which is what the engine's M-RoPE positions are tested on.

    python -m tests.tiny_qwen2vl MODEL.gguf MMPROJ.gguf [--qwen25]"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

from tests.tiny_gguf import add_sentencepiece_vocab, vocabulary

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT_EMBD = 64
ROPE_SECTIONS = (2, 3, 3, 0)
"""Of the 16-wide heads' 8 rotary pairs: temporal, height, width (Qwen2-VL's 16/24/24 of 64)."""


def write_tiny_qwen2vl(path: Path, n_embd: int = TEXT_EMBD, n_layer: int = 2, n_head: int = 4,
                       n_ff: int = 128, n_ctx: int = 4096, seed: int = 2828) -> Path:
    tokens, scores, types = vocabulary(control=("<|vision_start|>", "<|vision_end|>",
                                                "<|image_pad|>"))
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5 / np.sqrt(shape[-1])).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "qwen2vl")
    writer.add_name("tiny-qwen2vl")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1000000.0)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_dimension_sections(list(ROPE_SECTIONS))
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_sentencepiece_vocab(writer, (tokens, scores, types), CHAT_TEMPLATE, eos=4,
                            add_bos=False)
    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, n_embd) * 8)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(n_embd, n_embd))
            writer.add_tensor(f"blk.{i}.{name}.bias", np.zeros(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_qwen2vl_mmproj(path: Path, text_embd: int = TEXT_EMBD, qwen25: bool = False,
                              patch_size: int = 14, n_embd: int = 32, n_head: int = 2,
                              n_ff: int = 64, n_layer: int = 2, seed: int = 2829) -> Path:
    """`qwen25`: the `qwen25vl` type (RMS norms, window attention every `n_layer` layers)."""
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5 / np.sqrt(shape[-1])).astype(np.float32)

    def vector(n: int, value: float) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name("tiny-qwen25vl-mmproj" if qwen25 else "tiny-qwen2vl-mmproj")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_string("clip.projector_type", "qwen2.5vl_merger" if qwen25 else "qwen2vl_merger")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_audio_encoder", False)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", 560)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", n_ff)
    writer.add_uint32("clip.vision.block_count", n_layer)
    writer.add_uint32("clip.vision.projection_dim", text_embd)
    writer.add_uint32("clip.vision.attention.head_count", n_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.spatial_merge_size", 2)
    if qwen25:
        writer.add_uint32("clip.vision.n_wa_pattern", n_layer)
    writer.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    writer.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])
    n_merged = 4 * n_embd  # a 2×2 merge of the ViT's outputs
    tensors: dict[str, np.ndarray] = {
        # conv kernels ne [KW, KH, C_in, C_out]: one per frame of a temporal pair
        "v.patch_embd.weight": weight(n_embd, 3, patch_size, patch_size),
        "v.patch_embd.weight.1": weight(n_embd, 3, patch_size, patch_size),
        "mm.0.weight": weight(n_merged, n_merged),
        "mm.0.bias": vector(n_merged, 0.0),
        "mm.2.weight": weight(text_embd, n_merged),
        "mm.2.bias": vector(text_embd, 0.0),
    }
    for il in range(n_layer):
        blk = f"v.blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{blk}.{name}.weight"] = weight(n_embd, n_embd)
            tensors[f"{blk}.{name}.bias"] = vector(n_embd, 0.0)
        for name in ("ln1", "ln2"):
            tensors[f"{blk}.{name}.weight"] = vector(n_embd, 1.0)
            if not qwen25:
                tensors[f"{blk}.{name}.bias"] = vector(n_embd, 0.0)
        tensors[f"{blk}.ffn_up.weight"] = weight(n_ff, n_embd)
        tensors[f"{blk}.ffn_up.bias"] = vector(n_ff, 0.0)
        tensors[f"{blk}.ffn_down.weight"] = weight(n_embd, n_ff)
        tensors[f"{blk}.ffn_down.bias"] = vector(n_embd, 0.0)
        if qwen25:
            tensors[f"{blk}.ffn_gate.weight"] = weight(n_ff, n_embd)
            tensors[f"{blk}.ffn_gate.bias"] = vector(n_ff, 0.0)
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.tiny_qwen2vl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("mmproj", type=Path)
    parser.add_argument("--qwen25", action="store_true", help="a qwen25vl projector")
    args = parser.parse_args(argv)
    write_tiny_qwen2vl(args.model)
    write_tiny_qwen2vl_mmproj(args.mmproj, qwen25=args.qwen25)
    print(args.model, args.mmproj)


if __name__ == "__main__":
    main()
