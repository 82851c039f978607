"""Slots across the fleet: /slots, /props, id_slot, concurrency, prompt cache, cancellation."""

from __future__ import annotations

import concurrent.futures
import time

import httpx

from tests.processes import wait_until


def slots(api: str) -> list[dict[str, object]]:
    response = httpx.get(f"{api}/slots")
    assert response.status_code == 200
    return list(response.json())


def test_props(api: str) -> None:
    body = httpx.get(f"{api}/props").json()
    assert body["total_slots"] == 4
    assert body["model_path"].endswith(".gguf")
    settings = body["default_generation_settings"]
    assert settings["n_ctx"] == 1024  # -c 4096 over -np 4: not unified
    assert set(settings) == {"params", "n_ctx"}  # llama-server's default_generation_settings
    params = settings["params"]
    assert params["temperature"] == 0.8 and params["top_k"] == 40 and params["n_predict"] == -1
    assert params["repeat_penalty"] == 1.0
    assert params["samplers"] == ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p",
                                  "min_p", "xtc", "temperature"]
    assert body["is_sleeping"] is False and "chat_template" in body
    # llama-server's form: b<build>-<commit> of the llama.cpp the worker runs (0.3.36's)
    assert body["build_info"] == "b1-0c1e570"
    assert body["llamaq_version"]  # ours, in its own key


def test_slots_list_every_slot(api: str) -> None:
    states = slots(api)
    assert [s["id"] for s in states] == [0, 1, 2, 3]
    assert all(s["n_ctx"] == 1024 for s in states)


def test_concurrent_requests_are_decoded_together(api: str) -> None:
    def generate(i: int) -> dict[str, object]:
        body = {"prompt": f"Request {i}: once upon a time", "n_predict": 64, "ignore_eos": True,
                "seed": i}
        return dict(httpx.post(f"{api}/completion", json=body, timeout=120).json())

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(generate, i) for i in range(4)]
        busy = 0
        deadline = time.monotonic() + 30
        while busy < 2 and time.monotonic() < deadline:
            busy = sum(1 for s in slots(api) if s["is_processing"])
            time.sleep(0.05)
        results = [f.result() for f in futures]
    assert busy >= 2, "never saw two slots processing at once"
    assert sorted(r["id_slot"] for r in results) == [0, 1, 2, 3]  # type: ignore[type-var]


def test_prompt_cache_reuse_shows_in_timings(api: str) -> None:
    prompt = "The history of the Roman empire is long and " * 8
    body = {"prompt": prompt, "n_predict": 4, "id_slot": 2, "temperature": 0}
    httpx.post(f"{api}/completion", json=body, timeout=60)
    again = httpx.post(f"{api}/completion", json=body, timeout=60).json()
    assert again["id_slot"] == 2
    assert again["timings"]["cache_n"] >= again["tokens_evaluated"] - 1
    assert again["timings"]["prompt_n"] <= 1
    cold = httpx.post(f"{api}/completion", json={**body, "cache_prompt": False}, timeout=60)
    assert cold.json()["timings"]["cache_n"] == 0


def test_bad_id_slot_is_400(api: str) -> None:
    response = httpx.post(f"{api}/completion", json={"prompt": "x", "id_slot": 99})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_disconnected_stream_frees_its_slot(api: str) -> None:
    body = {"prompt": "Write a very long story:", "n_predict": 100000, "ignore_eos": True,
            "stream": True, "id_slot": 3}
    with httpx.stream("POST", f"{api}/completion", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        wait_until(lambda: slots(api)[3]["is_processing"], what="slot 3 busy")
    wait_until(lambda: not slots(api)[3]["is_processing"], timeout=10,
               what="slot 3 freed after the client went away")


def test_cache_reuse_shifts_a_moved_block(api: str) -> None:
    story = " ".join(f"word{i}" for i in range(60))
    first = {"prompt": f"Intro one two. {story}", "n_predict": 1, "id_slot": 1}
    httpx.post(f"{api}/completion", json=first, timeout=60)
    second = {"prompt": f"Intro. {story}", "n_predict": 1, "id_slot": 1, "n_cache_reuse": 8}
    body = httpx.post(f"{api}/completion", json=second, timeout=60).json()
    assert body["timings"]["cache_n"] > body["tokens_evaluated"] // 2, body["timings"]
