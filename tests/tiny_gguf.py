"""A tiny llama-architecture GGUF written by the tests with the `gguf` package: random weights,
a real SentencePiece-style vocabulary (byte fallback, multi-byte pieces) and a chat template.
It decodes hundreds of tokens a second on a CPU, so tests can run thousands of requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] if message['content'] is string else '' }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = ("the", "a", "is", "of", "and", "to", "in", "it", "that", "was", "sky", "blue",
         "cat", "dog", "hello", "world", "once", "upon", "time", "there", "code", "def",
         "return", "json", "true", "false", "null", "name", "value")
PIECES = ("é", "ü", "日本", "語", "😀", "→", "ß", "ñ", "{", "}", "[", "]", ":", ",", "\"",
          "\n", ".", "!", "?", "0", "1", "2", "3")


DECISION_PIECES = (*(f"▁{c}" for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZbcdefghijklmnopqrstuvwxyz"),
                   *(f"▁{d}" for d in "0123456789"), "▁y", "▁ye", "▁yes", "▁n", "▁no",
                   "▁Y", "▁Ye", "▁Yes", "▁N", "▁No")
"""Single-token labels of the decision families (letters, digits, yes/no), for
`write_tiny_llama(extra_pieces=DECISION_PIECES)`."""


def vocabulary(control: tuple[str, ...] = (), extra_pieces: tuple[str, ...] = ()
               ) -> tuple[list[str], list[float], list[int]]:
    """`control`: more CONTROL tokens (e.g. `<tool_call>`), after the chat template's;
    `extra_pieces`: more normal tokens."""
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", *control]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
             gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
             *[gguf.TokenType.CONTROL] * len(control)]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    normal = list(dict.fromkeys([  # each piece once, in order
        "▁", *(chr(c) for c in range(ord("a"), ord("z") + 1)), *(f"▁{w}" for w in WORDS),
        *WORDS, *PIECES, *(f"▁{p}" for p in PIECES[:8]), *extra_pieces]))
    tokens += normal
    types += [gguf.TokenType.NORMAL] * len(normal)
    scores = [0.0] * (len(tokens) - len(normal)) + [-0.01 * i for i in range(len(normal))]
    return tokens, scores, [int(t) for t in types]


def write_tiny_llama(path: Path, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                     n_ff: int = 128, n_ctx: int = 4096, seed: int = 1234,
                     metadata: dict[str, str | float | int] | None = None,
                     control: tuple[str, ...] = (), chat_template: str = CHAT_TEMPLATE,
                     extra_pieces: tuple[str, ...] = (), n_expert: int = 0) -> Path:
    """`metadata`: more key-values (a str is written as a string, a float as float32, an int as
    uint32), e.g. llamaq's decision keys (scheduler/decision_meta.py); `control`: more CONTROL
    tokens in the vocabulary (as agent models mark `<tool_call>` or `<think>`);
    `extra_pieces`: more normal tokens (DECISION_PIECES); `n_expert` > 0: a Mixture of Experts
    (2 used a token), its FFN weights the expert tensors (`ffn_*_exps`) -cmoe/-ncmoe move."""
    tokens, scores, types = vocabulary(control, extra_pieces)
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5 / np.sqrt(shape[-1])).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    if n_expert:
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(2)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_sentencepiece_vocab(writer, (tokens, scores, types), chat_template)
    add_metadata(writer, metadata or {})
    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, n_embd) * 8)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        if n_expert:
            writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", weight(n_expert, n_embd))
            writer.add_tensor(f"blk.{i}.ffn_gate_exps.weight", weight(n_expert, n_ff, n_embd))
            writer.add_tensor(f"blk.{i}.ffn_up_exps.weight", weight(n_expert, n_ff, n_embd))
            writer.add_tensor(f"blk.{i}.ffn_down_exps.weight", weight(n_expert, n_embd, n_ff))
            continue
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_sentencepiece_vocab(writer: gguf.GGUFWriter,
                            vocab: tuple[list[str], list[float], list[int]],
                            chat_template: str = CHAT_TEMPLATE, eos: int = 2,
                            add_bos: bool = True) -> None:
    """The tokenizer keys of a `vocabulary()`: SentencePiece ("llama"), <unk> 0, <s> 1, the
    end of generation `eos`, no EOS appended, and the chat template."""
    tokens, scores, types = vocab
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(False)
    writer.add_chat_template(chat_template)


def add_metadata(writer: gguf.GGUFWriter, metadata: dict[str, Any]) -> None:
    """Key-value pairs of the model's metadata: strings, float32 or uint32 by value type."""
    for key, value in metadata.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)


def write_tiny_with_vocab_of(path: Path, source: Path, n_embd: int = 32, n_layer: int = 1,
                             n_head: int = 2, n_ff: int = 64, seed: int = 4321) -> Path:
    """A tiny llama-architecture GGUF with random weights and the tokenizer of `source` (every
    `tokenizer.ggml.*` key copied: its tokens, scores, types, special ids and BOS/EOS rules), so
    llama.cpp finds the two vocabularies compatible (a draft model that drafts badly). The
    embedding doubles as the output (no output.weight), in f16, to keep a 262k vocabulary
    small."""
    reader = gguf.GGUFReader(str(source))
    fields = {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.ggml.")}
    tokens = fields["tokenizer.ggml.tokens"].contents()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5 / np.sqrt(shape[-1])).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama-vocab-of-" + source.stem)
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, field in fields.items():
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(key, value)
        elif kind == gguf.GGUFValueType.BOOL:
            writer.add_bool(key, value)
        elif kind == gguf.GGUFValueType.UINT32:
            writer.add_uint32(key, value)
        elif kind == gguf.GGUFValueType.INT32:
            writer.add_int32(key, value)
        elif kind == gguf.GGUFValueType.FLOAT32:
            writer.add_float32(key, value)
    writer.add_tensor("token_embd.weight", (weight(n_vocab, n_embd) * 8).astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
