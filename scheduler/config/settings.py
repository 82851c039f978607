"""Declarative command line + environment settings, llama-server style.

A settings class is a frozen pydantic model whose fields are declared with :func:`flag`
(scheduler/contract/flag_fields.py, re-exported here). :meth:`ProcessSettings.from_args` reads
each field from, in order of precedence, its command line flag, its environment variable, then
its default -- as llama-server does. A field declared
with :func:`flag_group` holds a model whose own flag() fields are flags of the settings too
(the worker's sampling flags are SamplingSettings' fields: one declaration for the flags and
for the requests that override them, as llama.cpp's common_params_sampling).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from scheduler.config.spec_flags import (
    FlagStatus,
    SpecFlag,
    by_status,
    no_env,
    refusal,
    refused_envs,
    refused_names,
)
from scheduler.contract.flag_fields import flag, flag_group

__all__ = [
    "PRESET_TRUE",
    "FlagError",
    "PresetKey",
    "ProcessSettings",
    "flag",
    "flag_group",
    "parse_bool",
    "preset_key",
    "select_args",
    "spec_flag_of_a_role",
    "split_args",
]

TRUE_WORDS = frozenset({"true", "1", "on", "enabled", "yes"})
FALSE_WORDS = frozenset({"false", "0", "off", "disabled", "no"})


def _group_model(info: FieldInfo) -> type[BaseModel] | None:
    extra = info.json_schema_extra
    if isinstance(extra, dict) and extra.get("flag_group"):
        annotation = info.annotation
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        return annotation
    return None


def _declared_with_flag(info: FieldInfo) -> bool:
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


class _HelpFormatter(argparse.HelpFormatter):
    """Lists every name of an option, then its value placeholder once: ``-c, --ctx-size N``."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        value = self._format_args(action, action.dest.upper())
        return f"{', '.join(action.option_strings)} {value}"


class _NameAction(argparse.Action):
    """An action that acts on which of its option names was given (never on a value)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self.given(parser, namespace, option_string)

    def given(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, name: str | None
    ) -> None:
        raise NotImplementedError


class _SwitchAction(_NameAction):
    """A bool flag without a value: its own names set True, its negative names False."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, negative: Sequence[str] = (), **kw: Any
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, **kw)
        self.negative = tuple(negative)

    def given(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, name: str | None
    ) -> None:
        setattr(namespace, self.dest, name not in self.negative)


class _RefusedAction(argparse.Action):
    """A spec flag llamaq does not implement: stops the parse with the reason, unless it only
    turns the feature off (`SpecFlag.is_off`): then it does nothing."""

    def __init__(self, option_strings: Sequence[str], dest: str, row: SpecFlag,
                 **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0 if row.switch or row.off_names else "?",
                         **kw)
        self.row = row

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        value = values if isinstance(values, str) else None
        if not self.row.is_off(option_string or "", value):
            parser.error(refusal(self.row, option_string or self.row.label))


def _version() -> str:
    try:
        return f"llamaq {importlib.metadata.version('llamaq')}"
    except importlib.metadata.PackageNotFoundError:
        return "llamaq (not installed)"


class _ExactParser(argparse.ArgumentParser):
    """Matches option names exactly: `-c` is never read as a prefix of `-cl` or `-cms`."""

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        return []


class ProcessSettings(BaseModel):
    """Base of every process's settings: flag over env over default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prog: ClassVar[str] = "llamaq"

    @classmethod
    def options(cls) -> list[Option]:
        found: list[Option] = []
        for name, info in cls.model_fields.items():
            group = _group_model(info)
            if group is None:
                found.append(Option.from_field(name, info))
                continue
            found.extend(Option.from_field(f"{name}.{sub}", sub_info)
                         for sub, sub_info in group.model_fields.items()
                         if _declared_with_flag(sub_info))
        return found

    def with_preset(self, options: Mapping[str, str]) -> Self:
        """This role's settings for one model of a preset (`--models-preset`): the options this
        role takes, for the fields its own command line and environment left unset (llama-
        server's precedence: the command line, then the model's section, then `[*]`, which
        the catalog has merged). Options of other roles are theirs; a bad value raises
        ValueError naming the key."""
        update: dict[str, Any] = {}
        for key, value in options.items():
            found = preset_key(type(self), key)
            if found is None or "." in found.option.name \
                    or found.option.name in self.model_fields_set:
                continue
            try:
                update[found.option.name] = (found.switch_on(value) if found.option.is_switch
                                             else found.option.convert(value))
            except argparse.ArgumentTypeError as exc:
                raise ValueError(f"preset option {key!r}: {exc}") from None
        return self.model_copy(update=update) if update else self

    @classmethod
    def build_parser(cls, prog: str) -> argparse.ArgumentParser:
        parser = _ExactParser(
            prog=prog,
            usage="%(prog)s [options]",
            formatter_class=_HelpFormatter,
            description=(cls.__doc__ or "").strip() or None,
            allow_abbrev=False,
            add_help=False,
            argument_default=argparse.SUPPRESS,
        )
        parser.add_argument("-h", "--help", "--usage", action="help",
                            help="print usage and exit")
        parser.add_argument("--version", action="version", version=_version(),
                            help="show version and exit")
        for row in by_status(FlagStatus.REFUSED):
            parser.add_argument(*row.names, action=_RefusedAction, row=row,
                                dest=argparse.SUPPRESS, help=argparse.SUPPRESS)
        for opt in cls.options():
            if opt.is_switch:
                parser.add_argument(
                    *opt.flags,
                    *opt.negative,
                    dest=opt.name,
                    action=_SwitchAction,
                    negative=opt.negative,
                    help=opt.help_text(),
                )
            elif opt.nargs > 1:
                parser.add_argument(
                    *opt.flags,
                    dest=opt.name,
                    type=opt.convert_item,
                    nargs=opt.nargs,
                    metavar=opt.metavar(),
                    help=opt.help_text(),
                )
            else:
                parser.add_argument(
                    *opt.flags,
                    dest=opt.name,
                    type=opt.convert,
                    action="extend" if opt.is_list else "store",
                    metavar=opt.metavar(),
                    help=opt.help_text(),
                )
        return parser

    @classmethod
    def from_args(
        cls,
        argv: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Self:
        """Parse ``argv`` (default: ``sys.argv[1:]``) over ``environ`` (default: os.environ).

        Bad values exit with status 2 and a message naming the flag or environment variable.
        """
        parser = cls.build_parser(cls.prog)
        given = vars(parser.parse_args(argv))
        env = os.environ if environ is None else environ
        for name, row in refused_envs().items():
            if env.get(name) and not row.env_is_off(env):
                parser.error(f"environment variable {name} ({row.label}) is not supported by "
                             f"llamaq: {row.why}")
        values: dict[str, Any] = {}
        for opt in cls.options():
            if opt.name in given:
                _put(values, opt.name, given[opt.name])
            elif opt.is_switch and opt.negative and opt.env and no_env(opt.env) in env \
                    and opt.env.startswith("LLAMA_ARG_"):
                _put(values, opt.name, False)  # LLAMA_ARG_NO_<X>, whatever its value (llama.cpp)
            elif opt.env is not None and opt.env in env:
                try:
                    _put(values, opt.name, opt.convert(env[opt.env]))
                except argparse.ArgumentTypeError as exc:
                    parser.error(f"environment variable {opt.env}: {exc}")
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            parser.error(str(exc))


def _put(values: dict[str, Any], name: str, value: Any) -> None:
    """Set `name` (``field`` or ``group.field``) in the values a settings class validates."""
    group, _, field = name.partition(".")
    if field:
        values.setdefault(group, {})[field] = value
    else:
        values[name] = value


PRESET_TRUE = ("true", "1", "on", "yes", "enabled")
"""A preset's true values of a switch."""


class PresetKey(NamedTuple):
    """A preset key read as a flag of one role: the option and the flag name it stands for."""

    option: Option
    name: str

    def switch_on(self, value: str) -> bool:
        """A switch's value (true/false); a negative name inverts it."""
        return (value.strip().lower() in PRESET_TRUE) != (self.name in self.option.negative)


def preset_key(settings: type[ProcessSettings], key: str) -> PresetKey | None:
    """The option of `settings` a preset key names (a long name without dashes, a short name,
    or an environment variable name), or None when the role takes no such flag."""
    for option in settings.options():
        if key == option.env:
            return PresetKey(option, option.flags[0])
        for name in (f"--{key}", f"-{key}"):
            if name in option.flags or name in option.negative:
                return PresetKey(option, name)
    return None


def spec_flag_of_a_role(key: str) -> bool:
    """Whether a preset key is a working spec flag (of some role: the others leave it)."""
    names = {name for row in by_status(FlagStatus.WORKS) for name in row.names}
    return f"--{key}" in names or f"-{key}" in names


class FlagError(ValueError):
    """A command line that no role takes: an unknown or refused flag, or a missing value."""


def split_args(argv: Sequence[str],
               roles: Sequence[type[ProcessSettings]]) -> dict[type[ProcessSettings], list[str]]:
    """`llamaq up` hands one command line to several processes: each flag goes to every role
    that takes it. A flag no role takes, or one llamaq refuses, raises FlagError naming it."""
    arities = [_arities(role) for role in roles]
    refused = refused_names()
    parts: dict[type[ProcessSettings], list[str]] = {role: [] for role in roles}
    i = 0
    while i < len(argv):
        word = argv[i]
        name = word.split("=", 1)[0]
        if name in refused:
            row = refused[name]
            takes_value = not (row.switch or row.off_names) and "=" not in word
            value = word.split("=", 1)[1] if "=" in word else (
                argv[i + 1] if takes_value and i + 1 < len(argv) else None)
            if not row.is_off(name, value):
                raise FlagError(refusal(row, name))
            i += 2 if takes_value else 1  # an off switch of an unbuilt feature: a no-op
            continue
        takers = [role for role, known in zip(roles, arities, strict=True) if name in known]
        if not takers:
            what = "flag" if word.startswith("-") else "argument"
            raise FlagError(f"unknown {what} {word!r} (`llamaq flags` lists every flag)")
        n_values = max(known[name] for known in arities if name in known)
        width = 1 if n_values == 1 and "=" in word else 1 + n_values
        if i + width > len(argv):
            raise FlagError(f"{name} expects a value")
        for role in takers:
            parts[role].extend(argv[i:i + width])
        i += width
    return parts


def select_args(argv: Sequence[str], keep: type[ProcessSettings],
                among: Sequence[type[ProcessSettings]]) -> list[str]:
    """The part of a command line (valid for the union of `among`) that `keep` understands."""
    return split_args(argv, among)[keep]


def _arities(settings: type[ProcessSettings]) -> dict[str, int]:
    """Each flag name of `settings`, and how many values it takes."""
    arities: dict[str, int] = {}
    for option in settings.options():
        arities.update(dict.fromkeys(option.flags, 0 if option.is_switch else option.nargs))
        arities.update(dict.fromkeys(option.negative, 0))
    return arities
