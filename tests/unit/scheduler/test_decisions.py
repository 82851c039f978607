"""The decision parts that need no model: the label trie and its readout, the confidence
formulas and the response, the wire checks, the prompt split, llamaq's GGUF decision keys read
offline, and the job contract."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from pydantic import ValidationError

from api.chat.templates import ChatTemplate
from api.endpoints.systemone.prompt import decision_job
from api.endpoints.systemone.protocol import SystemOneRequest
from api.endpoints.systemone.render import choice_confidence, score_confidence, systemone_json
from scheduler.contract.errors import ExceedContextSize, InvalidRequest
from scheduler.contract.jobs import DecisionJob, DecisionQuestion, JobKind, parse_job
from scheduler.contract.kinds import queue_for
from scheduler.contract.limits import check_decision
from scheduler.contract.results import DecisionAnswer, DecisionResult
from scheduler.decision_meta import (
    DecisionCaps,
    DecisionMetaError,
    file_output_modalities,
    native_caps,
)
from scheduler.gguf_meta import GgufError, read_metadata
from tests.tiny_gguf import add_metadata
from worker.decisions.plan import (
    QuestionPlan,
    branches_of,
    child_logprobs,
    label_scores,
    label_trie,
    plan_decision,
    restricted_softmax,
)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def question(labels: list[list[int]], temperature: float = 1.0) -> QuestionPlan:
    return QuestionPlan(id="q", type="choice", suffix=[9], labels=labels,
                        branches=branches_of(labels), temperature=temperature,
                        children=label_trie(labels))


def test_branches_cover_every_inner_node_once() -> None:
    labels = [[1], [1, 2], [1, 3, 4], [5, 6], [7]]
    assert branches_of(labels) == [[1, 3], [5]]  # [1] lies on the path [1, 3]
    assert branches_of([[1], [2], [3]]) == []  # single tokens: the suffix's logits suffice
    assert label_trie(labels)[()] == {1, 5, 7}
    assert label_trie(labels)[(1,)] == {2, 3}


def test_labels_are_scored_as_whole_sequences_and_told_apart() -> None:
    """"light" (a prefix of the others) gets only the mass of not going on to blue/green."""
    light, blue, green, dark, red = 1, 2, 3, 4, 5
    plan = question([[light, blue], [light, green], [dark, red], [light]])
    logprobs = {(): {light: math.log(0.6), dark: math.log(0.3)},
                (light,): {blue: math.log(0.5), green: math.log(0.25)},
                (dark,): {red: math.log(0.8)}}
    scores = [math.exp(s) for s in label_scores(plan, logprobs)]
    assert scores == pytest.approx([0.3, 0.15, 0.24, 0.6 * 0.25])
    probabilities = restricted_softmax(label_scores(plan, logprobs))
    assert sum(probabilities) == pytest.approx(1, abs=1e-12)
    assert probabilities == pytest.approx([s / sum(scores) for s in scores])


def test_the_temperature_scales_the_restricted_softmax() -> None:
    scores = [math.log(0.7), math.log(0.2), math.log(0.1)]
    flat = restricted_softmax(scores, 2.0)
    weights = [p ** 0.5 for p in (0.7, 0.2, 0.1)]
    assert flat == pytest.approx([w / sum(weights) for w in weights])
    assert restricted_softmax([-math.inf, -math.inf]) == [0.5, 0.5]
    assert restricted_softmax([0.0, -math.inf]) == [1.0, 0.0]


def test_child_logprobs_use_the_full_vocabulary() -> None:
    row = np.array([0.0, 1.0, 2.0, 3.0], dtype=np.float32)
    got = child_logprobs(row, {1, 3})
    total = math.log(sum(math.exp(v) for v in (0.0, 1.0, 2.0, 3.0)))
    assert got == pytest.approx({1: 1.0 - total, 3: 3.0 - total})


class WordVocab:
    """Whitespace tokens: enough to plan without a model."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return ([0] if add_special else []) + [self.ids.setdefault(w, len(self.ids) + 1)
                                              for w in text.split()]


def job(labels: list[str], qtype: str = "choice", suffix: str = "which ?") -> DecisionJob:
    return DecisionJob(model="m", prefix="the state", questions=[
        DecisionQuestion(id="q", type=qtype, suffix=suffix, labels=labels)])  # type: ignore[arg-type]


def test_planning_checks_what_needs_the_vocabulary_and_the_model() -> None:
    caps = DecisionCaps(mode="native", types=["choice"], max_options=3,
                        temperatures={"choice": 2.0})
    plan = plan_decision(job(["a b", "a c", "d"]), WordVocab(), caps, 64)
    assert plan.prefix == [0, 1, 2] and plan.questions[0].temperature == 2.0
    assert plan.questions[0].branches == [[plan.questions[0].labels[0][0]]]
    with pytest.raises(InvalidRequest, match="at most 3"):
        plan_decision(job(["a", "b", "c", "d"]), WordVocab(), caps, 64)
    with pytest.raises(InvalidRequest, match="does not answer noul"):
        plan_decision(job(["yes", "no"], "noul"), WordVocab(), caps, 64)
    with pytest.raises(InvalidRequest, match="same tokens"):
        plan_decision(job(["a  b", "a b"]), WordVocab(), caps, 64)
    with pytest.raises(InvalidRequest, match="no tokens"):
        plan_decision(job(["a", " "]), WordVocab(), caps, 64)
    with pytest.raises(ExceedContextSize, match="context size"):
        plan_decision(job(["a"], suffix="x " * 70), WordVocab(), caps, 64)


def test_confidence_is_zero_for_a_uniform_distribution() -> None:
    assert choice_confidence([1 / 3] * 3) == pytest.approx(0)
    assert score_confidence([0.25] * 4) == pytest.approx(0)
    assert choice_confidence([1.0, 0.0]) == 1.0 and score_confidence([0.0, 1.0, 0.0]) == 1.0
    # the spec's examples
    assert choice_confidence([0.9998, 0.0001, 0.0001]) == pytest.approx(0.9997, abs=1e-4)
    assert score_confidence([0.0023, 0.116, 0.6753, 0.2064]) == pytest.approx(0.673, abs=1e-3)


EXAMPLE: dict[str, Any] = {
    "state": {"customer": "I was charged twice"},
    "questions": {
        "route": {"type": "choice", "instructions": "Which team?",
                  "criteria": {"billing": "money", "shipping": None}},
        "angry": {"type": "noul", "instructions": "Angry?", "criteria": {"true": "shouting"}},
        "urgency": {"type": "score", "instructions": ["How", "urgent?"],
                    "criteria": ["later", "today", "now"]},
    },
}


def test_the_response_has_the_specs_shape() -> None:
    body = SystemOneRequest.model_validate(EXAMPLE)
    result = DecisionResult(worker_id="w", model="m", n_prefix_tokens=10, prefix_cached=0,
                            tokens_decoded=40, answers=[
                                DecisionAnswer(id="route", probabilities=[0.75, 0.25],
                                               n_prompt_tokens=20),
                                DecisionAnswer(id="angry", probabilities=[0.6, 0.4],
                                               n_prompt_tokens=15),
                                DecisionAnswer(id="urgency", probabilities=[0.2, 0.3, 0.5],
                                               n_prompt_tokens=25)])
    data = systemone_json(body, result, "m")
    assert data["usage"] == {"input_tokens": 60, "output_tokens": 0}
    assert data["answers"]["route"] == {"type": "choice", "choice": "billing",
                                        "probabilities": {"billing": 0.75, "shipping": 0.25},
                                        "confidence": pytest.approx(0.5)}
    assert data["answers"]["angry"] == {"type": "noul", "noul": 0.6}
    urgency = data["answers"]["urgency"]
    assert urgency["score"] == pytest.approx(1.3)
    assert urgency["legend"] == {"0": "later", "1": "today", "2": "now"}
    assert urgency["probabilities"] == {"0": 0.2, "1": 0.3, "2": 0.5}


@pytest.mark.parametrize("template", [None, ChatTemplate("model", CHATML)])
def test_the_prompt_splits_into_a_shared_prefix_and_suffixes(
        template: ChatTemplate | None) -> None:
    body = SystemOneRequest.model_validate(EXAMPLE)
    decision = decision_job(body, template, "m", {})
    assert json.dumps(EXAMPLE["state"]) in decision.prefix  # not a string: as JSON text
    lead = " " if template is None else ""
    by_id = {q.id: q for q in decision.questions}
    assert by_id["route"].labels == [lead + "billing", lead + "shipping"]
    assert by_id["angry"].labels == [lead + "yes", lead + "no"]
    assert by_id["urgency"].labels == [lead + "0", lead + "1", lead + "2"]
    assert "billing: money" in by_id["route"].suffix and "yes means: shouting" in \
        by_id["angry"].suffix
    for q in decision.questions:
        assert "Question:" in q.suffix and "Question:" not in decision.prefix
    if template is not None:
        assert by_id["route"].suffix.endswith("<|im_start|>assistant\n")
    else:
        assert by_id["route"].suffix.endswith("\nAnswer:")


def data_url(payload: bytes = b"x") -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(payload).decode()


@pytest.mark.parametrize("change", [
    {"questions": {}},
    {"questions": {"q": {"type": "maybe", "instructions": "?"}}},
    {"questions": {"q": {"type": "score", "instructions": "?", "criteria": ["one"]}}},
    {"questions": {"q": {"type": "score", "instructions": "?",
                         "criteria": [str(i) for i in range(11)]}}},
    {"questions": {"q": {"type": "choice", "instructions": "?",
                         "criteria": {f"o{i}": None for i in range(256)}}}},
    {"questions": {"q": {"type": "choice", "instructions": "?", "criteria": {" ": None}}}},
    {"questions": {"q": {"type": "noul", "instructions": "?", "criteria": {"maybe": "x"}}}},
    {"questions": {f"q{i}": {"type": "noul", "instructions": "?"} for i in range(257)}},
    {"files": ["https://example.com/x.png"]},
    {"images": ["data:image/png;base64,@@@"]},
    {"images": ["data:image/png,plain"]},
    {"state": [{"role": "user", "content": [{"type": "image_url",
                                             "image_url": {"url": "file:///etc/passwd"}}]}]},
    {"state": "x" * (1 << 20)},
])
def test_invalid_requests_are_refused(change: dict[str, Any]) -> None:
    body = {**EXAMPLE, **change}
    with pytest.raises(ValidationError):
        SystemOneRequest.model_validate(body)


def test_media_come_from_files_images_and_the_states_messages() -> None:
    body = SystemOneRequest.model_validate({
        **EXAMPLE, "files": [data_url(b"a")], "images": [data_url(b"b")],
        "state": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": data_url(b"c")}}]}]}})
    assert body.media() == [data_url(b"a"), data_url(b"b"), data_url(b"c")]
    assert SystemOneRequest.model_validate(EXAMPLE).media() == []


def test_decision_jobs_have_a_kind_and_a_slot_queue_of_their_own() -> None:
    decision = job(["a", "b"])
    parsed = parse_job(json.loads(decision.model_dump_json()), JobKind.DECISION)
    assert parsed == decision and parsed.kind is JobKind.DECISION
    assert queue_for(decision) == queue_for(DecisionJob(model="m", prefix="x", questions=[
        DecisionQuestion(id="q", type="noul", suffix="s", labels=["yes", "no"])]))
    check_decision(decision)
    with pytest.raises(InvalidRequest, match="too long"):
        check_decision(job(["a"], suffix="x" * (1 << 20)))


def write_gguf(path: Path, metadata: dict[str, Any]) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["<unk>", "a", "b"])
    add_metadata(writer, metadata)
    writer.add_tensor("x", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_native_decision_models_are_recognized_offline(tmp_path: Path) -> None:
    native = write_gguf(tmp_path / "native.gguf", {
        "llamaq.decision.types": "choice, noul", "llamaq.decision.temperature.choice": 1.5,
        "llamaq.decision.max_options": 52})
    assert read_metadata(native)["general.architecture"] == "llama"
    caps = native_caps(read_metadata(native))
    assert caps == DecisionCaps(mode="native", types=["choice", "noul"], max_options=52,
                                temperatures={"choice": 1.5})
    assert file_output_modalities(native) == ["text", "decisions"]
    plain = write_gguf(tmp_path / "plain.gguf", {})
    assert native_caps(read_metadata(plain)) is None
    assert file_output_modalities(plain) == ["text"]
    assert file_output_modalities(tmp_path / "missing.gguf") == ["text"]
    (tmp_path / "junk.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(GgufError):
        read_metadata(tmp_path / "junk.gguf")
    assert file_output_modalities(tmp_path / "junk.gguf") == ["text"]


@pytest.mark.parametrize("metadata", [
    {"llamaq.decision.types": "choice,maybe"},
    {"llamaq.decision.types": ""},
    {"llamaq.decision.types": "choice", "llamaq.decision.temperature.choice": 0.0},
    {"llamaq.decision.types": "choice", "llamaq.decision.max_options": 1},
    {"llamaq.decision.types": 3},
])
def test_unusable_decision_keys_are_errors(metadata: dict[str, Any]) -> None:
    with pytest.raises(DecisionMetaError):
        native_caps(metadata)


def test_every_media_input_is_named_with_its_field_and_kind() -> None:
    png = "data:image/png;base64,iVBORw0KGgo="
    wav = "data:audio/wav;base64,UklGRg=="
    question = {"q": {"type": "noul", "instructions": "?"}}

    def fields(**extra: Any) -> list[tuple[str, str]]:
        return SystemOneRequest.model_validate({"questions": question, "state": "x",
                                                **extra}).media_fields()

    assert fields() == []
    assert fields(files=[png, wav], images=[png]) == [
        ("files[0]", "image"), ("files[1]", "audio"), ("images[0]", "image")]
    messages = [{"role": "user", "content": "plain"},
                {"role": "user", "content": [{"type": "text", "text": "t"},
                                             {"type": "input_audio",
                                              "input_audio": {"data": "AAAA"}}]}]
    assert fields(state=messages) == [("state[1].content[1] (input_audio)", "audio")]
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": png}}]}
    assert fields(state={"messages": [messages[0], image]}) \
        == [("state.messages[1].content[0] (image_url)", "image")]


def test_media_markers_go_before_the_state_in_the_prefix() -> None:
    png = "data:image/png;base64,iVBORw0KGgo="
    body = SystemOneRequest.model_validate({
        "state": [{"role": "user", "content": [{"type": "text", "text": "the page"},
                                               {"type": "image_url", "image_url": {"url": png}}]}],
        "files": [png], "questions": {"q": {"type": "noul", "instructions": "A table?"}}})
    job = decision_job(body, None, "m", {}, "<M>")
    assert job.prefix.count("<M>") == 2  # files' first, then the state's part
    assert job.prefix.index("<M><M>\nText: ") < job.prefix.index("the page")
    assert "<M>" not in job.questions[0].suffix
    plain = decision_job(body, None, "m", {})
    assert "<M>" not in plain.prefix and "image_url" not in plain.prefix
