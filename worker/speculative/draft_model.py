"""Speculative decoding with a draft model (--spec-type draft-simple, -md/--spec-draft-model):
llama.cpp's common_speculative_impl_draft_simple on llama.h's low-level bindings.

The draft model lives in the worker's process in a llama_context of its own, one sequence per
slot (the slot's id). A step's drafting slots draft together, greedily: each one's cache is
brought to the slot's tokens and the slot's sampled token (the longest common prefix kept, the
rest removed with llama_memory_seq_rm and the missing tokens decoded), then, one decode per
draft position for all the slots still drafting, each one's top token is taken while its
probability (the softmax of the 10 largest logits: llama.cpp's top-k 10 sampler) is at least
p_min, up to n_max tokens; a draft shorter than n_min is dropped. The draft's cache is cut back
to what the target accepted when the slot drafts next (the common prefix again), so it never
holds a rejected token the slot's tokens do not.

Owns: the draft model and its context (load, close), the vocabulary check
(common_speculative_are_compatible), the per-slot draft caches and the greedy draft.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as lc

from worker.speculative.config import DraftParams

log = logging.getLogger(__name__)

VOCAB_MAX_SIZE_DIFFERENCE = 128
"""SPEC_VOCAB_MAX_SIZE_DIFFERENCE: the most the two vocabularies' sizes may differ."""
VOCAB_CHECK_START_TOKEN_ID = 5
"""SPEC_VOCAB_CHECK_START_TOKEN_ID: tokens from this id on must have the same text."""
TOP_K = 10
"""The draft's sampler (llama.cpp's draft-simple: top-k 10, then the top token)."""


class DraftLoadError(RuntimeError):
    """The draft model or its context could not be created, or it cannot draft for the target."""


@dataclass(frozen=True)
class DraftPlan:
    """The draft context's layout: the target's (llama-server's
    common_base_params_to_speculative), with the draft's own KV types and threads."""

    n_ctx: int
    """The target context's size (the draft holds as many tokens per sequence)."""
    n_seq: int
    kv_unified: bool
    n_batch: int
    n_ubatch: int
    n_threads: int
    n_threads_batch: int
    type_k: int
    type_v: int
    """-ctkd/-ctvd as ggml types."""
    flash_attn_type: int


class DraftModel:
    """The draft model and its one context (blocking to build: call it off the event loop)."""

    def __init__(self, path: Path, plan: DraftPlan,
                 tune_model: Callable[[lc.llama_model_params], None]) -> None:
        mparams = lc.llama_model_default_params()
        tune_model(mparams)
        self.path = path
        self.plan = plan
        self.model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise DraftLoadError(f"failed to load draft model, '{path}'")
        self.vocab = lc.llama_model_get_vocab(self.model)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = plan.n_ctx
        cparams.n_batch = plan.n_batch
        cparams.n_ubatch = min(plan.n_ubatch, plan.n_batch)
        cparams.n_seq_max = plan.n_seq
        cparams.n_threads = plan.n_threads
        cparams.n_threads_batch = plan.n_threads_batch
        cparams.kv_unified = plan.kv_unified
        cparams.swa_full = True  # a slot's draft cache goes back to any prefix (see docs)
        cparams.flash_attn_type = plan.flash_attn_type
        cparams.type_k = plan.type_k
        cparams.type_v = plan.type_v
        cparams.no_perf = True
        cparams.embeddings = False
        cparams.n_outputs_max = plan.n_seq  # one row of logits per sequence (llama-server's)
        cparams.n_outputs_max_per_seq = 1
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            lc.llama_model_free(self.model)
            self.model = None
            raise DraftLoadError(f"failed to create a context for the draft model '{path}'")
        self.memory = lc.llama_get_memory(self.ctx)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.batch = lc.llama_batch_init(plan.n_batch, 0, 1)
        """The draft's decodes (the engine thread's alone)."""
        log.info("draft model %s loaded: n_ctx=%d, sequences=%d", path.name,
                 lc.llama_n_ctx(self.ctx), plan.n_seq)

    def close(self) -> None:
        if self.ctx:
            lc.llama_batch_free(self.batch)
            lc.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            lc.llama_model_free(self.model)
            self.model = None


def incompatibility(target: lc.llama_vocab_p, draft: lc.llama_vocab_p) -> str | None:
    """Why the draft cannot draft for the target (common_speculative_are_compatible), None when
    it can: the same vocabulary type, BOS and EOS rules, sizes within 128, and the same text
    for every token from id 5 on."""
    type_t, type_d = lc.llama_vocab_type(target), lc.llama_vocab_type(draft)
    if type_t != type_d:
        return ("draft model vocab type must match target model to use speculation but "
                f"vocab_type_dft = {type_d} while vocab_type_tgt = {type_t}")
    for what, add, token in (("bos", lc.llama_vocab_get_add_bos, lc.llama_vocab_bos),
                             ("eos", lc.llama_vocab_get_add_eos, lc.llama_vocab_eos)):
        add_t, add_d = bool(add(target)), bool(add(draft))
        if add_t != add_d or (add_t and token(target) != token(draft)):
            return (f"draft model {what} tokens must match target model to use speculation. "
                    f"add: {int(add_t)} - {int(add_d)}, id: {token(target)} - {token(draft)}")
    n_t, n_d = lc.llama_vocab_n_tokens(target), lc.llama_vocab_n_tokens(draft)
    if abs(n_t - n_d) > VOCAB_MAX_SIZE_DIFFERENCE:
        return ("draft model vocab must closely match target model to use speculation but "
                f"target vocab size {n_t} does not match draft vocab size {n_d} - difference "
                f"{abs(n_t - n_d)}, max allowed {VOCAB_MAX_SIZE_DIFFERENCE}")
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(n_t, n_d)):
        text_t, text_d = lc.llama_vocab_get_text(target, i), lc.llama_vocab_get_text(draft, i)
        if text_t != text_d:
            return ("draft model vocab must match target model to use speculation but token "
                    f"{i} content differs - target {text_t!r}, draft {text_d!r}")
    return None


@dataclass
class _Ask:
    """A queued draft: the sequence, its tokens and sampled token, its limits."""

    seq: int
    want: list[int]
    n_max: int
    p_min: float


def _put(batch: Any, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq
    batch.logits[i] = logits


class DraftSimple:
    """draft-simple for the engine's slots (a DraftMode of worker/speculative/drafter.py)."""

    name = "draft-simple"

    def __init__(self, model: DraftModel, params: DraftParams, n_seq: int,
                 n_vocab_target: int) -> None:
        self.model = model
        self.params = params
        self.n_max = params.n_max
        self.n_vocab_target = n_vocab_target
        self._cached: list[list[int]] = [[] for _ in range(n_seq)]
        """Per sequence, the tokens in the draft's cache, in position order."""
        self._asked: list[_Ask] = []
        lc.llama_memory_clear(model.memory, True)  # a new engine (a wake) starts empty

    def begin(self, seq: int, prompt: list[int]) -> None:
        """Nothing: the cache catches up with the prompt when the slot first drafts."""

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        """Nothing: the rejected tokens leave the cache when the slot drafts next."""

    def draft(self, seq: int, prompt: list[int], id_last: int) -> list[int]:
        """One sequence's draft alone (the engine asks for a step's drafts together:
        `ask` and `run`)."""
        self.ask(seq, prompt, id_last)
        return self.run().get(seq, [])

    def ask(self, seq: int, prompt: list[int], id_last: int, n_limit: int = 0,
            p_min: float | None = None) -> None:
        """Queue a draft of up to n_max tokens after `prompt` (the slot's tokens in the
        target's cache) and `id_last` (its sampled token), fewer when `n_limit` > 0 is smaller
        (the room the slot has: llama.cpp's dp.n_max); `p_min`: the request's own least
        probability (None: --spec-draft-p-min's)."""
        least = self.params.p_min if p_min is None else p_min
        n_max = self.params.n_max if n_limit <= 0 else min(self.params.n_max, n_limit)
        self._asked.append(_Ask(seq, [*prompt, id_last], n_max, least))

    def run(self) -> dict[int, list[int]]:
        """The queued drafts, by sequence, made together as llama.cpp's draft-simple makes
        them: each sequence's cache brought to its tokens but the last, then one decode per
        draft position for every sequence still drafting."""
        asked, self._asked = self._asked, []
        ready = [a for a in asked if a.n_max > 0 and self._catch_up(a, {b.seq for b in asked})]
        drafts: dict[int, list[int]] = {a.seq: [] for a in asked}
        entries = [(a, a.want[-1], len(a.want) - 1) for a in ready]
        while entries:
            if not self._decode_together(entries):
                break
            following = []
            for i, (ask, _, pos) in enumerate(entries):
                token, p = self._top(i)
                drafted = drafts[ask.seq]
                if p < ask.p_min or token >= self.n_vocab_target:
                    continue
                drafted.append(token)
                if len(drafted) < ask.n_max:
                    following.append((ask, token, pos + 1))
            entries = following
        return {seq: d if len(d) >= self.params.n_min else [] for seq, d in drafts.items()}

    def _catch_up(self, ask: _Ask, asking: set[int]) -> bool:
        """The sequence's cache: the common prefix with what is asked kept, the rest removed,
        the missing tokens but the last decoded (that one goes with the first draft step)."""
        want, cached = ask.want, self._cached[ask.seq]
        keep = min(_common_prefix(cached, want), len(want) - 1)
        if keep < len(cached):
            lc.llama_memory_seq_rm(self.model.memory, ask.seq, keep, -1)
            del cached[keep:]
        return self._decode(ask.seq, want[keep:-1], keep, asking)

    def _decode(self, seq: int, tokens: list[int], pos: int, asking: set[int]) -> bool:
        """`tokens` into the sequence's cache from `pos` on, in batches; when the cache has no
        room, the draft caches of the sequences not `asking` are dropped and it is tried once
        more; False (the sequence's cache emptied) when it still fails."""
        cached = self._cached[seq]
        n_batch = self.model.plan.n_batch
        done = 0
        retried = False
        while done < len(tokens):
            part = tokens[done:done + n_batch]
            batch = self.model.batch
            for i, token in enumerate(part):
                _put(batch, i, token, pos + done + i, seq, i == len(part) - 1)
            batch.n_tokens = len(part)
            rc = lc.llama_decode(self.model.ctx, batch)
            if rc == 1 and not retried:
                retried = True
                self._drop_others(asking)
                continue
            if rc != 0:
                self._failed(rc, [seq])
                return False
            cached.extend(part)
            done += len(part)
        return True

    def _decode_together(self, entries: list[tuple[_Ask, int, int]]) -> bool:
        """One token for each sequence (its logits on), in one decode."""
        batch = self.model.batch
        for i, (ask, token, pos) in enumerate(entries):
            _put(batch, i, token, pos, ask.seq, True)
        batch.n_tokens = len(entries)
        rc = lc.llama_decode(self.model.ctx, batch)
        if rc != 0:
            self._failed(rc, [ask.seq for ask, _, _ in entries])
            return False
        for ask, token, _ in entries:
            self._cached[ask.seq].append(token)
        return True

    def _failed(self, rc: int, seqs: list[int]) -> None:
        log.warning("the draft model's decode failed (%d) for slots %s: no draft", rc, seqs)
        for seq in seqs:
            lc.llama_memory_seq_rm(self.model.memory, seq, -1, -1)
            self._cached[seq].clear()

    def _drop_others(self, keep: set[int]) -> None:
        for other, tokens in enumerate(self._cached):
            if other not in keep and tokens:
                lc.llama_memory_seq_rm(self.model.memory, other, -1, -1)
                tokens.clear()

    def _top(self, index: int) -> tuple[int, float]:
        """The top token of the logits at batch `index` and its probability among the 10
        largest."""
        import numpy as np

        pointer = lc.llama_get_logits_ith(self.model.ctx, index)
        logits = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)),
                                       shape=(self.model.n_vocab,))
        k = min(TOP_K, len(logits))
        top = np.argpartition(logits, -k)[-k:]
        values = logits[top].astype(np.float64)
        best = int(np.argmax(values))
        p = 1.0 / float(np.sum(np.exp(values - values[best])))
        return int(top[best]), p


def _common_prefix(a: list[int], b: list[int]) -> int:
    if len(a) <= len(b) and b[:len(a)] == a:
        return len(a)
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
