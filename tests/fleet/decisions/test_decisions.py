"""POST /v1/systemone end to end: Gemma 3 270M answering by prompting (--decisions), a tiny
native decision model written by the test (llamaq's GGUF keys, temperatures), and the 400 / 501
cases, through real api and worker processes."""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduler.contract import keys
from tests.conftest import make_fleet
from tests.processes import Fleet

EXAMPLE = {
    "state": "Customer message: I was charged twice for my order last week and nobody has "
             "replied.",
    "questions": {
        "route": {"type": "choice", "instructions": "Which team should handle this?",
                  "criteria": {"billing": None, "shipping": None, "technical": None}},
        "angry": {"type": "noul", "instructions": "Is the customer angry?"},
        "urgency": {"type": "score", "instructions": "How urgent is this?",
                    "criteria": ["can wait", "this week", "today", "right now"]},
    },
}
PNG = "data:image/png;base64,iVBORw0KGgo="


@pytest.fixture(scope="module")
def decisions(redis_url: str, workdir: Path, gemma_path: Path) -> Iterator[str]:
    """Gemma 3 270M served with --decisions (prompted), the api with --metrics."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-decisions")
    fleet.add_worker("-c", "4096", "-np", "4", "-t", "2", "--decisions")
    url = fleet.add_api("--metrics")
    fleet.wait_healthy(url)
    yield url
    fleet.stop()


def ask(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/systemone", json=body, timeout=120)


def prompt_tokens_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    match = re.search(r"^llamacpp:prompt_tokens_total (\S+)$", text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


def check_answers(body: dict[str, Any], data: dict[str, Any]) -> None:
    assert list(data) == ["model", "answers", "usage"]
    assert data["usage"]["output_tokens"] == 0 and data["usage"]["input_tokens"] > 0
    assert set(data["answers"]) == set(body["questions"])
    for qid, question in body["questions"].items():
        answer = data["answers"][qid]
        assert answer["type"] == question["type"]
        if question["type"] == "noul":
            assert set(answer) == {"type", "noul"} and 0 <= answer["noul"] <= 1
            continue
        probabilities = answer["probabilities"]
        assert abs(sum(probabilities.values()) - 1) < 1e-6
        assert 0 <= answer["confidence"] <= 1
        if question["type"] == "choice":
            assert set(answer) == {"type", "choice", "probabilities", "confidence"}
            assert list(probabilities) == list(question["criteria"])
            assert answer["choice"] == max(probabilities, key=probabilities.__getitem__)
        else:
            levels = len(question["criteria"])
            assert set(answer) == {"type", "score", "legend", "probabilities", "confidence"}
            assert answer["legend"] == {str(i): t for i, t in enumerate(question["criteria"])}
            assert list(probabilities) == [str(i) for i in range(levels)]
            expected = sum(i * p for i, p in enumerate(probabilities.values()))
            assert abs(answer["score"] - expected) < 1e-9 and 0 <= answer["score"] <= levels - 1


def test_the_spec_example_is_answered_with_probabilities(decisions: str) -> None:
    response = ask(decisions, EXAMPLE)
    assert response.status_code == 200, response.text
    data = response.json()
    check_answers(EXAMPLE, data)
    assert data["model"] == "gemma-decisions"


def test_the_same_request_gives_the_same_numbers(decisions: str) -> None:
    first, second = ask(decisions, EXAMPLE).json(), ask(decisions, EXAMPLE).json()
    for qid, answer in first["answers"].items():
        again = second["answers"][qid]
        if answer["type"] == "noul":
            assert abs(answer["noul"] - again["noul"]) < 1e-6
        else:
            for option, p in answer["probabilities"].items():
                assert abs(p - again["probabilities"][option]) < 1e-6
    assert first["usage"] == second["usage"]


def test_an_answer_stated_in_the_state_is_found(decisions: str) -> None:
    body = {"state": "The sky is blue.", "questions": {
        "color": {"type": "choice", "instructions": "What color is the sky?",
                  "criteria": {"blue": None, "green": None, "red": None}}}}
    data = ask(decisions, body).json()
    assert data["answers"]["color"]["choice"] == "blue", data


def test_the_state_is_prefilled_once_for_all_questions(decisions: str) -> None:
    """The worker's prompt token count (its /metrics) grows by the state once, not once per
    question: a long state and three short questions."""
    state = " ".join(f"Order {i} was shipped to warehouse {i % 7} on day {i % 28}."
                     for i in range(25))
    n_state = len(httpx.post(f"{decisions}/tokenize", json={"content": state},
                             timeout=30).json()["tokens"])
    before = prompt_tokens_total(decisions)
    response = ask(decisions, {"state": state, "questions": EXAMPLE["questions"]})
    assert response.status_code == 200, response.text
    data = response.json()
    decoded = prompt_tokens_total(decisions) - before
    assert n_state >= 300
    assert n_state <= decoded < 2 * n_state, (n_state, decoded)
    assert data["usage"]["input_tokens"] > 3 * n_state  # every question's prompt holds it


def test_concurrent_requests_agree_with_single_ones(decisions: str) -> None:
    """Requests decoded together give the numbers they get alone, up to the rounding of
    differently shaped batches (the quantized CPU kernels)."""
    bodies = [{"state": f"Ticket {i}: the {color} parcel never arrived.", "questions": {
        "color": {"type": "choice", "instructions": "What color is the parcel?",
                  "criteria": {"blue": None, "green": None, "red": None}},
        "late": {"type": "noul", "instructions": "Did the parcel arrive?"}}}
        for i, color in enumerate(["blue", "green", "red", "blue", "green", "red"])]
    alone = [ask(decisions, body).json() for body in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda body: ask(decisions, body).json(), bodies))
    for a, b in zip(alone, together, strict=True):
        for option, p in a["answers"]["color"]["probabilities"].items():
            assert abs(p - b["answers"]["color"]["probabilities"][option]) < 0.05
        assert abs(a["answers"]["late"]["noul"] - b["answers"]["late"]["noul"]) < 0.05


def test_invalid_requests_are_400(decisions: str) -> None:
    question = {"type": "noul", "instructions": "?"}
    cases: list[dict[str, Any]] = [
        {"state": "x", "questions": {}},
        {"state": "x", "questions": {"q": {"type": "maybe", "instructions": "?"}}},
        {"state": "x", "questions": {"q": {"type": "score", "instructions": "?",
                                           "criteria": ["one"]}}},
        {"state": "x", "questions": {"q": {"type": "score", "instructions": "?",
                                           "criteria": [str(i) for i in range(11)]}}},
        {"state": "x", "questions": {"q": {"type": "choice", "instructions": "?",
                                           "criteria": {f"o{i}": None for i in range(256)}}}},
        {"state": "x", "files": ["http://example.com/a.png"], "questions": {"q": question}},
        {"state": "x", "images": ["data:image/png;base64,not base64!"],
         "questions": {"q": question}},
        {"state": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}],
         "questions": {"q": question}},
    ]
    for body in cases:
        response = ask(decisions, body)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_images_without_a_projector_are_501(decisions: str) -> None:
    question = {"q": {"type": "noul", "instructions": "Is there a table?"}}
    for body in ({"state": "x", "images": [PNG], "questions": question},
                 {"state": {"messages": [{"role": "user", "content": [
                     {"type": "text", "text": "look"},
                     {"type": "image_url", "image_url": {"url": PNG}}]}]},
                  "questions": question}):
        response = ask(decisions, body)
        assert response.status_code == 501, response.text
        assert response.json()["error"]["type"] == "not_supported_error"
        where = "images[0]" if "images" in body else "state.messages[0].content[1] (image_url)"
        assert f"image input is not supported by /v1/systemone here ({where})" in \
            response.json()["error"]["message"]


def test_a_prompted_model_does_not_advertise_decisions(decisions: str) -> None:
    for path in ("/v1/models", "/models"):
        card = httpx.get(f"{decisions}{path}", timeout=30).json()["data"][0]
        assert "decisions" not in card["architecture"]["output_modalities"]
    props = httpx.get(f"{decisions}/props", timeout=30).json()
    assert props["decisions"]["mode"] == "prompted"


def test_a_model_without_decisions_answers_501(tiny_fleet: Fleet) -> None:
    url = tiny_fleet.api_urls[0]
    response = ask(url, EXAMPLE)
    assert response.status_code == 501
    assert response.json()["error"]["type"] == "not_supported_error"
    assert httpx.get(f"{url}/props", timeout=30).json()["decisions"] == {"mode": "off"}


# -- a native decision model: llamaq's GGUF keys on a tiny llama ------------------------------

TEMPERATURE = 2.5


@pytest.fixture(scope="module")
def native(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The same tiny weights twice: as a native decision model (temperature 2.5 for choice, at
    most 3 options) and as a plain model served with --decisions (temperature 1)."""
    from tests.tiny_gguf import write_tiny_llama

    folder = tmp_path_factory.mktemp("native")
    native_path = write_tiny_llama(folder / "native.gguf", metadata={
        "llamaq.decision.types": "choice,score,noul",
        "llamaq.decision.temperature.choice": TEMPERATURE,
        "llamaq.decision.max_options": 3})
    plain_path = write_tiny_llama(folder / "plain.gguf")
    urls: dict[str, str] = {}
    fleets = []
    for name, path, flags in (("native", native_path, ()), ("plain", plain_path,
                                                             ("--decisions",))):
        fleet = make_fleet(redis_url, folder, path, f"tiny-{name}")
        urls[f"{name}-offline"] = fleet.add_api()
        for route in ("/v1/models", "/models"):  # before any worker: read from the file
            card = httpx.get(f"{urls[name + '-offline']}{route}", timeout=30).json()["data"][0]
            assert card["meta"] is None
            urls[f"{name}-offline{route}"] = json.dumps(card["architecture"])
        fleet.add_worker("-c", "2048", "-np", "2", "-t", "1", *flags)
        fleets.append(fleet)
    for fleet, name in zip(fleets, ("native", "plain"), strict=True):
        fleet.wait_healthy(urls[f"{name}-offline"])
        urls[name] = urls[f"{name}-offline"]
    yield urls
    for fleet in fleets:
        fleet.stop()


def test_a_native_model_advertises_decisions(native: dict[str, str]) -> None:
    for route in ("/v1/models", "/models"):  # offline, before the worker loaded the model
        assert json.loads(native[f"native-offline{route}"]) == {
            "input_modalities": ["text"], "output_modalities": ["text", "decisions"]}
        assert json.loads(native[f"plain-offline{route}"])["output_modalities"] == ["text"]
    for path in ("/v1/models", "/models"):
        card = httpx.get(f"{native['native']}{path}", timeout=30).json()["data"][0]
        assert card["architecture"]["output_modalities"] == ["text", "decisions"]
        plain = httpx.get(f"{native['plain']}{path}", timeout=30).json()["data"][0]
        assert plain["architecture"]["output_modalities"] == ["text"]
    props = httpx.get(f"{native['native']}/props", timeout=30).json()["decisions"]
    assert props == {"mode": "native", "types": ["choice", "score", "noul"], "max_options": 3,
                     "temperatures": {"choice": TEMPERATURE}}


def test_native_models_are_scaled_by_their_temperature(native: dict[str, str]) -> None:
    """Same weights, same prompt: the native model's choice probabilities are the plain
    model's raised to 1/T and renormalized; score and noul (no temperature) are equal."""
    body = {"state": {"ticket": 7, "text": "the cat is blue"}, "questions": {
        "pick": {"type": "choice", "instructions": "Which word?",
                 "criteria": {"cat": None, "dog": "a dog", "sky": None}},
        "level": {"type": "score", "instructions": "How much?", "criteria": ["low", "high"]},
        "yes": {"type": "noul", "instructions": "Is it?"}}}
    scaled = ask(native["native"], body).json()["answers"]
    plain = ask(native["plain"], body).json()["answers"]
    raw = plain["pick"]["probabilities"]
    weights = {k: math.exp(math.log(p) / TEMPERATURE) for k, p in raw.items()}
    total = sum(weights.values())
    for option, weight in weights.items():
        assert abs(scaled["pick"]["probabilities"][option] - weight / total) < 1e-5
    assert max(raw.values()) > max(scaled["pick"]["probabilities"].values())  # flatter
    assert abs(scaled["yes"]["noul"] - plain["yes"]["noul"]) < 1e-6
    assert abs(scaled["level"]["score"] - plain["level"]["score"]) < 1e-6


def test_a_native_models_option_limit_is_400(native: dict[str, str]) -> None:
    body = {"state": "x", "questions": {"q": {"type": "choice", "instructions": "?",
                                              "criteria": {"a": None, "b": None, "c": None,
                                                           "d": None}}}}
    response = ask(native["native"], body)
    assert response.status_code == 400 and "at most 3" in response.text


def test_labels_sharing_first_tokens_are_told_apart(decisions: str) -> None:
    """"light blue", "light green" and "light" share their first token: each is scored as its
    whole token sequence ("light" as "light" not followed by blue or green)."""
    options = {"light blue": None, "light green": None, "dark red": None, "light": None}
    for state, expected in (("The wall is light blue.", "light blue"),
                            ("The wall is light green.", "light green"),
                            ("The wall is dark red.", "dark red")):
        answer = ask(decisions, {"state": state, "questions": {"q": {
            "type": "choice", "instructions": "What color is the wall?",
            "criteria": options}}}).json()["answers"]["q"]
        assert abs(sum(answer["probabilities"].values()) - 1) < 1e-6
        assert answer["choice"] == expected, answer
        assert all(p > 0 for p in answer["probabilities"].values())


def mutations(seed: int, count: int) -> Iterator[Any]:
    """Bodies near a valid one: fields dropped, retyped, emptied, huge, nested, unicode."""
    import random

    rng = random.Random(seed)
    odd: list[Any] = [None, 0, -1, 1.5, True, "", "x" * 5000, [], {}, [None], {"a": None},
                      "\u00e9\u65e5\U0001f600", ["a"] * 300, {"true": 1}, {"": None},
                      [[[[[]]]]], "data:image/png;base64,", 10**30]
    for _ in range(count):
        body = json.loads(json.dumps(EXAMPLE))
        for _ in range(rng.randint(1, 3)):
            target = rng.choice(["body", "question", "criteria"])
            if target == "body":
                key = rng.choice(["state", "questions", "files", "images", "extra"])
                if rng.random() < 0.2:
                    body.pop(key, None)
                else:
                    body[key] = rng.choice(odd)
            elif isinstance(body.get("questions"), dict) and body["questions"]:
                qid = rng.choice(list(body["questions"]))
                question = body["questions"][qid]
                if not isinstance(question, dict):
                    continue
                key = rng.choice(["type", "instructions", "criteria"]) if target == "question" \
                    else "criteria"
                question[key] = rng.choice([*odd, "choice", "score", "noul"])
        yield rng.choice([body, json.dumps(body)[: rng.randint(0, 200)], body])


def test_mutated_bodies_get_answers_or_clean_errors(native: dict[str, str]) -> None:
    """Never a 500, a hang or a dead worker: 200, or a 400/501 in the spec's format."""
    url = native["plain"]
    with httpx.Client(timeout=60) as http:
        for body in mutations(11, 150):
            if isinstance(body, str):
                response = http.post(f"{url}/v1/systemone", content=body,
                                     headers={"Content-Type": "application/json"})
            else:
                response = http.post(f"{url}/v1/systemone", json=body)
            assert response.status_code in (200, 400, 501), (body, response.text)
            if response.status_code != 200:
                error = response.json()["error"]
                assert set(error) >= {"code", "message", "type"}
    assert ask(url, EXAMPLE).status_code == 200  # the worker is still there


def test_a_decision_whose_worker_dies_runs_again_on_another(
        redis_url: str, tmp_path: Path, tiny_model_path: Path) -> None:
    """A decision job is movable like a completion: it sent nothing before its answer, so
    when its worker is killed mid-job, it runs again on another worker and the client gets
    its answers (issue 5's faults hold for decisions)."""
    import threading

    import redis

    fleet = make_fleet(redis_url, tmp_path, tiny_model_path, "tiny-dies")
    try:
        first = fleet.add_worker("-c", "4096", "-np", "2", "-t", "1", "--decisions")
        url = fleet.add_api()
        fleet.wait_healthy(url)
        options = {f"o{i}": None for i in range(20)}  # several tokens each: many steps
        body = {"state": "the cat " * 200, "questions": {
            f"q{i}": {"type": "choice", "instructions": f"which {i}?", "criteria": options}
            for i in range(96)}}
        result: dict[str, httpx.Response] = {}
        thread = threading.Thread(target=lambda: result.update(answer=ask(url, body)))
        thread.start()
        client = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 60
        while not list(client.scan_iter("llamaq:job:*:owner")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)  # claimed: decoding; a faster worker answered 48 questions in 0.3 s
        first.kill()
        first.wait()
        assert thread.is_alive()  # killed mid-job
        fleet.add_worker("-c", "4096", "-np", "2", "-t", "1", "--decisions")
        thread.join(180)
        response = result["answer"]
        assert response.status_code == 200, response.text
        assert set(response.json()["answers"]) == set(body["questions"])
        retried = client.hget(keys.model_counters("tiny-dies"), "retried")
        assert retried is not None and int(retried) >= 1  # type: ignore[arg-type]
    finally:
        fleet.stop()


def test_a_client_that_leaves_frees_the_decision_slots(native: dict[str, str]) -> None:
    """The slots a decision holds show busy in /slots while it runs, and are freed soon after
    its client goes away (the api cancels the job; the engine drops it between two steps)."""
    import threading

    url = native["plain"]
    options = {f"o{i}": None for i in range(100)}  # about 17 s of work for this worker
    body = {"state": "the dog " * 40, "questions": {
        f"q{i}": {"type": "choice", "instructions": f"which {i}?", "criteria": options}
        for i in range(128)}}

    def leave_early() -> None:
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(f"{url}/v1/systemone", json=body, timeout=2)

    thread = threading.Thread(target=leave_early)
    thread.start()
    deadline = time.monotonic() + 10
    busy = False
    while not busy and time.monotonic() < deadline:
        busy = any(s["is_processing"] for s in httpx.get(f"{url}/slots", timeout=10).json())
    assert busy
    thread.join()
    left = time.monotonic()
    deadline = left + 8
    while any(s["is_processing"] for s in httpx.get(f"{url}/slots", timeout=10).json()):
        assert time.monotonic() < deadline, "the decision kept its slots after its client left"
        time.sleep(0.2)
    assert ask(url, EXAMPLE).status_code == 200
