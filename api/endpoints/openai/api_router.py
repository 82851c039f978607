"""llama-server's OpenAI-compatible endpoints, each with its aliases and wire model: text
completions (completions.py), chat completions with their token counting and control
(chat.py), the Responses API (responses.py). Wire models: protocol.py; rendering: render.py;
running the jobs of a request: context.py."""

from __future__ import annotations

from api.endpoints.openai.chat import (
    chat_completions,
    chat_input_tokens,
    control,
    responses_input_tokens,
)
from api.endpoints.openai.completions import completions
from api.endpoints.openai.protocol import (
    ChatCompletionRequest,
    ControlRequest,
    OpenAICompletionRequest,
)
from api.endpoints.openai.responses import responses
from api.routing import Routes

routes = Routes("openai")
routes.post("/v1/completions", body=OpenAICompletionRequest)(completions)
routes.post("/v1/chat/completions", "/chat/completions", body=ChatCompletionRequest)(
    chat_completions)
routes.post("/v1/chat/completions/control", body=ControlRequest)(control)
routes.post("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens",
            body=ChatCompletionRequest)(chat_input_tokens)
routes.post("/v1/responses", "/responses")(responses)
routes.post("/v1/responses/input_tokens", "/responses/input_tokens")(responses_input_tokens)
