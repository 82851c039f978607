"""Preserved tokens (llama-server's `preserved_tokens`): a template's special tokens that mark
tool calls or reasoning reach the chat parser as text, although the vocabulary marks them
CONTROL and a plain detokenization leaves them out. The engine in-process on a tiny GGUF whose
vocabulary has `<tool_call>`, `</tool_call>`, `<think>` and `</think>` as CONTROL tokens; a
grammar makes the random model write them."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest

from api.chat.prepare import ChatRequest, PreparedChat, prepare_chat
from api.settings import ApiSettings
from scheduler.contract.jobs import CompletionJob, SamplingParams, SamplingSettings
from scheduler.contract.results import CompletionResult, ErrorEvent, FinalEvent, TokenEvent
from scheduler.registry import ModelMeta
from tests.tiny_gguf import write_tiny_llama
from worker.engine.loop import Engine, JobEvent
from worker.engine.requests import EngineDefaults
from worker.runtime.model import ContextPlan, LoadedModel

CONTROL = ("<tool_call>", "</tool_call>", "<think>", "</think>")
HERMES_TEMPLATE = (  # chatml with Hermes tool calls: the generic format, `<tool_call>` blocks
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if tools %}Call tools as <tool_call>{json}</tool_call>.{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS = [{"type": "function", "function": {
    "name": "get", "description": "get a thing",
    "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    path = write_tiny_llama(tmp_path_factory.mktemp("control") / "control.gguf",
                            control=CONTROL, chat_template=HERMES_TEMPLATE)
    plan = ContextPlan(n_ctx=1024, n_slots=1, kv_unified=False, n_batch=256, n_ubatch=256,
                       n_threads=1, n_threads_batch=1, swa_full=True, flash_attn="auto",
                       cache_type_k="f16", cache_type_v="f16")
    loaded = LoadedModel(path, plan)
    yield loaded
    loaded.close()


def run(model: LoadedModel, job: CompletionJob) -> str:
    """The text of one job: its token events' (streamed) or its final content (not)."""
    events: queue.Queue[JobEvent] = queue.Queue()

    def sink(batch: list[JobEvent]) -> None:
        for event in batch:
            events.put(event)

    engine = Engine(model, EngineDefaults(
        sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0, cache_prompt=False,
        special=False, model_alias="tiny", worker_id="w-test"), sink)
    engine.start()
    try:
        engine.submit(engine.prepare(job))
        streamed = ""
        while True:
            _, event = events.get(timeout=60)
            if isinstance(event, TokenEvent):
                streamed += event.content
            if isinstance(event, ErrorEvent):
                raise AssertionError(event)
            if isinstance(event, FinalEvent):
                assert isinstance(event.result, CompletionResult)
                return streamed if job.stream else event.result.content
    finally:
        engine.stop()


def ids(model: LoadedModel) -> dict[str, int]:
    vocab = model.vocab
    found = {t: vocab.tokenize(t, add_special=False, parse_special=True) for t in CONTROL}
    assert all(len(v) == 1 for v in found.values())
    return {t: v[0] for t, v in found.items()}


def prepared_chat(model: LoadedModel) -> PreparedChat:
    meta = ModelMeta(vocab_type=1, n_vocab=model.vocab.n_tokens, n_ctx_train=1024, n_embd=64,
                     n_params=1, size=1, chat_template=HERMES_TEMPLATE, bos_token="<s>",
                     eos_token="</s>")
    return prepare_chat(ApiSettings.from_args(["--jinja"], environ={}), meta, ChatRequest(
        messages=[{"role": "user", "content": "the cat"}], tools=TOOLS, tool_choice=None))


def chat_job(model: LoadedModel, prepared: PreparedChat, preserved: list[str],
             stream: bool) -> CompletionJob:
    tok = ids(model)
    grammar = (f'root ::= "ok " <[{tok["<think>"]}]> "hm" <[{tok["</think>"]}]> '
               f'<[{tok["<tool_call>"]}]> "{{\\"name\\":\\"get\\",\\"arguments\\":{{\\"a\\":'
               f'\\"b\\"}}}}" <[{tok["</tool_call>"]}]>')
    return CompletionJob(model="tiny", prompt=prepared.prompt, n_predict=64, stream=stream,
                         grammar=grammar, sampling=SamplingParams(temperature=0.0),
                         preserved_tokens=preserved)


def test_the_vocabulary_marks_them_control(model: LoadedModel) -> None:
    vocab = model.vocab
    for text, token in ids(model).items():
        assert vocab.piece(token, special=False) == b""  # what -sp off writes: nothing
        assert vocab.piece(token, special=True) == text.encode()
    assert vocab.single_tokens([*CONTROL, "not one token", "<tool"]) == frozenset(
        ids(model).values())


@pytest.mark.parametrize("stream", [True, False])
def test_preserved_tokens_reach_the_parser(model: LoadedModel, stream: bool) -> None:
    prepared = prepared_chat(model)
    assert {"<tool_call>", "</tool_call>", "<think>", "</think>"} <= set(
        prepared.preserved_tokens)
    content = run(model, chat_job(model, prepared, prepared.preserved_tokens, stream))
    expected = 'ok <think>hm</think><tool_call>{"name":"get","arguments":{"a":"b"}}</tool_call>'
    assert content == expected
    message = prepared.parse(content)
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("get", '{"a":"b"}')]
    assert message.content == 'ok <think>hm</think>'  # a think block only opens the answer


@pytest.mark.parametrize("stream", [True, False])
def test_without_preserved_tokens_the_markers_are_lost(model: LoadedModel, stream: bool) -> None:
    """What the worker wrote before: the call is plain text and no tool call is found."""
    prepared = prepared_chat(model)
    content = run(model, chat_job(model, prepared, [], stream))
    assert content == 'ok hm{"name":"get","arguments":{"a":"b"}}'
    assert prepared.parse(content).tool_calls == []
