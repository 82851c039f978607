"""One settings field as the command-line parser sees it (`Option`): its flags, environment
variable, type, choices and default, how one of its values is converted and checked, and its
--help line. Read from the pydantic fields declared with `flag` (scheduler/contract/flag_fields.py);
the parser itself is scheduler/config/settings.py's.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

TRUE_WORDS = frozenset({"true", "1", "on", "enabled", "yes"})
FALSE_WORDS = frozenset({"false", "0", "off", "disabled", "no"})


def group_model(info: FieldInfo) -> type[BaseModel] | None:
    """The model of a field declared with `flag_group` (its fields are flags too), else None."""
    extra = info.json_schema_extra
    if isinstance(extra, dict) and extra.get("flag_group"):
        annotation = info.annotation
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        return annotation
    return None


def declared_with_flag(info: FieldInfo) -> bool:
    """Whether a field was declared with `flag` (a field of a group declared otherwise is not
    a flag: it keeps its default)."""
    extra = info.json_schema_extra
    return isinstance(extra, dict) and "flags" in extra


def parse_bool(raw: str) -> bool:
    """Read a boolean the way llama-server reads one from the environment."""
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(
        f"invalid boolean {raw!r} (use one of: true, 1, on, enabled / false, 0, off, disabled)"
    )


def _scalar(kind: type) -> Callable[[str], Any]:
    if kind is bool:
        return parse_bool

    def convert(raw: str) -> Any:
        try:
            return kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {raw!r}") from None

    return convert


def _printable(value: object) -> str:
    """A default as --help shows it: escapes for control characters (a newline breaker)."""
    return str(value).encode("unicode_escape").decode("ascii")


def _names(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


@dataclass(frozen=True)
class Option:
    """One settings field as the parser sees it."""

    name: str
    flags: tuple[str, ...]
    env: str | None
    negative: tuple[str, ...]
    choices: tuple[Any, ...] | None
    sep: str | None
    kind: type
    is_list: bool
    default: Any
    help: str
    nargs: int = 1
    """Values one occurrence of the flag takes (more than 1: a list field, `flag(nargs=)`)."""

    @classmethod
    def from_field(cls, name: str, info: FieldInfo) -> Option:
        extra = info.json_schema_extra
        if not isinstance(extra, dict) or "flags" not in extra:
            raise TypeError(f"settings field {name!r} must be declared with flag()")
        annotation: Any = info.annotation
        if get_origin(annotation) in (Union, types.UnionType):
            (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
        is_list = get_origin(annotation) is list
        kind = get_args(annotation)[0] if is_list else annotation
        if kind not in (bool, int, float, str):
            raise TypeError(f"settings field {name!r}: unsupported type {info.annotation!r}")
        choices = extra["choices"]
        return cls(
            name=name,
            flags=_names(extra["flags"]),
            env=str(extra["env"]) if extra["env"] else None,
            negative=_names(extra["negative"]),
            choices=tuple(choices) if isinstance(choices, list) else None,
            sep=str(extra["sep"]) if extra["sep"] else None,
            kind=kind,
            is_list=is_list,
            default=info.get_default(call_default_factory=True),
            help=info.description or "",
            nargs=int(str(extra.get("nargs") or 1)),
        )

    @property
    def is_switch(self) -> bool:
        return self.kind is bool and not self.is_list

    def convert_item(self, raw: str) -> Any:
        """Convert one of the values of a flag that takes several (`nargs`)."""
        return self._check(_scalar(self.kind)(raw))

    def convert(self, raw: str) -> Any:
        """Convert one flag argument or environment value (raises ArgumentTypeError)."""
        scalar = _scalar(self.kind)
        if not self.is_list:
            return self._check(scalar(raw))
        parts = [raw] if self.sep is None else [p.strip() for p in raw.split(self.sep)]
        return [self._check(scalar(p)) for p in parts if p]

    def _check(self, value: Any) -> Any:
        if self.choices is not None and value not in self.choices:
            allowed = ", ".join(str(c) for c in self.choices)
            raise argparse.ArgumentTypeError(f"invalid choice {value!r} (choose from {allowed})")
        return value

    def help_text(self) -> str:
        """The field's description, then its default and its environment variable."""
        value = self.default
        if self.is_switch and value is not None:
            shown = "enabled" if value else "disabled"
        elif isinstance(value, list):
            shown = (self.sep or ",").join(_printable(v) for v in value) or "none"
        else:
            shown = "none" if value is None else str(value) or '""'
        env = f" (env: {self.env})" if self.env else ""
        return f"{self.help} (default: {shown}){env}".replace("%", "%%")

    def metavar(self) -> str:
        if self.choices is not None:
            return "{" + ",".join(str(c) for c in self.choices) + "}"
        return self.name.rpartition(".")[2].upper()
