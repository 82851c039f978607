"""POST /apply-template: the prompt a chat request would give the model, without inference."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import parse_body
from api.chat.templates import ChatTemplate, template_kwargs
from api.fleet import Fleet
from api.router import request_model, request_settings
from api.routing import Routes
from scheduler.contract.errors import InvalidRequest

routes = Routes("templates")


class ApplyTemplateRequest(BaseModel):
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
    fleet: Fleet = request.app.ctx.fleet
    workers = await fleet.placement.workers(request_model(request))
    if body.continue_final_message and body.add_generation_prompt:
        raise InvalidRequest("Cannot set both add_generation_prompt and continue_final_message "
                             "to true.")
    continue_final = body.continue_final_message
    if continue_final is None and not settings.prefill_assistant:
        continue_final = False
    template = ChatTemplate.for_model(settings, workers[0].meta)
    prompt = template.render(
        body.messages, tools=body.tools, add_generation_prompt=body.add_generation_prompt,
        extra_context=template_kwargs(settings, body.chat_template_kwargs,
                                      body.reasoning_effort),
        continue_final_message=continue_final)
    return json({"prompt": prompt})
