"""A tiny Gemma 3 vision projector (mmproj) GGUF written with the `gguf` package: random
weights, the metadata keys and tensor names that llama.cpp's `tools/mtmd/clip.cpp` reads for
the `gemma3` projector type (a SigLIP encoder, an average pool, an RMS norm and a projection),
sized to Gemma 3 270M's 640-wide text embeddings. The real mtmd path runs on it (load, image
preprocessing, encode, embeddings into the batch); what the model then says means nothing.

    python -m tests.tiny_mmproj OUT.gguf [--text-embd 640] [--image-size 224] [--audio]

An image becomes (image_size / patch_size / 4)² tokens: 16 at the defaults (Gemma 3's own
projector: 896 / 14 / 4 → 256)."""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

GEMMA3_270M_EMBD = 640


def write_tiny_mmproj(path: Path, text_embd: int = GEMMA3_270M_EMBD, image_size: int = 224,
                      patch_size: int = 14, n_embd: int = 32, n_head: int = 2,
                      n_ff: int = 64, n_layer: int = 2, seed: int = 28) -> Path:
    if image_size % (patch_size * 4):
        raise ValueError("image_size must be a multiple of 4 × patch_size (gemma3 pools by 4)")
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5 / np.sqrt(shape[-1])).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name("tiny-gemma3-mmproj")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_audio_encoder", False)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", n_ff)
    writer.add_uint32("clip.vision.block_count", n_layer)
    writer.add_uint32("clip.vision.projection_dim", text_embd)
    writer.add_uint32("clip.vision.attention.head_count", n_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    n_patches = (image_size // patch_size) ** 2
    # numpy shapes are ggml's ne reversed: conv kernel ne [KW, KH, C_in, C_out]
    tensors: dict[str, np.ndarray] = {
        "v.patch_embd.weight": weight(n_embd, 3, patch_size, patch_size),
        "v.patch_embd.bias": zeros(n_embd),
        "v.position_embd.weight": weight(n_patches, n_embd),
        "v.post_ln.weight": ones(n_embd),
        "v.post_ln.bias": zeros(n_embd),
        "mm.soft_emb_norm.weight": ones(n_embd),
        # ne [text_embd, n_embd]: clip.cpp multiplies by its transpose
        "mm.input_projection.weight": weight(n_embd, text_embd),
    }
    for il in range(n_layer):
        blk = f"v.blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{blk}.{name}.weight"] = weight(n_embd, n_embd)
            tensors[f"{blk}.{name}.bias"] = zeros(n_embd)
        for name in ("ln1", "ln2"):
            tensors[f"{blk}.{name}.weight"] = ones(n_embd)
            tensors[f"{blk}.{name}.bias"] = zeros(n_embd)
        tensors[f"{blk}.ffn_up.weight"] = weight(n_ff, n_embd)
        tensors[f"{blk}.ffn_up.bias"] = zeros(n_ff)
        tensors[f"{blk}.ffn_down.weight"] = weight(n_embd, n_ff)
        tensors[f"{blk}.ffn_down.bias"] = zeros(n_embd)
    for name, value in tensors.items():
        writer.add_tensor(name, value)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_audio_mmproj(path: Path, text_embd: int = GEMMA3_270M_EMBD, n_mel: int = 128,
                            n_embd: int = 32, n_head: int = 2, n_ff: int = 64, n_layer: int = 1,
                            seed: int = 29) -> Path:
    """A tiny `qwen2a` audio projector (a Whisper encoder and one projection, clip.cpp's
    keys and tensor names): 30 s of audio (mtmd pads to whole chunks) become 750 tokens."""
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5 / np.sqrt(shape[-1])).astype(np.float32)

    def vector(n: int, value: float) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name("tiny-qwen2a-mmproj")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_string("clip.projector_type", "qwen2a")
    writer.add_bool("clip.has_vision_encoder", False)
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_uint32("clip.audio.num_mel_bins", n_mel)
    writer.add_uint32("clip.audio.embedding_length", n_embd)
    writer.add_uint32("clip.audio.feed_forward_length", n_ff)
    writer.add_uint32("clip.audio.block_count", n_layer)
    writer.add_uint32("clip.audio.projection_dim", text_embd)
    writer.add_uint32("clip.audio.attention.head_count", n_head)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    tensors: dict[str, np.ndarray] = {
        # conv kernels ne [K, C_in, C_out], in f16 as Whisper's converters write them
        "a.conv1d.1.weight": weight(n_embd, n_mel, 3).astype(np.float16),
        "a.conv1d.1.bias": vector(n_embd, 0.0).reshape(n_embd, 1),
        "a.conv1d.2.weight": weight(n_embd, n_embd, 3).astype(np.float16),
        "a.conv1d.2.bias": vector(n_embd, 0.0).reshape(n_embd, 1),
        "a.position_embd.weight": weight(1500, n_embd),
        "a.post_ln.weight": vector(n_embd, 1.0),
        "a.post_ln.bias": vector(n_embd, 0.0),
        "mm.a.fc.weight": weight(text_embd, n_embd),
        "mm.a.fc.bias": vector(text_embd, 0.0),
    }
    for il in range(n_layer):
        blk = f"a.blk.{il}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{blk}.{name}.weight"] = weight(n_embd, n_embd)
            if name != "attn_k":  # Whisper's key projection has no bias
                tensors[f"{blk}.{name}.bias"] = vector(n_embd, 0.0)
        for name in ("ln1", "ln2"):
            tensors[f"{blk}.{name}.weight"] = vector(n_embd, 1.0)
            tensors[f"{blk}.{name}.bias"] = vector(n_embd, 0.0)
        tensors[f"{blk}.ffn_up.weight"] = weight(n_ff, n_embd)
        tensors[f"{blk}.ffn_up.bias"] = vector(n_ff, 0.0)
        tensors[f"{blk}.ffn_down.weight"] = weight(n_embd, n_ff)
        tensors[f"{blk}.ffn_down.bias"] = vector(n_embd, 0.0)
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.tiny_mmproj", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--text-embd", type=int, default=GEMMA3_270M_EMBD)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--audio", action="store_true",
                        help="an audio projector (qwen2a) instead of a vision one")
    args = parser.parse_args(argv)
    if args.audio:
        write_tiny_audio_mmproj(args.out, text_embd=args.text_embd)
    else:
        write_tiny_mmproj(args.out, text_embd=args.text_embd, image_size=args.image_size)
    print(args.out)


if __name__ == "__main__":
    main()
