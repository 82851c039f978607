"""Port the parser cases of the vendored llama.cpp's tests/test-chat.cpp to data.

Each `tst.test(INPUT)...run()` chain there (a template, the raw model output, the request's
parameters and the message llama.cpp parses it to) becomes one JSON case in
tests/data/chat_cases.json, and each template a case names is copied to tests/data/templates,
so the cases run on a clean clone without the sdist (tests/unit/api/test_chat_cases.py).

The C++ is read, not compiled: a small reader of its literals and its fluent calls evaluates
the constants the cases name (the tools, the `message_*` messages and their helper functions).
A case whose parts it cannot evaluate is listed on stderr and left out.

    python -m bench.port_chat_cases [VENDORED_LLAMA_CPP]
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VENDOR = Path.home() / ".cache/llamaq-bench/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/data/chat_cases.json"
TEMPLATES = ROOT / "tests/data/templates"

_TOKEN = re.compile(r"""
    (?P<ws>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<raw>R"(?P<delim>[^(\s]*)\((?P<body>.*?)\)(?P=delim)")
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<chr>'(?:[^'\\\n]|\\.)*')
  | (?P<num>\d+(?:\.\d+)?[uUlLfF]*)
  | (?P<id>[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)
  | (?P<op>::|->|&&|\|\||==|!=|<=|>=|\+=|.)
""", re.VERBOSE | re.DOTALL)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0",
            "a": "\a", "b": "\b", "f": "\f", "v": "\v", "?": "?"}


def _unescape(body: str) -> str:
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        nxt = body[i + 1]
        if nxt == "x":
            m = re.match(r"[0-9a-fA-F]+", body[i + 2:])
            assert m
            out.append(int(m.group(0), 16))
            i += 2 + len(m.group(0))
        elif nxt == "u":
            out += chr(int(body[i + 2:i + 6], 16)).encode("utf-8")
            i += 6
        else:
            out += _ESCAPES[nxt].encode("utf-8")
            i += 2
    return out.decode("utf-8")


@dataclass
class Tok:
    kind: str
    text: str
    value: Any = None


def tokenize(source: str) -> list[Tok]:
    toks: list[Tok] = []
    pos = 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        assert m, source[pos:pos + 40]
        pos = m.end()
        kind = m.lastgroup if m.lastgroup != "delim" and m.lastgroup != "body" else "raw"
        if m.group("ws") is not None:
            continue
        if m.group("raw") is not None:
            toks.append(Tok("str", m.group(0), m.group("body")))
        elif m.group("str") is not None:
            toks.append(Tok("str", m.group(0), _unescape(m.group(0)[1:-1])))
        elif m.group("num") is not None:
            toks.append(Tok("num", m.group(0), m.group(0)))
        elif m.group("id") is not None:
            toks.append(Tok("id", m.group(0)))
        else:
            toks.append(Tok(kind or "op", m.group(0)))
    return toks


class Unknown(Exception):
    pass


def msg(content: str = "", reasoning: str = "", name: str = "", arguments: str = "",
        call_id: str = "") -> dict[str, Any]:
    calls = [{"name": name, "arguments": arguments, "id": call_id}] if name or call_id else []
    return {"role": "assistant", "content": content, "reasoning_content": reasoning,
            "tool_calls": calls}


def _multi(reasoning: str, content: str, calls: list[list[str]]) -> dict[str, Any]:
    out = msg(content, reasoning)
    out["tool_calls"] = [{"name": c[0], "arguments": c[1], "id": ""} for c in calls]
    return out


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "simple_assist_msg": msg,
    "message_with_tool_calls": lambda n, a: msg("", "", n, a),
    "message_with_tool_calls_and_reasoning": lambda n, a, r: msg("", r, n, a),
    "message_with_reasoning_content_and_multiple_tool_calls": _multi,
    "message_with_content_and_tool_call": lambda c, n, a: msg(c, "", n, a),
    "message_with_reasoning_and_tool_call": lambda r, n, a: msg("", r, n, a),
    "std::string": lambda s="": s,
}


class Reader:
    def __init__(self, toks: list[Tok]) -> None:
        self.toks = toks
        self.env: dict[str, Any] = {"true": True, "false": False}
        self.tools: dict[str, Any] = {}

    def at(self, i: int, text: str) -> bool:
        return i < len(self.toks) and self.toks[i].text == text

    def matching(self, i: int) -> int:
        """The index of the bracket closing the one at i."""
        pairs = {"(": ")", "{": "}", "[": "]"}
        depth = 0
        opener = self.toks[i].text
        for j in range(i, len(self.toks)):
            t = self.toks[j].text
            if self.toks[j].kind in ("str", "num"):
                continue
            if t == opener:
                depth += 1
            elif t == pairs[opener]:
                depth -= 1
                if depth == 0:
                    return j
        raise Unknown("unbalanced")

    def args(self, i: int, j: int) -> list[Any]:
        """Evaluate the comma-separated expressions in toks[i:j]."""
        out = []
        start = i
        depth = 0
        for k in range(i, j):
            t = self.toks[k]
            if t.kind in ("str", "num"):
                continue
            if t.text in "({[":
                depth += 1
            elif t.text in ")}]":
                depth -= 1
            elif t.text == "," and depth == 0:
                out.append(self.expr(start, k))
                start = k + 1
        if start < j:
            out.append(self.expr(start, j))
        return out

    def expr(self, i: int, j: int) -> Any:
        # `a + b + ...` at depth 0
        depth = 0
        for k in range(i, j):
            t = self.toks[k]
            if t.kind in ("str", "num"):
                continue
            if t.text in "({[":
                depth += 1
            elif t.text in ")}]":
                depth -= 1
            elif t.text == "+" and depth == 0 and k > i:
                return self.expr(i, k) + self.expr(k + 1, j)
        return self.term(i, j)

    def term(self, i: int, j: int) -> Any:
        toks = self.toks
        if i >= j:
            raise Unknown("empty expression")
        if all(t.kind == "str" for t in toks[i:j]):
            return "".join(t.value for t in toks[i:j])
        t = toks[i]
        if t.text == "{" and self.matching(i) == j - 1:
            return self.args(i + 1, j - 1)
        if t.kind == "num" and j == i + 1:
            return float(t.text) if "." in t.text else int(t.text.rstrip("uUlL"))
        if t.text == "/" and j == i + 3 and toks[i + 1].text == "*":  # stray comment
            raise Unknown("comment")
        if t.kind == "id":
            name = t.text
            if j == i + 1:
                if name in self.env:
                    return self.env[name]
                if name.startswith(("COMMON_REASONING_FORMAT_", "COMMON_CHAT_TOOL_CHOICE_",
                                    "COMMON_CHAT_CONTINUATION_")):
                    return name.rsplit("_", 1)[-1].lower() if "CONTINUATION" in name else \
                        name.split("_")[-1].lower()
                raise Unknown(f"name {name}")
            if toks[i + 1].text == "(" and self.matching(i + 1) == j - 1:
                if name in FUNCTIONS:
                    return FUNCTIONS[name](*self.args(i + 2, j - 1))
                raise Unknown(f"function {name}")
            if toks[i + 1].text == "." and name in self.env:
                raise Unknown(f"method on {name}")
        raise Unknown(" ".join(x.text for x in toks[i:j])[:80])


def _bind_constants(reader: Reader) -> None:
    """Evaluate the file's `static common_chat_tool NAME{...}`, messages and strings."""
    toks = reader.toks
    for i, t in enumerate(toks):
        if t.text == "common_chat_tool" and i + 2 < len(toks) and toks[i + 1].kind == "id" \
                and toks[i + 2].text == "{":
            end = reader.matching(i + 2)
            try:
                name, desc, params = reader.args(i + 3, end)
                reader.env[toks[i + 1].text] = {"name": name, "description": desc,
                                                "parameters": json.loads(params)}
            except (Unknown, ValueError):
                pass
        elif t.text == "common_chat_msg" and i + 2 < len(toks) and toks[i + 1].kind == "id" \
                and toks[i + 2].text in ("=", "{") and (i == 0 or toks[i - 1].text in (
                    "const", "static", ";", "}")):
            name = toks[i + 1].text
            try:
                if toks[i + 2].text == "=":
                    end = _statement_end(reader, i + 3)
                    reader.env[name] = reader.expr(i + 3, end)
                else:
                    end = reader.matching(i + 2)
                    parts = reader.args(i + 3, end)
                    reader.env[name] = {"role": parts[0], "content": parts[1],
                                        "reasoning_content": "", "tool_calls": []}
            except (Unknown, TypeError, IndexError, ValueError):
                pass


def _statement_end(reader: Reader, i: int) -> int:
    toks = reader.toks
    while not (toks[i].text == ";" and toks[i].kind == "op"):
        if toks[i].kind == "op" and toks[i].text in "({[":
            i = reader.matching(i)
        i += 1
    return i


_SETTERS = {"reasoning_format", "tools", "enable_thinking", "parallel_tool_calls",
            "add_generation_prompt", "continue_final_message", "json_schema", "is_partial",
            "tool_choice", "messages"}


def _case(reader: Reader, template: str, i: int, end: int) -> dict[str, Any]:
    """The chain `test(...)` `.method(...)`... from toks[i] (the `test`) to toks[end] (`;`)."""
    toks = reader.toks
    close = reader.matching(i + 1)
    case: dict[str, Any] = {"template": template, "input": reader.expr(i + 2, close),
                            "params": {}, "expect": msg()}
    k = close + 1
    while k < end:
        assert toks[k].text == ".", toks[k].text
        method = toks[k + 1].text
        close = reader.matching(k + 2)
        values = reader.args(k + 3, close)
        k = close + 1
        if method in _SETTERS:
            value: Any = values[0] if values else None
            if method == "tools":
                value = [{"name": tool[0], "description": tool[1],
                          "parameters": json.loads(tool[2])} if isinstance(tool, list) else tool
                         for tool in value]
                for tool in value:
                    reader.tools[tool["name"]] = tool
                value = [tool["name"] for tool in value]
            case["params"][method] = value
        elif method == "expect":
            case["expect"] = dict(values[0])
        elif method == "expect_content":
            case["expect"]["content"] = values[0]
        elif method == "expect_reasoning":
            case["expect"]["reasoning_content"] = values[0]
        elif method == "expect_tool_calls":
            case["expect"]["tool_calls"] = [
                {"name": c[0], "arguments": c[1], "id": c[2] if len(c) > 2 and c[2] != [] else ""}
                for c in values[0]]
        elif method in ("expect_reconstruction", "run"):
            pass
        else:
            raise Unknown(f"method {method}")
    return case


def port(vendor: Path) -> tuple[dict[str, Any], list[str]]:
    source = (vendor / "tests/test-chat.cpp").read_text("utf-8")
    toks = tokenize(source)
    reader = Reader(toks)
    _bind_constants(reader)
    testers: dict[str, list[str]] = {}
    loop_paths: list[str] = []
    lfm2 = [t.value for t in toks if t.kind == "str" and t.value.startswith(
        "models/templates/LFM2")]
    cases: list[dict[str, Any]] = []
    skipped: list[str] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.text == "for" and reader.at(i + 1, "("):
            close = reader.matching(i + 1)
            strs = [x.value for x in toks[i + 2:close] if x.kind == "str"]
            if strs and all(s.startswith("models/templates/") for s in strs):
                loop_paths = strs
        elif t.text == "peg_tester" and reader.at(i + 1, "(") and toks[i - 1].text == "=":
            var = toks[i - 2].text
            arg = toks[i + 2]
            if arg.kind == "str":
                testers[var] = [arg.value]
            elif arg.text == "template_path":
                testers[var] = sorted(set(lfm2))
            else:
                testers[var] = loop_paths
        elif t.kind == "id" and t.text in ("std::string", "auto") and i + 3 < len(toks) and \
                toks[i + 1].kind == "id" and toks[i + 2].text == "=" and \
                toks[i + 1].text not in testers:
            end = _statement_end(reader, i + 3)
            with contextlib.suppress(Unknown, TypeError):
                reader.env[toks[i + 1].text] = reader.expr(i + 3, end)
        elif t.text == "char" and reader.at(i + 1, "*") and i + 3 < len(toks) and \
                toks[i + 3].text == "=":
            end = _statement_end(reader, i + 4)
            with contextlib.suppress(Unknown, TypeError):
                reader.env[toks[i + 2].text] = reader.expr(i + 4, end)
        elif t.kind == "id" and t.text in testers and reader.at(i + 1, ".") and \
                reader.at(i + 2, "test") and reader.at(i + 3, "("):
            end = _statement_end(reader, i + 2)
            for template in testers[t.text]:
                try:
                    cases.append(_case(reader, Path(template).name, i + 2, end))
                except (Unknown, TypeError, IndexError, KeyError, AssertionError) as e:
                    snippet = " ".join(x.text for x in toks[i + 4:i + 8])
                    skipped.append(f"{Path(template).name}: {e} [{snippet}]")
            i = end
        i += 1
    return {"tools": dict(sorted(reader.tools.items())), "cases": cases}, skipped


def main() -> None:
    vendor = Path(sys.argv[1]) if len(sys.argv) > 1 else VENDOR
    ported, skipped = port(vendor)
    cases = ported["cases"]
    for index, case in enumerate(cases):
        case["id"] = f"{index:03d}-{Path(case['template']).stem}"
    for name in sorted({c["template"] for c in cases}):
        target = TEMPLATES / name
        if not target.exists():
            shutil.copyfile(vendor / "models/templates" / name, target)
    OUT.write_text(json.dumps(ported, indent=1, ensure_ascii=False) + "\n", "utf-8")
    for line in skipped:
        print("skipped:", line, file=sys.stderr)
    print(f"{len(cases)} cases, {len(skipped)} skipped", file=sys.stderr)


if __name__ == "__main__":
    main()
