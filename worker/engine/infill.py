"""Fill-in-the-middle prompts, laid out as llama-server's format_prompt_infill does."""

from __future__ import annotations

from typing import Protocol

from scheduler.contract.errors import NotSupported
from scheduler.contract.jobs import InfillParts, PromptPiece

CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


class FimVocab(Protocol):
    add_bos: bool
    bos: int

    def fim_tokens(self) -> dict[str, int]: ...

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]: ...


def infill_tokens(vocab: FimVocab, parts: InfillParts, prompt: list[int], n_batch: int,
                  n_predict: int, n_ctx: int, spm: bool) -> list[int]:
    """[FIM_REP]myproject [FIM_SEP]file extra… [FIM_SEP]filename [FIM_PRE]prefix [FIM_SUF]suffix
    [FIM_MID]prompt, trimmed to fit: prefix:suffix 3:1 of a batch, extra chunks in the rest."""
    fim = vocab.fim_tokens()
    missing = [f"{name} token is missing." for name, key in
               (("prefix", "pre"), ("suffix", "suf"), ("middle", "mid")) if key not in fim]
    if missing:
        raise NotSupported("Infill is not supported by this model: " + " ".join(missing) + " ")

    def text(value: str | list[PromptPiece]) -> list[int]:
        pieces = [value] if isinstance(value, str) else value
        out: list[int] = []
        for piece in pieces:
            out.extend(vocab.tokenize(piece, False, False) if isinstance(piece, str) else [piece])
        return out

    extra: list[int] = []
    if "rep" in fim:
        extra += [fim["rep"], *vocab.tokenize("myproject\n", False, False)]
    for chunk in parts.input_extra:
        if "sep" in fim:
            extra += [fim["sep"], *vocab.tokenize(chunk.filename + "\n", False, False)]
        else:
            extra += vocab.tokenize(CHUNK_SEPARATOR, False, False)
        extra += vocab.tokenize(chunk.text, False, False)
    if "sep" in fim:
        extra += [fim["sep"], *vocab.tokenize("filename\n", False, False)]

    prefix, suffix = text(parts.input_prefix), text(parts.input_suffix)
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))
    prefix = [fim["pre"], *prefix[len(prefix) - n_prefix:], *prompt]
    suffix = [fim["suf"], *suffix[:n_suffix]]
    first, second = (suffix, prefix) if spm else (prefix, suffix)
    if vocab.add_bos:
        first = [vocab.bos, *first]
    return [*extra[len(extra) - n_extra:], *first, *second, fim["mid"]]
