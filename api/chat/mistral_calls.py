"""Mistral's tool calls, after `[TOOL_CALLS]`: a JSON array or object of calls, or
`name[CALL_ID]id[ARGS]{...}` (the id optional). The output parser (api/chat/parsing.py) hands
the text on from the marker until this reader has decided: calls, or not a call."""

from __future__ import annotations

from api.chat.partial_calls import cut_short_calls, partial_arguments
from api.chat.tool_formats import (
    WHITESPACE,
    JsonScanner,
    ParsedCall,
    call_from_object,
    calls_from_json,
    load_json,
    partial_suffix,
)

ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
MAX_HEADER = 256
"""Longest `name[CALL_ID]id` before `[ARGS]`: past it, not a call."""


class MistralCalls:
    def __init__(self, start: int) -> None:
        """`start`: where the text after `[TOOL_CALLS]` begins."""
        self._step = "begin"  # then "json" (an array or object) or "name", then "args"
        self._pos = start
        self._header: tuple[str, str | None] = ("", None)
        self._scanner = JsonScanner()
        self._scan_from = start

    def read(self, text: str, final: bool) -> tuple[list[ParsedCall], int] | None:
        """(the calls, where they end) once decided (no calls: the text is not a call), or
        None while it waits for more text (`final`: there is no more)."""
        while True:
            if self._step == "begin":
                while self._pos < len(text) and text[self._pos] in WHITESPACE:
                    self._pos += 1
                if self._pos == len(text):
                    return ([], self._pos) if final else None
                self._scanner = JsonScanner()
                self._scan_from = self._pos
                self._step = "json" if text[self._pos] in "[{" else "name"
            elif self._step == "name":
                named = self._read_name(text, final)
                if named is None:
                    return None
                if not named:
                    return [], self._pos
            else:
                return self._read_value(text, final)

    def _read_name(self, text: str, final: bool) -> bool | None:
        """True: `name[CALL_ID]id[ARGS]` read, the arguments follow; False: not a call; None:
        wait."""
        args = text.find(ARGS, self._scan_from)
        if args >= 0:
            header = text[self._scan_from : args]
        else:
            hold = partial_suffix(text, self._scan_from, (ARGS, CALL_ID))
            header = text[self._scan_from : len(text) - hold]
        name, _, call_id = header.partition(CALL_ID)
        valid = all(c.isalnum() or c in "_.-" for c in name + call_id)
        if not valid or len(header) > MAX_HEADER or (args < 0 and final):
            return False
        if args < 0:
            return None
        if not name:
            return False
        self._header = (name, call_id or None)
        self._scanner = JsonScanner()
        self._scan_from = args + len(ARGS)
        self._step = "args"
        return True

    def _read_value(self, text: str, final: bool) -> tuple[list[ParsedCall], int] | None:
        scanner = self._scanner
        scanner.feed(text[self._scan_from + scanner.consumed :])
        if scanner.end is None:
            return ([], self._pos) if scanner.failed or final else None
        raw = text[self._scan_from : self._scan_from + scanner.end]
        try:
            value = load_json(raw)
        except ValueError:
            value = None
        if self._step == "json":
            calls = calls_from_json(value)
        else:
            name, call_id = self._header
            call = call_from_object({"name": name, "arguments": value, "id": call_id})
            calls = [call] if call else None
        return calls or [], self._scan_from + len(raw)

    @property
    def arguments_broken(self) -> bool:
        """A named call's arguments are not JSON: llama.cpp's lenient parse drops the call."""
        return self._step == "args" and self._scanner.failed

    def cut_short(self, text: str) -> list[ParsedCall] | None:
        """Where the output ended before the calls did (`read` found none): as llama.cpp's
        lenient parse, the call once named (its arguments as far as they are certain), [] before
        that or where its arguments are broken; None where the text is not the start of a call
        (it stays content)."""
        rest = text[self._scan_from :]
        if self._step == "json":
            return cut_short_calls(rest)
        if self._step == "args":
            name, call_id = self._header
            arguments = partial_arguments(rest) if rest.strip(WHITESPACE) else ("", "")
            # broken arguments: the call is dropped, as llama.cpp's lenient parse drops it
            return [] if arguments is None else [ParsedCall(name, arguments[0], call_id)]
        header = rest[: len(rest) - partial_suffix(rest, 0, (ARGS, CALL_ID))]
        name, _, call_id = header.partition(CALL_ID)
        valid = all(c.isalnum() or c in "_.-" for c in name + call_id)
        return [] if valid and len(header) <= MAX_HEADER else None
