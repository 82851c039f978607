"""A LoRA adapter for Gemma 3 270M written by the tests with the `gguf` package: random
weights from a fixed seed on every layer's attn_q (numpy shapes (rank, 640) and (1024, rank)),
small enough to write in a moment and strong enough (scale ~0.05) to change greedy text.

    python -m tests.tiny_lora OUT.gguf [--seed N] [--task-name NAME]
    python -m tests.tiny_lora --control-vector OUT.gguf [--seed N]

and a control vector the same way (`direction.N` for every layer N >= 1, 640 floats each).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

GEMMA3_270M = {"n_layer": 18, "n_embd": 640, "n_q": 1024}
"""Gemma 3 270M's shapes: layers, embedding width, attn_q output width (4 heads x 256)."""
DEFAULT_SEED = 21
RANK = 8
WEIGHT_SCALE = 0.05


def write_lora(path: Path, seed: int = DEFAULT_SEED, task_name: str = "",
               prompt_prefix: str = "", alpha: float = float(RANK),
               invocation_tokens: tuple[int, ...] = ()) -> Path:
    """The adapter at `path`: the same file for the same seed; `invocation_tokens` make it an
    aLoRA (applied from their last occurrence in a prompt on, as llama.cpp reads
    `adapter.alora.invocation_tokens`)."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    if task_name:
        writer.add_string("adapter.lora.task_name", task_name)
    if prompt_prefix:
        writer.add_string("adapter.lora.prompt_prefix", prompt_prefix)
    if invocation_tokens:
        writer.add_key_value("adapter.alora.invocation_tokens", list(invocation_tokens),
                             gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT32)
    shape = GEMMA3_270M
    for layer in range(shape["n_layer"]):
        a = rng.normal(0.0, WEIGHT_SCALE, (RANK, shape["n_embd"])).astype(np.float32)
        b = rng.normal(0.0, WEIGHT_SCALE, (shape["n_q"], RANK)).astype(np.float32)
        writer.add_tensor(f"blk.{layer}.attn_q.weight.lora_a", a)
        writer.add_tensor(f"blk.{layer}.attn_q.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_control_vector(path: Path, seed: int = DEFAULT_SEED, scale: float = 0.5) -> Path:
    """A control vector for Gemma 3 270M at `path`: the same file for the same seed."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", "gemma3")
    writer.add_uint32("controlvector.layer_count", GEMMA3_270M["n_layer"] - 1)
    for layer in range(1, GEMMA3_270M["n_layer"]):
        direction = rng.normal(0.0, scale, GEMMA3_270M["n_embd"]).astype(np.float32)
        writer.add_tensor(f"direction.{layer}", direction)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--task-name", default="")
    parser.add_argument("--invocation-tokens", default="",
                        help="comma-separated token ids: write an aLoRA")
    parser.add_argument("--control-vector", action="store_true",
                        help="write a control vector instead of a LoRA adapter")
    args = parser.parse_args()
    if args.control_vector:
        print(write_control_vector(args.out, args.seed))
    else:
        tokens = tuple(int(t) for t in args.invocation_tokens.split(",") if t)
        print(write_lora(args.out, args.seed, args.task_name, invocation_tokens=tokens))


if __name__ == "__main__":
    main()
