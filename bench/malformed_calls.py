"""Malformed model output as the vendored llama.cpp reads it: for the first tool-call case of
each template in tests/data/chat_cases.json, the raw output cut short (a third, a half, all
but its last character: what `max_tokens` leaves) and with broken JSON (a brace dropped, the
first quotes made single), parsed by llama.cpp's own `common_chat_parse`
(bench/chat_oracle/oracle.cpp, built here against the static libraries that
bench/build_llama_server.sh leaves in ~/.cache/llamaq-bench/build-*), whole and mid-stream.
Writes tests/data/chat_cases_malformed.json, which tests/unit/api/test_chat_malformed.py
checks llamaq against; tests/data/llama_cpp_template_caps.json, llama.cpp's /props
`chat_template_caps` of each template in tests/data/templates (test_chat_template_caps.py); and
tests/data/llama_cpp_autoparser.json, its auto-parser's analysis of each of them
(test_chat_autoparser.py).

    python -m bench.malformed_calls [--build DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.chat_cases import TEMPLATES, _openai_message, _tool, cases  # noqa: E402

CACHE = Path.home() / ".cache" / "llamaq-bench"
SOURCE = REPO / "bench" / "chat_oracle" / "oracle.cpp"
CAPS = REPO / "tests" / "data" / "llama_cpp_template_caps.json"
ANALYSES = REPO / "tests" / "data" / "llama_cpp_autoparser.json"
LIBRARIES = ("common/libllama-common.a", "common/libllama-common-base.a", "src/libllama.a",
             "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a")


def variants(text: str) -> dict[str, str]:
    return {"third": text[: len(text) // 3], "half": text[: len(text) // 2],
            "minus1": text[:-1], "broken": text.replace("}", "", 1).replace('"', "'", 2)}


def call_cases() -> list[dict[str, Any]]:
    """The first complete tool-call case of each template."""
    return list({c["template"]: c for c in reversed(cases())
                 if c["expect"]["tool_calls"] and not c["params"].get("is_partial")}.values())


def build(build_dir: Path) -> Path:
    vendor = next(CACHE.glob("sdist/*/vendor/llama.cpp"))
    binary = CACHE / "bin" / "chat-oracle"
    binary.parent.mkdir(parents=True, exist_ok=True)
    include = [f"-I{vendor / d}" for d in ("common", "include", "ggml/include", "vendor")]
    subprocess.run(["g++", "-O1", "-std=c++17", *include, str(SOURCE), "-o", str(binary),
                    *(str(build_dir / lib) for lib in LIBRARIES), "-lpthread", "-fopenmp",
                    "-ldl"], check=True)
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, default=next(CACHE.glob("build-*"), CACHE))
    parser.add_argument("--out", type=Path, default=REPO / "tests/data/chat_cases_malformed.json")
    args = parser.parse_args()
    oracle = build(args.build)
    jobs, records = [], []
    for case in call_cases():
        params = case["params"]
        messages = [_openai_message(m) for m in params.get("messages", [])] or \
            [{"role": "user", "content": "Hey there!"}]
        for kind, text in variants(case["input"]).items():
            jobs.append({"template": str(TEMPLATES / case["template"]), "messages": messages,
                         "tools": [_tool(n) for n in params.get("tools", [])],
                         "tool_choice": params.get("tool_choice") or "auto",
                         "parallel_tool_calls": params.get("parallel_tool_calls", False),
                         "reasoning_format": params.get("reasoning_format", "none"),
                         "enable_thinking": params.get("enable_thinking", True), "input": text})
            records.append({"case": case["id"], "variant": kind, "input": text})
    answers = subprocess.run([str(oracle)], input="".join(json.dumps(j) + "\n" for j in jobs),
                             capture_output=True, text=True, check=True).stdout.splitlines()
    for record, answer in zip(records, answers, strict=True):
        record["llama.cpp"] = json.loads(answer)
    args.out.write_text(json.dumps(records, ensure_ascii=False, indent=1) + "\n", "utf-8")
    print(f"{len(records)} answers in {args.out}")
    templates = sorted(TEMPLATES.glob("*.jinja"))
    answers = subprocess.run(
        [str(oracle)], capture_output=True, text=True, check=True,
        input="".join(json.dumps({"template": str(t), "caps": True}) + "\n" for t in templates),
    ).stdout.splitlines()
    caps = {t.name: json.loads(a)["caps"] for t, a in zip(templates, answers, strict=True)}
    CAPS.write_text(json.dumps(caps, indent=1, sort_keys=True) + "\n", "utf-8")
    print(f"{len(caps)} templates' caps in {CAPS}")
    answers = subprocess.run(
        [str(oracle)], capture_output=True, text=True, check=True,
        input="".join(json.dumps({"template": str(t), "analysis": True}) + "\n"
                      for t in templates),
    ).stdout.splitlines()
    analyses = {t.name: json.loads(a)["analysis"]
                for t, a in zip(templates, answers, strict=True)}
    ANALYSES.write_text(json.dumps(analyses, ensure_ascii=False, indent=1, sort_keys=True) + "\n",
                        "utf-8")
    print(f"{len(analyses)} templates' analyses in {ANALYSES}")


if __name__ == "__main__":
    main()
