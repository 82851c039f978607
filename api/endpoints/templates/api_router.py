"""POST /apply-template: the prompt a chat request would give the model, without inference."""

from __future__ import annotations

from typing import Any

from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import parse_body
from api.chat.messages import validate_messages
from api.chat.prepare import media_input
from api.chat.templates import ChatTemplate, template_kwargs
from api.media.sources import MediaAccess, media_access, media_bytes
from api.routing import Routes
from api.services import request_model, request_settings, services
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest
from scheduler.registry import ModelMeta

routes = Routes("templates")


class ApplyTemplateRequest(DeferredModel):
    """The chat part of a /v1/chat/completions body (other fields are ignored, as there)."""

    messages: list[Any]
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool | None = None


@routes.post("/apply-template", body=ApplyTemplateRequest)
async def apply_template(request: Request) -> HTTPResponse:
    body = parse_body(request, ApplyTemplateRequest)
    settings = request_settings(request)
    fleet = services(request).fleet
    workers = await fleet.placement.workers(request_model(request))
    if body.continue_final_message and body.add_generation_prompt:
        raise InvalidRequest("Cannot set both add_generation_prompt and continue_final_message "
                             "to true.")
    continue_final = body.continue_final_message
    if continue_final is None and not settings.prefill_assistant:
        continue_final = False
    template = ChatTemplate.for_model(settings, workers[0].meta)
    messages = await _media_as_markers(body.messages, workers[0].meta, media_access(settings))
    prompt = template.render(
        messages, tools=body.tools, add_generation_prompt=body.add_generation_prompt,
        extra_context=template_kwargs(settings, body.chat_template_kwargs,
                                      body.reasoning_effort),
        continue_final_message=continue_final)
    return json({"prompt": prompt})


async def _media_as_markers(messages: list[Any], meta: ModelMeta,
                            access: MediaAccess) -> list[Any]:
    """With a projector, media parts become the media marker (llama-server loads the media
    too, so a bad URL or file fails here as in a chat request); without one, the template's
    checks answer (a 500 for media, api/chat/template_messages.py)."""
    media = media_input(meta)
    if media is None or not any(_has_media(m) for m in messages):
        return messages
    checked = validate_messages(messages, media=media)
    for source in media.sources:
        await media_bytes(source, access)
    return checked


def _has_media(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(
        isinstance(p, dict) and p.get("type") not in (None, "text") for p in content)
