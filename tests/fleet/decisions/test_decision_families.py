"""The spec's decision families through real api and worker processes: tiny llama GGUFs that
name a family as llama.cpp reads it (`llama.decision.type`, with the systemone template and
fitted temperatures their published files carry): openjev and lfm2-d1, label-logit families
that llamaq's engine answers with the model's own template and label codes (checked against
the logits llama.cpp gives for the same prompt, computed here in-process), and clef, a
decision-head family that serves only /v1/systemone."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import jinja2
import pytest

from tests.conftest import make_fleet

SYSTEMONE = ("<s>Text: {{ state if state is string else state | tojson }}\n"
             "Question: {{ instructions }}\n"
             "{% for o in options %}{{ o.label | default('ABCDEFGHIJ'[loop.index0]) }}. {{ o.key }}"
             "{% if o.description %}: {{ o.description }}{% endif %}\n{% endfor %}Answer:")
CLEF = ("<s>{{ state if state is string else state | tojson }}{% for q in questions %}{{ sep }}"
        "{{ mark_question }}Question: {{ q.instructions }}{% for o in q.options %}{{ sep }}"
        "{{ mark_option }}{{ o.key }}{% endfor %}{% endfor %}{{ sep }}Answer:")
"""A joint template as clef's: the questions and their options as marked pieces."""
QUESTIONS: dict[str, dict[str, Any]] = {
    "route": {"type": "choice", "instructions": "Which team?",
              "criteria": {"billing": None, "shipping": None, "technical": None}},
    "angry": {"type": "noul", "instructions": "Is the customer angry?"},
}
FAMILIES = ("openjev", "lfm2-d1", "clef", "pplx-decider")
PPLX = "{{ id }} " + SYSTEMONE
"""A template whose prompts share no first token (each starts with the question's id)."""
TEMPERATURE = 1.5


@pytest.fixture(scope="module")
def families(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from tests.tiny_gguf import DECISION_PIECES, write_tiny_llama

    folder = tmp_path_factory.mktemp("families")
    urls: dict[str, str] = {}
    fleets = []
    for name in FAMILIES:
        path = write_tiny_llama(folder / f"{name}.gguf", extra_pieces=DECISION_PIECES, metadata={
            "llama.decision.type": name,
            "tokenizer.chat_template.systemone": {"clef": CLEF, "pplx-decider": PPLX}.get(
                name, SYSTEMONE),
            "llama.decision.temperature.choice.3_5": str(TEMPERATURE)})
        urls[f"{name}-path"] = str(path)
        fleet = make_fleet(redis_url, folder, path, f"tiny-{name}")
        url = fleet.add_api()
        for route in ("/v1/models", "/models"):  # before any worker: read from the file
            card = httpx.get(f"{url}{route}", timeout=30).json()["data"][0]
            urls[f"{name}-offline{route}"] = json.dumps(card["architecture"])
        fleet.add_worker("-c", "2048", "-np", "2", "-t", "1", "-ub", "512")
        fleets.append(fleet)
        urls[name] = url
    for fleet, name in zip(fleets, FAMILIES, strict=True):
        fleet.wait_healthy(urls[name])
    yield urls
    for fleet in fleets:
        fleet.stop()


def expected(path: str, state: str, question: dict[str, Any], labels: list[list[str]],
             temperature: float, label_texts: list[str] | None, template: str = SYSTEMONE,
             noul_order: tuple[str, str] = ("true", "false"), qid: str = "") -> list[float]:
    """What llama-server computes: the template rendered for the question (its options in the
    model's order, with the label texts the family gives the template), the logits at its
    last token, an option's score the best of its labels', softmax at the temperature."""
    import llama_cpp

    options: list[dict[str, Any]] = [{"key": k, "description": d}
                                     for k, d in question["criteria"].items()] \
        if question["type"] == "choice" else [{"key": key} for key in noul_order]
    for option, label in zip(options, label_texts or [], strict=False):
        option["label"] = label
    prompt = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template).render(
        id=qid, state=state, instructions=question["instructions"], options=options)
    llm = llama_cpp.Llama(path, n_ctx=512, n_threads=1, verbose=False, logits_all=True)
    try:
        tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        llm.eval(tokens)
        logits = llm.scores[len(tokens) - 1]
        scores = []
        for forms in labels:
            ids = [llm.tokenize(f.encode(), add_bos=False, special=False) for f in forms]
            scores.append(max(float(logits[i[0]]) for i in ids if len(i) == 1))
    finally:
        llm.close()
    peak = max(scores)
    weights = [math.exp((s - peak) / temperature) for s in scores]
    return [w / sum(weights) for w in weights]


def ask(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/systemone", json=body, timeout=120)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_family_is_a_decision_model_offline_and_loaded(families: dict[str, str],
                                                         name: str) -> None:
    expected = {"input_modalities": ["text"], "output_modalities": ["decisions"]}
    for route in ("/v1/models", "/models"):
        assert json.loads(families[f"{name}-offline{route}"]) == expected
        card = httpx.get(f"{families[name]}{route}", timeout=30).json()["data"][0]
        assert card["architecture"] == expected
    props = httpx.get(f"{families[name]}/props", timeout=30).json()["decisions"]
    assert props["mode"] == "native" and props["family"]["name"] == name
    assert props["max_options"] == (52 if name == "openjev" else 255)
    assert props["temperatures"] == {"choice.3_5": TEMPERATURE}


@pytest.mark.parametrize(("name", "route_labels", "angry_labels", "texts"), [
    ("openjev", [["A"], ["B"], ["C"]], [["A"], ["B"]], None),  # its template counts letters
    ("lfm2-d1", [["A"], ["B"], ["C"]], [["yes", "Yes"], ["no", "No"]], True)])
def test_a_label_logit_family_answers_as_llama_cpp_reads_its_labels(
        families: dict[str, str], name: str, route_labels: list[list[str]],
        angry_labels: list[list[str]], texts: bool | None) -> None:
    state = "I was charged twice and nobody replied."
    response = ask(families[name], {"state": state, "questions": QUESTIONS})
    assert response.status_code == 200, response.text
    answers = response.json()["answers"]
    route = expected(families[f"{name}-path"], state, QUESTIONS["route"], route_labels,
                     TEMPERATURE, ["A", "B", "C"] if texts else None)  # choice.3_5
    got = list(answers["route"]["probabilities"].values())
    assert got == pytest.approx(route, abs=2e-3), (got, route)
    angry = expected(families[f"{name}-path"], state, QUESTIONS["angry"], angry_labels, 1.0,
                     ["true", "false"] if texts else None)  # lfm2-d1: noul's labels, its keys
    assert answers["angry"]["noul"] == pytest.approx(angry[0], abs=2e-3)
    assert max(route) - min(route) > 0.01  # the labels are told apart: the check can fail


def test_pplx_decider_answers_prompts_that_share_no_prefix(families: dict[str, str]) -> None:
    """Its codes go to the template as labels; noul is read as (false, true); the prompts of
    this template start with the question's id, so nothing is shared and each question is
    decoded whole."""
    state = "I was charged twice and nobody replied."
    response = ask(families["pplx-decider"], {"state": state, "questions": QUESTIONS})
    assert response.status_code == 200, response.text
    answers = response.json()["answers"]
    path = families["pplx-decider-path"]
    route = expected(path, state, QUESTIONS["route"], [["A"], ["B"], ["C"]], TEMPERATURE,
                     ["A", "B", "C"], PPLX, qid="route")
    assert list(answers["route"]["probabilities"].values()) == pytest.approx(route, abs=2e-3)
    angry = expected(path, state, QUESTIONS["angry"], [["A"], ["B"]], 1.0, ["A", "B"], PPLX,
                     ("false", "true"), qid="angry")  # A is false, B is true
    assert answers["angry"]["noul"] == pytest.approx(angry[1], abs=2e-3)
    assert abs(angry[0] - angry[1]) > 0.01  # false and true told apart: the check can fail


def test_openjev_refuses_a_null_state_and_53_options(families: dict[str, str]) -> None:
    url = families["openjev"]
    null = ask(url, {"state": None, "questions": QUESTIONS})
    assert null.status_code == 400 and "must be provided" in null.text
    many = {"q": {"type": "choice", "instructions": "which?",
                  "criteria": {f"o{i}": None for i in range(53)}}}
    response = ask(url, {"state": "s", "questions": many})
    assert response.status_code == 400 and "at most 52" in response.text


def test_lfm2_d1_answers_with_a_null_state_and_serves_text(families: dict[str, str]) -> None:
    url = families["lfm2-d1"]
    response = ask(url, {"state": None, "questions": QUESTIONS})
    assert response.status_code == 200, response.text
    answers = response.json()["answers"]
    assert abs(sum(answers["route"]["probabilities"].values()) - 1) < 1e-6
    assert 0 <= answers["angry"]["noul"] <= 1
    completion = httpx.post(f"{url}/completion", json={"prompt": "the sky", "n_predict": 4},
                            timeout=60)
    assert completion.status_code == 200, completion.text


def test_clef_serves_only_systemone(families: dict[str, str]) -> None:
    url = families["clef"]
    for path, body in (("/completion", {"prompt": "the sky", "n_predict": 4}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}]})):
        response = httpx.post(f"{url}{path}", json=body, timeout=60)
        assert response.status_code == 501, response.text
        assert "clef decision model, text generation is not available" in response.text


def test_clef_checks_a_request_then_says_why_it_cannot_answer(families: dict[str, str]) -> None:
    url = families["clef"]
    null = ask(url, {"state": None, "questions": QUESTIONS})
    assert null.status_code == 400 and '\\"state\\" must be provided' in null.text
    # all the questions in one batch: more than -ub 512 tokens is a 400 that says so
    long = ask(url, {"state": "the cat " * 300, "questions": QUESTIONS})
    assert long.status_code == 400 and "--ubatch-size (512)" in long.text, long.text
    short = ask(url, {"state": "a", "questions": {"angry": QUESTIONS["angry"]}})
    assert short.status_code == 501 and "clef answers from a decision head" in short.text


def test_a_completion_sent_before_the_clef_worker_came_up_is_refused_by_it(
        families: dict[str, str], redis_url: str,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The api lets a completion wait while the model has no live worker; the clef worker that
    then takes it refuses it (501) instead of generating text."""
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    folder = tmp_path_factory.mktemp("late")
    fleet = make_fleet(redis_url, folder, Path(families["clef-path"]), "tiny-clef-late")
    try:
        url = fleet.add_api()
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.post, f"{url}/completion",
                                  json={"prompt": "the sky", "n_predict": 4}, timeout=120)
            fleet.add_worker("-c", "2048", "-np", "2", "-t", "1")
            response = waiting.result()
        assert response.status_code == 501, response.text
        assert "clef decision model, text generation is not available" in response.text
    finally:
        fleet.stop()


@pytest.mark.process  # starts llamaq and redis-server itself (tests/lanes.py)
def test_a_router_lists_unloaded_family_models_with_their_architecture(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Router mode (no -m): /models and /v1/models tell a native decision model without a load
    (the spec: unloaded and sleeping models too); a refused family reads as text."""
    from tests.processes import Fleet, start_redis, wait_until
    from tests.tiny_gguf import write_tiny_llama

    work = tmp_path_factory.mktemp("router-families")
    models = work / "models"
    models.mkdir()
    for name in ("lfm2-d1", "clef", "granite-switch"):
        write_tiny_llama(models / f"{name}.gguf", metadata={
            "llama.decision.type": name, "tokenizer.chat_template.systemone": SYSTEMONE})
    write_tiny_llama(models / "plain.gguf")
    redis_process, redis_url = start_redis(work / "redis")
    fleet = Fleet(redis_url, work, ["--store-url", str(work / "store"),
                                    "--cache-dir", str(work / "cache")], logs=work / "logs")
    try:
        url = fleet.add_api("--models-dir", str(models))
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 60)
        for route in ("/models", "/v1/models"):
            listed = {item["id"]: item for item in httpx.get(f"{url}{route}").json()["data"]}
            outputs = {name: item["architecture"]["output_modalities"]
                       for name, item in listed.items()}
            assert outputs == {"lfm2-d1": ["decisions"], "clef": ["decisions"],
                               "granite-switch": ["text"], "plain": ["text"]}, outputs
            assert all(item["status"] == {"value": "unloaded"} for item in listed.values()) \
                or route == "/v1/models"
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()
