"""-cl/--cache-list and --completion-bash (llamaq/one_shot.py), answered before any role starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llamaq.cli import main
from llamaq.flag_lists import ROLES
from llamaq.one_shot import completion_bash


def test_cache_list_prints_the_hub_cache_as_llama_cpp(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = tmp_path / "huggingface" / "models--org--tiny-GGUF" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    for name in ("tiny-Q4_K_M.gguf", "tiny-Q8_0-00001-of-00002.gguf",
                 "tiny-Q8_0-00002-of-00002.gguf", "mmproj-tiny-F16.gguf"):
        (snapshot / name).write_bytes(b"GGUF")
    main(["worker", "-cl", "--cache-dir", str(tmp_path), "-m", "ignored.gguf"])
    out = capsys.readouterr().out
    assert out == ("number of models in cache: 2\n   1. org/tiny-GGUF:Q4_K_M\n"
                   "   2. org/tiny-GGUF:Q8_0\n"), out


def test_completion_bash_lists_every_flag_and_is_valid_bash(
        capsys: pytest.CaptureFixture[str]) -> None:
    main(["api", "--completion-bash"])
    script = capsys.readouterr().out
    assert script == completion_bash([settings for _, settings in ROLES])
    opts = script.split('opts="', 1)[1].split('"', 1)[0].split()
    assert {"-m", "--port", "-c", "--override-kv", "--no-webui", "--cache-list"} <= set(opts)
    assert script.rstrip().endswith("complete -F _llama_completions llamaq")


@pytest.mark.process  # runs bash (tests/lanes.py)
def test_the_completion_script_is_valid_bash() -> None:
    script = completion_bash([settings for _, settings in ROLES])
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
