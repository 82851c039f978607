"""The endpoints a batch's lines may name (of scheduler/batches.py ENDPOINTS) and how each
runs: one job per line (api/batch/lines.py HANDLERS, the OpenAI family's own serving), or a
chunk's lines in one job (api/batch/embeddings.py). The /v1/batches routes check a new batch
against it; the batch driver, above the endpoint families, runs the lines by it."""

from __future__ import annotations

from scheduler.batches import ENDPOINTS

LINE_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
CHUNK_ENDPOINTS = ("/v1/embeddings",)
SERVED = tuple(e for e in ENDPOINTS if e in LINE_ENDPOINTS or e in CHUNK_ENDPOINTS)
"""In scheduler/batches.py's order, as a refused batch's message lists them."""
