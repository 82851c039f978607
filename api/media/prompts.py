"""`/completion` prompts with `multimodal_data` (`{prompt_string, multimodal_data: [base64]}`):
their media read into the jobs, each prompt's media for its own jobs."""

from __future__ import annotations

from api.media.refs import refs_of
from api.media.sources import decode_base64
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.media import MAX_MEDIA_ITEMS
from scheduler.registry import ModelMeta
from storage.base import ObjectStore

NO_PROJECTOR = "Multimodal data provided, but model does not support multimodal requests."
"""llama-server's words (a 400 here: the request is wrong for this model)."""


async def attach_prompt_media(jobs: list[CompletionJob], media: list[list[str]], n_cmpl: int,
                              meta: ModelMeta | None, store: ObjectStore) -> None:
    """`jobs` are prompt-major (`n_cmpl` per prompt), `media` one list per prompt."""
    if not any(media):
        return
    if meta is None or not meta.takes_media():
        raise InvalidRequest(NO_PROJECTOR)
    for index, items in enumerate(media):
        if not items:
            continue
        if len(items) > MAX_MEDIA_ITEMS:
            raise InvalidRequest(f"too many media items: {len(items)} (at most "
                                 f"{MAX_MEDIA_ITEMS})")
        refs = await refs_of([decode_base64(item) for item in items], store)
        for job in jobs[index * n_cmpl:(index + 1) * n_cmpl]:
            if not isinstance(job.prompt, str):
                raise InvalidRequest("multimodal_data needs a prompt_string")
            job.media = refs
            job.media_marker = meta.media_marker
