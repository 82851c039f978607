"""The worker's drafters in llama.cpp's order of preference (llama.cpp's
common_speculative: begin, draft, accept).

Owns: which drafter drafts for a sequence (the first that proposes anything; the draft cut to
the slot's room), which one last drafted for it (its accept counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from worker.speculative.config import SpecConfig
from worker.speculative.draft_model import DraftModel, DraftSimple
from worker.speculative.ngram_cache import NgramCache, load_file
from worker.speculative.ngram_map import NgramMapK
from worker.speculative.ngram_mod import NgramMod
from worker.speculative.ngram_simple import NgramSimple


class DraftMode(Protocol):
    name: str
    n_max: int

    def begin(self, seq: int, prompt: list[int]) -> None: ...

    def draft(self, seq: int, prompt: list[int], id_last: int) -> list[int]: ...

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None: ...


def make_modes(config: SpecConfig, n_seq: int, draft: DraftModel | None = None,
               n_vocab_target: int = 0) -> list[DraftMode]:
    """The modes of `config`, in its order; draft-simple drafts with `draft` (the worker
    refuses draft-simple without one before anything loads: worker/runtime/flags.py)."""
    modes: list[DraftMode] = []
    for name in config.drafting:
        if name == "ngram-simple":
            modes.append(NgramSimple(config.ngram_simple))
        elif name in ("ngram-map-k", "ngram-map-k4v"):
            params = config.ngram_map_k if name == "ngram-map-k" else config.ngram_map_k4v
            modes.append(NgramMapK(params, name == "ngram-map-k", n_seq))
        elif name == "ngram-mod":
            modes.append(NgramMod(config.ngram_mod, n_seq))
        elif name == "ngram-cache":
            dynamic = config.lookup_cache_dynamic
            modes.append(NgramCache(
                n_seq,
                load_file(config.lookup_cache_static) if config.lookup_cache_static else None,
                load_file(dynamic, missing_ok=True) if dynamic else None, bool(dynamic)))
        elif name == "draft-simple" and draft is not None:
            modes.append(DraftSimple(draft, config.draft, n_seq, n_vocab_target))
    return modes


class Drafter:
    """common_speculative for the engine's slots (one sequence per slot)."""

    def __init__(self, config: SpecConfig, n_seq: int,
                 modes: list[DraftMode] | None = None, draft: DraftModel | None = None,
                 n_vocab_target: int = 0) -> None:
        self.config = config
        self.modes = make_modes(config, n_seq, draft, n_vocab_target) if modes is None \
            else modes
        self._last: list[DraftMode | None] = [None] * n_seq
        self.n_max = max((max(0, m.n_max) for m in self.modes), default=0)
        """common_speculative_n_max of the initialized modes (the per-position series)."""
        self.asks_model = False
        """The last `draft` asked the draft model (its draft comes with `model_drafts`)."""

    def begin(self, seq: int, prompt: list[int]) -> None:
        """A sequence's prompt is evaluated and its generation begins."""
        for mode in self.modes:
            mode.begin(seq, prompt)

    def draft(self, seq: int, prompt: list[int], id_last: int, n_max: int,
              p_min: float | None = None) -> list[int]:
        """The first mode's draft for the sequence (`prompt`: its tokens in the cache;
        `id_last`: its sampled token, not yet in the cache), at most `n_max` tokens; `p_min`:
        the request's least probability of a draft model's token (None: --spec-draft-p-min)."""
        self.asks_model = False
        for mode in self.modes:
            if isinstance(mode, DraftSimple):  # made with the step's others: model_drafts
                mode.ask(seq, prompt, id_last, n_max, p_min)
                self.asks_model = True
                return []
            drafted = mode.draft(seq, prompt, id_last)
            if drafted:
                if 0 < n_max < len(drafted):
                    drafted = drafted[:n_max]
                self._last[seq] = mode
                return drafted
        return []

    def model_drafts(self) -> dict[int, list[int]]:
        """The draft model's drafts asked for by `draft` this step, by sequence, made together
        (draft-simple is last in llama.cpp's order: the sequences no other mode drafted for)."""
        out: dict[int, list[int]] = {}
        for mode in self.modes:
            if isinstance(mode, DraftSimple):
                out = mode.run()
                for seq, drafted in out.items():
                    if drafted:
                        self._last[seq] = mode
        return out

    @property
    def ngram_cache(self) -> NgramCache | None:
        """The ngram-cache mode, when it is one of ours."""
        return next((m for m in self.modes if isinstance(m, NgramCache)), None)

    def learn(self, tokens: Sequence[int]) -> None:
        """A request left its slot with `tokens` in its cache (lookup decoding learns them)."""
        if (cache := self.ngram_cache) is not None:
            cache.learn(tokens)

    def accept(self, seq: int, n_accepted: int) -> None:
        mode = self._last[seq]
        if mode is None:
            return
        mode.accept(seq, n_accepted, False)
        for other in self.modes:
            if other is not mode:
                other.accept(seq, n_accepted, True)
