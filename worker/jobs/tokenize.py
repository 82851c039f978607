"""The bodies of tokenize and detokenize jobs: the model's vocabulary only, in a thread (a big
body must not starve the loop that renews leases)."""

from __future__ import annotations

import asyncio

from scheduler.contract.jobs import DetokenizeJob, TokenizeJob
from scheduler.contract.results import DetokenizeResult, TokenizeResult, TokenPiece
from worker.jobs.parts import WorkerParts
from worker.runtime.vocab import Vocab


async def run(parts: WorkerParts, job: TokenizeJob | DetokenizeJob) -> None:
    vocab = parts.model.vocab
    if isinstance(job, TokenizeJob):
        parts.final(job.job_id, await asyncio.to_thread(tokenize, vocab, job))
        return
    content = await asyncio.to_thread(vocab.detokenize, [t for t in job.tokens if vocab.valid(t)])
    parts.final(job.job_id, DetokenizeResult(content=content))


def tokenize(vocab: Vocab, job: TokenizeJob) -> TokenizeResult:
    ids = vocab.tokenize(job.content, job.add_special, job.parse_special)
    tokens: list[int] | list[TokenPiece] = ids
    if job.with_pieces:  # each distinct token's piece read once: a call each releases the
        # GIL, and 40,000 of them starved the loop that renews leases past the lease (4 s)
        pieces = {t: _piece_json(vocab.piece(t, True)) for t in set(ids)}
        tokens = [TokenPiece(id=t, piece=pieces[t]) for t in ids]
    return TokenizeResult(tokens=tokens)


def _piece_json(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)
