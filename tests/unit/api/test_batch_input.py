"""Reading a batch input file: the rules that fail a whole batch, one by one."""

from __future__ import annotations

import gc
import json
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from api.batch.input import BatchInput, BatchLines, read_input_file, read_lines
from scheduler.batches import BatchPlan

URL = "/v1/chat/completions"


def line(custom_id: str = "a", **changes: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"custom_id": custom_id, "method": "POST", "url": URL,
                            "body": {"model": "m", "messages": []}}
    item.update(changes)
    return item


def jsonl(*items: Any) -> bytes:
    return "".join(json.dumps(i) + "\n" for i in items).encode()


def read_input(data: bytes) -> BatchInput:
    path = Path(tempfile.mkdtemp(prefix="llamaq-test-batch-")) / "input.jsonl"
    path.write_bytes(data)
    return read_input_file(path, URL)


def ids(lines: BatchLines) -> list[str]:
    return [item.custom_id for item in lines.take(range(len(lines)))]


def codes(data: bytes) -> list[tuple[str, int | None]]:
    return [(e.code, e.line) for e in read_input(data).errors]


def test_good_lines_in_order_blank_lines_skipped() -> None:
    parsed = read_input(jsonl(line("x"), line("y")) + b"\n\n" + jsonl(line("z")))
    assert not parsed.errors and parsed.model == "m"
    assert ids(parsed.lines) == ["x", "y", "z"]
    assert parsed.lines.take([2])[0].body == line("z")["body"]


def test_each_rule_names_its_line() -> None:
    assert codes(jsonl(line()) + b"{nope\n") == [("invalid_json_line", 2)]
    assert codes(b"[1, 2]\n") == [("invalid_json_line", 1)]
    assert codes(b'{"x": NaN}\n') == [("invalid_json_line", 1)]
    assert codes(jsonl(line("a"), line("a"))) == [("duplicate_custom_id", 2)]
    assert codes(jsonl(line(url="/v1/completions"))) == [("invalid_url", 1)]
    assert codes(jsonl(line(method="GET"))) == [("invalid_method", 1)]
    assert codes(jsonl({"method": "POST", "url": URL, "body": {}})) == [
        ("missing_required_parameter", 1)]
    assert codes(jsonl(line(body=[1]))) == [("missing_required_parameter", 1)]
    assert codes(jsonl(line(extra=1))) == [("invalid_request", 1)]
    other = line("b", body={"model": "n"})
    assert codes(jsonl(line("a"), other)) == [("mismatched_model", 2)]
    assert codes(b"") == [("empty_file", None)]


def test_errors_are_collected_and_no_line_runs() -> None:
    parsed = read_input(jsonl(line("a"), line("a")) + b"junk\n")
    assert [e.code for e in parsed.errors] == ["duplicate_custom_id", "invalid_json_line"]
    assert len(parsed.lines) == 0


def test_too_many_lines(monkeypatch: Any) -> None:
    monkeypatch.setattr("api.batch.input.MAX_LINES", 3)
    assert codes(jsonl(*(line(str(i)) for i in range(4)))) == [("too_many_requests", None)]


def test_plan_cuts_lines_into_chunks() -> None:
    plan = BatchPlan(lines=10, chunk_size=4)
    assert plan.n_chunks == 3
    assert [list(plan.chunk_lines(i)) for i in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert BatchPlan().n_chunks == 0


def test_embedding_lines_make_jobs_of_bounded_size(monkeypatch: Any) -> None:
    from api.batch import embeddings
    from api.batch.input import BatchLine
    from api.endpoints.embeddings.protocol import EmbeddingsRequest

    monkeypatch.setattr(embeddings, "MAX_JOB_INPUTS", 4)

    def member(i: int, n: int) -> tuple[int, embeddings.EmbeddingLine]:
        body = {"input": [f"t{k}" for k in range(n)]}
        request = EmbeddingsRequest.model_validate(body)
        return i, embeddings.EmbeddingLine(BatchLine(str(i), body), request,
                                           request.to_job("m").inputs)

    jobs = embeddings._jobs_of([member(0, 1), member(1, 3), member(2, 2), member(3, 9),
                                member(4, 1)])
    assert [[i for i, _ in job] for job in jobs] == [[0, 1], [2], [3], [4]]


def test_a_file_is_read_line_by_line_and_stops_past_the_limit(monkeypatch: Any,
                                                               tmp_path: Any) -> None:
    """The driver reads the input from a file as it goes (issue 27, hole 6), and past
    MAX_LINES requests it stops reading (the rest is never parsed)."""
    path = tmp_path / "input.jsonl"
    path.write_bytes(jsonl(line("x"), line("y")) + b"\n" + jsonl(line("z")))
    assert ids(read_input_file(path, URL).lines) == ["x", "y", "z"]
    monkeypatch.setattr("api.batch.input.MAX_LINES", 3)
    consumed = 0

    def lines() -> Any:
        nonlocal consumed
        for i in range(10_000):
            consumed += 1
            yield jsonl(line(str(i)))

    parsed = read_lines(lines(), URL, BatchLines())
    assert [(e.code, e.line) for e in parsed.errors] == [("too_many_requests", None)]
    assert not parsed.lines and consumed == 4


def test_read_lines_are_offsets_not_requests(tmp_path: Path) -> None:
    """Once read, an input holds offsets into its file, not its requests (issue 27, hole 6):
    20,000 lines of 1 KB requests hold well under 1 MiB; a chunk's lines are read back."""
    path = tmp_path / "input.jsonl"
    with path.open("w") as out:
        for i in range(20_000):
            out.write(json.dumps(line(f"req-{i}", body={"model": "m", "messages": [
                {"role": "user", "content": f"{i} " + "x" * 900}]})) + "\n")
    gc.collect()
    tracemalloc.start()
    parsed = read_input_file(path, URL)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert not parsed.errors and len(parsed.lines) == 20_000
    assert held < 1 << 20, f"{held} bytes held for a {path.stat().st_size}-byte input"
    taken = parsed.lines.take(range(19_990, 20_000))
    assert [item.custom_id for item in taken] == [f"req-{i}" for i in range(19_990, 20_000)]
    assert taken[0].body["messages"][0]["content"].startswith("19990 x")


def test_every_endpoint_a_batch_runs_has_its_runner() -> None:
    from api.batch.lines import HANDLERS
    from api.endpoints.batches.served import CHUNK_ENDPOINTS, LINE_ENDPOINTS, SERVED

    assert set(HANDLERS) == set(LINE_ENDPOINTS)
    assert set(SERVED) == {*LINE_ENDPOINTS, *CHUNK_ENDPOINTS}
