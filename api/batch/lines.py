"""One line of a batch: run as the same request sent online without `stream` would run (same
parsing, templates, limits, jobs and rendering), on the model's batch queue, and written as
OpenAI's batch output line `{"id", "custom_id", "response": {"status_code", "request_id",
"body"}, "error"}`."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from api.batch.input import BatchLine
from api.endpoints.openai.chat import batch_chat_completion
from api.endpoints.openai.completions import batch_completion
from api.endpoints.openai.context import OpenAIContext
from scheduler.contract.errors import LlamaqError, RedisUnreachable, ServerError, Unavailable

log = logging.getLogger(__name__)

LineHandler = Callable[[OpenAIContext, dict[str, Any]], Awaitable[dict[str, Any]]]
HANDLERS: dict[str, LineHandler] = {
    "/v1/completions": batch_completion,
    "/v1/chat/completions": batch_chat_completion,
}
"""What runs a line of each endpoint a batch runs one job per line (LINE_ENDPOINTS of
api/endpoints/batches/served.py); its CHUNK_ENDPOINTS run a chunk's lines together
(api/batch/embeddings.py)."""
RETRIES = 3
"""A line whose run ended with 503 (its worker died after it sent something, no answer within
the timeout) runs again, as a new job, this many times before it fails."""
RETRY_PAUSE_S = 1.0
REDIS_PAUSE_S = 1.0
REDIS_WAIT_MAX_S = 600.0
"""A line whose Redis is away waits for it (a blip is not a failed line) this long at most."""


@dataclass(frozen=True)
class LineResult:
    ok: bool
    text: str
    """The output line (JSON, no newline)."""


def output_line(custom_id: str, status: int, body: Any) -> str:
    return json.dumps({
        "id": "batch_req_" + secrets.token_hex(12),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": secrets.token_hex(16), "body": body},
        "error": None,
    }, separators=(",", ":"), ensure_ascii=False)


def unrun_line(custom_id: str, code: str, message: str) -> str:
    """A line that never ran (the batch expired first): no response, an error."""
    return json.dumps({
        "id": "batch_req_" + secrets.token_hex(12),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }, separators=(",", ":"), ensure_ascii=False)


async def run_line(context: OpenAIContext, endpoint: str, line: BatchLine) -> LineResult:
    handler = HANDLERS[endpoint]
    attempt = 0
    redis_away_since: float | None = None
    while True:
        try:
            body = await handler(context, line.body)
        except (RedisError, RedisUnreachable) as error:  # a blip: the line waits, not fails
            redis_away_since = redis_away_since or time.monotonic()
            if time.monotonic() - redis_away_since > REDIS_WAIT_MAX_S:
                return failed_line(line, RedisUnreachable())
            log.warning("batch line %s: Redis away (%s); trying again", line.custom_id, error)
            await asyncio.sleep(REDIS_PAUSE_S)
            continue
        except Unavailable as error:
            if attempt < RETRIES:
                attempt += 1
                log.warning("batch line %s: %s; running it again", line.custom_id,
                            error.message)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            return failed_line(line, error)
        except LlamaqError as error:
            return failed_line(line, error)
        except Exception as error:  # a bug must fail the line, not the whole batch
            log.exception("batch line %s failed", line.custom_id)
            return failed_line(line, ServerError(f"internal error: {type(error).__name__}"))
        return LineResult(True, output_line(line.custom_id, 200, body))


def failed_line(line: BatchLine, error: LlamaqError) -> LineResult:
    return LineResult(False, output_line(line.custom_id, error.status,
                                         {"error": error.to_info().to_wire()}))
