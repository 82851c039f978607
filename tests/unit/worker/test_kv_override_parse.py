"""--override-kv's parsing (llama.cpp's string_parse_kv_override and parse_csv_row)."""

from __future__ import annotations

import pytest

from worker.runtime.kv_overrides import KvOverride, kv_override_array, parse_kv_overrides
from worker.runtime.settings import WorkerSettings


def test_items_of_every_type_and_occurrence() -> None:
    parsed = parse_kv_overrides(["a.b=bool:false,c=int:12x", 'd=float:0.5,"e=str:x,y"'])
    assert parsed == [KvOverride("a.b", False), KvOverride("c", 12), KvOverride("d", 0.5),
                      KvOverride("e", "x,y")]
    array = kv_override_array(parsed)
    assert [slot.key for slot in array] == [b"a.b", b"c", b"d", b"e", b""]
    assert getattr(array[3].value, "val_str") == b"x,y"  # noqa: B009 (a union: typed loosely)


@pytest.mark.parametrize(("item", "message"), [
    ("novalue", "malformed KV override 'novalue'"),
    ("k=long:1", "invalid type for KV override 'k=long:1'"),
    ("k=bool:yes", "invalid boolean value for KV override 'k=bool:yes'"),
    ("k=str:" + "x" * 128, "value cannot exceed 127 chars"),
    ("x" * 128 + "=int:1", "malformed KV override"),
])
def test_bad_items(item: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_kv_overrides([item])


def test_the_worker_refuses_a_bad_override_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        WorkerSettings.from_args(["--override-kv", "k=bool:maybe"], environ={})
    assert exited.value.code == 2
    assert "invalid boolean value for KV override 'k=bool:maybe'" in capsys.readouterr().err
    assert WorkerSettings.from_args(["--override-kv", "k=int:1", "--override-kv", "j=str:s"],
                                    environ={}).override_kv == ["k=int:1", "j=str:s"]
