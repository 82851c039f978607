"""TextStream: whole UTF-8 characters only, stop strings cut out, open stops held back."""

from __future__ import annotations

import subprocess
import sys

import pytest

from worker.engine.textstream import TextStream


def feed(stream: TextStream, pieces: list[bytes]) -> list[str]:
    return [stream.push(p) for p in pieces]


@pytest.mark.process
def test_textstream_and_slots_import_without_llama_cpp() -> None:
    code = (
        "import sys\n"
        "sys.modules['llama_cpp'] = None\n"
        "import worker.engine.textstream, worker.kv.slots\n"
        "assert sys.modules['llama_cpp'] is None\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def test_plain_text_passes_through() -> None:
    stream = TextStream([])
    assert feed(stream, [b"Hello", b" ", b"world"]) == ["Hello", " ", "world"]
    assert stream.finish() == ""
    assert stream.text == "Hello world"
    assert stream.stopping_word == ""


def test_two_byte_character_split_in_two_pushes() -> None:
    stream = TextStream([])
    data = "é".encode()
    assert len(data) == 2
    assert feed(stream, [data[:1], data[1:]]) == ["", "é"]
    assert stream.finish() == ""
    assert stream.text == "é"


def test_four_byte_emoji_split_in_four_pushes() -> None:
    stream = TextStream([])
    data = "a😀b".encode()
    pieces = [data[i : i + 1] for i in range(len(data))]
    out = feed(stream, pieces)
    assert out == ["a", "", "", "", "😀", "b"]
    assert "\ufffd" not in "".join(out)
    assert stream.finish() == ""
    assert stream.text == "a😀b"


def test_every_byte_split_of_mixed_text_reassembles_exactly() -> None:
    text = "héllo wörld 日本 😀!"
    data = text.encode()
    for cut in range(1, len(data)):
        stream = TextStream([])
        out = stream.push(data[:cut]) + stream.push(data[cut:]) + stream.finish()
        assert out == text, cut


def test_incomplete_character_at_finish_is_replaced() -> None:
    stream = TextStream([])
    assert stream.push(b"ok" + "é".encode()[:1]) == "ok"
    assert stream.finish() == "\ufffd"


def test_full_stop_in_one_push_cuts_text() -> None:
    stream = TextStream(["World"])
    assert stream.push(b"Hello World and more") == "Hello "
    assert stream.stopping_word == "World"
    assert stream.text == "Hello "
    assert stream.finish() == ""


def test_partial_stop_held_then_completed() -> None:
    stream = TextStream(["World"])
    assert stream.push(b"Hello Wo") == "Hello "
    assert stream.push(b"rld") == ""
    assert stream.stopping_word == "World"
    assert stream.text == "Hello "
    assert stream.finish() == ""


def test_partial_stop_held_then_released() -> None:
    stream = TextStream(["World"])
    assert stream.push(b"Hello Wo") == "Hello "
    assert stream.push(b"nder") == "Wonder"
    assert stream.stopping_word == ""
    assert stream.finish() == ""
    assert stream.text == "Hello Wonder"


def test_stop_spanning_several_pushes() -> None:
    stream = TextStream(["<|end|>"])
    out = feed(stream, [b"answer", b" <", b"|e", b"n", b"d", b"|>"])
    assert "".join(out) == "answer "
    assert stream.stopping_word == "<|end|>"
    assert stream.text == "answer "
    assert stream.finish() == ""


def test_stop_split_inside_a_multibyte_character() -> None:
    stream = TextStream(["ß!"])
    data = "aß!".encode()
    out = feed(stream, [data[i : i + 1] for i in range(len(data))])
    assert "".join(out) == "a"
    assert stream.stopping_word == "ß!"


def test_repeated_prefix_of_stop_is_released_up_to_the_real_match() -> None:
    stream = TextStream(["xyz"])
    out = feed(stream, [b"xy", b"x", b"yz"])
    assert out == ["", "xy", ""]
    assert stream.text == "xy"
    assert stream.stopping_word == "xyz"


def test_finish_flushes_held_text_when_no_stop_matched() -> None:
    stream = TextStream(["World"])
    assert stream.push(b"Hello Wor") == "Hello "
    assert stream.finish() == "Wor"
    assert stream.stopping_word == ""
    assert stream.text == "Hello Wor"


def test_text_never_sent_twice() -> None:
    stream = TextStream(["stop"])
    pieces = [b"s", b"t", b"o", b"x", b"s", b"to", b"p"]
    out = [*feed(stream, pieces), stream.finish()]
    assert "".join(out) == "stox"
    assert stream.text == "stox"


def test_empty_stop_strings_are_ignored() -> None:
    stream = TextStream(["", "END", ""])
    assert stream.push(b"abc") == "abc"
    assert stream.push(b" END") == " "
    assert stream.stopping_word == "END"
    only_empty = TextStream([""])
    assert only_empty.push(b"abc") == "abc"
    assert only_empty.stopping_word == ""
    assert only_empty.finish() == ""


def test_several_stops_the_one_that_completes_first_wins() -> None:
    stream = TextStream(["beta", "alpha"])
    assert stream.push(b"one al") == "one "
    assert stream.push(b"pha") == ""
    assert stream.stopping_word == "alpha"
    assert stream.text == "one "
    assert stream.finish() == ""


def test_held_stop_completed_by_a_push_that_holds_another_stop() -> None:
    stream = TextStream(["beta", "alpha"])
    assert stream.push(b"one al") == "one "
    assert stream.push(b"pha two beta") == ""
    assert stream.stopping_word == "alpha"
    assert stream.text == "one "


def test_several_stops_the_longest_partial_is_held() -> None:
    stream = TextStream(["ab", "abcd"])
    assert stream.push(b"xa") == "x"
    assert stream.push(b"c") == "ac"  # neither "ab" nor "abcd" can still match
    assert stream.stopping_word == ""


def test_stop_that_is_prefix_of_another_in_same_push() -> None:
    stream = TextStream(["Wor", "World"])
    assert stream.push(b"Hello World") == "Hello "
    assert stream.stopping_word in ("Wor", "World")
    assert stream.text == "Hello "


def test_several_stops_in_one_push_cut_at_the_earliest() -> None:
    stream = TextStream(["lo", "He"])
    out = stream.push(b"Hello")
    assert stream.text == ""
    assert out == ""
    assert stream.stopping_word == "He"


def test_text_never_contains_any_stop_string() -> None:
    stops = ["World", "lo W"]
    stream = TextStream(stops)
    out = stream.push(b"Hello World") + stream.finish()
    assert not any(stop in out for stop in stops)
    assert out == "Hel"
