"""Rewrites tests/data/chat_cases_differ.txt (the ported llama.cpp chat cases llamaq does not
yet answer alike) and prints the count equal per template:
`python -m tests.chat_cases_differ [ID_SUBSTRING]` (with a substring: what differs in those)."""

from __future__ import annotations

import sys
from collections import Counter

from tests.chat_cases import cases, verdict
from tests.paths import DATA


def main() -> None:
    total: Counter[str] = Counter()
    differ: dict[str, str] = {}
    for case in cases():
        total[case["template"]] += 1
        why = verdict(case)
        if why:
            differ[case["id"]] = why
    (DATA / "chat_cases_differ.txt").write_text("".join(f"{i}\n" for i in differ), "utf-8")
    bad = Counter(i.split("-", 1)[1] for i in differ)
    n = sum(total.values())
    print(f"equal {n - len(differ)} of {n}")
    for template in sorted(total):
        stem = template.removesuffix(".jinja")
        print(f"{total[template] - bad[stem]:3d}/{total[template]:3d} {stem}")
    if len(sys.argv) > 1:
        for ident, why in differ.items():
            if sys.argv[1] in ident:
                print(ident, why[:600])


if __name__ == "__main__":
    main()
