"""Declarative command line + environment settings, llama-server style.

A settings class is a frozen pydantic model whose fields are declared with :func:`flag`
(scheduler/contract/flag_fields.py, re-exported here). :meth:`ProcessSettings.from_args` reads
each field from, in order of precedence, its command line flag, its environment variable, then
its default -- as llama-server does. A field declared with :func:`flag_group` holds a model whose
own flag() fields are flags of the settings too (the worker's sampling flags are
SamplingSettings' fields: one declaration for the flags and for the requests that override
them, as llama.cpp's common_params_sampling). How one field is parsed is
scheduler/config/options.py's; how one command line is split among roles,
scheduler/config/command_line.py's.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Self

from pydantic import ConfigDict, ValidationError

from scheduler.config.model_presets import MODEL_PRESETS
from scheduler.config.options import Option, declared_with_flag, group_model
from scheduler.config.spec_flags import (
    FlagStatus,
    SpecFlag,
    by_status,
    no_env,
    refusal,
    refused_envs,
)
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.flag_fields import flag, flag_group

__all__ = [
    "PRESET_TRUE",
    "PresetKey",
    "ProcessSettings",
    "flag",
    "flag_group",
    "preset_key",
    "spec_flag_of_a_role",
]


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


class ProcessSettings(DeferredModel):
    """Base of every process's settings: flag over env over default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prog: ClassVar[str] = "llamaq"

    @classmethod
    def options(cls) -> list[Option]:
        found: list[Option] = []
        for name, info in cls.model_fields.items():
            group = group_model(info)
            if group is None:
                found.append(Option.from_field(name, info))
                continue
            found.extend(Option.from_field(f"{name}.{sub}", sub_info)
                         for sub, sub_info in group.model_fields.items()
                         if declared_with_flag(sub_info))
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
        for opt in cls.options():  # --*-default model presets: under what was given
            if opt.flags[0] in MODEL_PRESETS and values.get(opt.name):
                try:
                    _apply_preset(cls, values, MODEL_PRESETS[opt.flags[0]])
                except argparse.ArgumentTypeError as exc:
                    parser.error(f"{opt.flags[0]}: {exc}")
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            parser.error(str(exc))


def _apply_preset(settings: type[ProcessSettings], values: dict[str, Any],
                  options: Mapping[str, str]) -> None:
    """The keys of a model preset this role takes, where `values` has none."""
    for key, value in options.items():
        found = preset_key(settings, key)
        if found is None:
            continue  # another role's
        group, _, field = found.option.name.partition(".")
        if (field and field in values.get(group, {})) or (not field and group in values):
            continue
        _put(values, found.option.name, found.switch_on(value) if found.option.is_switch
             else found.option.convert(value))


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
    """Whether a preset key is a working spec flag (of some role: the others leave it), by a
    name without dashes or by its environment variable name (the spec's valid keys)."""
    rows = by_status(FlagStatus.WORKS)
    names = {name for row in rows for name in row.names}
    return f"--{key}" in names or f"-{key}" in names or key in {row.env for row in rows}
