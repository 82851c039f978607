"""Worker flags that change behaviour, on a real worker: -r/--reverse-prompt, --warmup."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import make_fleet
from tests.processes import Fleet


def complete(url: str, **body: object) -> dict[str, object]:
    base = {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0,
            "cache_prompt": False}
    response = httpx.post(f"{url}/completion", json={**base, **body}, timeout=120)
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()
    return result


def test_reverse_prompt_is_the_stop_of_requests_that_give_none(
        redis_url: str, workdir: Path, gemma_path: Path, api: str, fleet: Fleet) -> None:
    words = str(complete(api)["content"]).split()
    assert len(words) >= 4
    word = words[len(words) // 2]
    flagged = make_fleet(redis_url, workdir, gemma_path, "gemma-r")
    try:
        flagged.add_worker("-c", "1024", "-np", "1", "-t", "2", "-r", word, "--no-warmup")
        url = flagged.add_api()
        flagged.wait_healthy(url)
        own_stop = complete(url, stop=["@@@@"])  # a request's own stops replace -r
        text = str(own_stop["content"])
        assert word in text and own_stop["stop_type"] != "word"
        stopped = complete(url)
        assert stopped["stop_type"] == "word"
        assert stopped["stopping_word"] == word
        assert stopped["content"] == text[:text.index(word)]
        assert stopped["generation_settings"]["stop"] == [word]  # type: ignore[index]
    finally:
        flagged.stop()
    warmed = (fleet.logs / "worker-0.log").read_text(errors="replace")
    assert "model warmed up" in warmed  # --warmup is the default
    not_warmed = "".join(p.read_text(errors="replace") for p in flagged.logs.glob("worker-*"))
    assert "model loaded" in not_warmed or "serves gemma-r" in not_warmed
    assert "model warmed up" not in not_warmed
