"""--log-prompts-dir on a real api pod (api/prompt_log.py): each completion's prompt lands in a
file of the folder, the rendered chat prompt for a chat request, as llama-server writes them."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.processes import Fleet


def test_prompts_are_written_to_the_folder(tiny_fleet: Fleet, tmp_path: Path) -> None:
    folder = tmp_path / "prompts" / "made"  # auto-created
    api = tiny_fleet.add_api("--log-prompts-dir", str(folder))
    tiny_fleet.wait_healthy(api)
    done = httpx.post(f"{api}/completion", json={"prompt": "The sky is", "n_predict": 1},
                      timeout=60)
    assert done.status_code == 200, done.text
    chat = httpx.post(f"{api}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 1})
    assert chat.status_code == 200, chat.text
    tokens = httpx.post(f"{api}/completion", json={"prompt": [1, 2, "x"], "n_predict": 1},
                        timeout=60)
    assert tokens.status_code == 200, tokens.text
    files = sorted(folder.glob("*.txt"))
    assert [len(f.stem.split("-")[0]) for f in files] == [12, 12, 12]
    texts = [f.read_text() for f in files]
    assert texts[0] == "The sky is"
    assert "Say hello" in texts[1] and texts[1] != "Say hello"  # the rendered template
    assert texts[2] == '[\n  1,\n  2,\n  "x"\n]'
