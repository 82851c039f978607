"""Declarative command line + environment settings, llama-server style.

A settings class is a frozen pydantic model whose fields are declared with :func:`flag`.
:meth:`ProcessSettings.from_args` reads each field from, in order of precedence, its command
line flag, its environment variable, then its default -- as llama-server does.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from llamaq.spec_flags import FlagStatus, by_status, refused_envs, refused_names
from storage.models import DEFAULT_MODEL_FILE, url_model_name

TRUE_WORDS = frozenset({"true", "1", "on", "enabled", "yes"})
FALSE_WORDS = frozenset({"false", "0", "off", "disabled", "no"})


def flag(
    default: Any,
    *names: str,
    env: str | None = None,
    help: str,
    negative: tuple[str, ...] = (),
    choices: Iterable[Any] | None = None,
    sep: str | None = ",",
) -> Any:
    """Declare a settings field read from ``names`` (flags), then ``env``, then ``default``.

    ``negative`` flags set a bool field to False; ``choices`` restricts the value (or each item
    of a list); ``sep`` splits list values (``None``: one item per occurrence of the flag).
    """
    return Field(
        default=default,
        description=help,
        json_schema_extra={
            "flags": list(names),
            "env": env,
            "negative": list(negative),
            "choices": None if choices is None else list(choices),
            "sep": sep,
        },
    )


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
        )

    @property
    def is_switch(self) -> bool:
        return self.kind is bool and not self.is_list

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
            shown = (self.sep or ",").join(str(v) for v in value) or "none"
        else:
            shown = "none" if value is None else str(value) or '""'
        env = f" (env: {self.env})" if self.env else ""
        return f"{self.help} (default: {shown}){env}".replace("%", "%%")

    def metavar(self) -> str:
        if self.choices is not None:
            return "{" + ",".join(str(c) for c in self.choices) + "}"
        return self.name.upper()


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


class _RefusedAction(_NameAction):
    """A spec flag llamaq does not implement: stops the parse with the reason."""

    def __init__(self, option_strings: Sequence[str], dest: str, why: str = "", **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", **kw)
        self.why = why

    def given(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, name: str | None
    ) -> None:
        parser.error(f"{name} is not supported by llamaq: {self.why}")


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
        return [Option.from_field(name, info) for name, info in cls.model_fields.items()]

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
            parser.add_argument(*row.names, action=_RefusedAction, why=row.why,
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
            if env.get(name):
                parser.error(f"environment variable {name} ({row.label}) is not supported by "
                             f"llamaq: {row.why}")
        values: dict[str, Any] = {}
        for opt in cls.options():
            if opt.name in given:
                values[opt.name] = given[opt.name]
            elif opt.env is not None and opt.env in env:
                try:
                    values[opt.name] = opt.convert(env[opt.env])
                except argparse.ArgumentTypeError as exc:
                    parser.error(f"environment variable {opt.env}: {exc}")
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            parser.error(str(exc))


class CommonSettings(ProcessSettings):
    """Settings every llamaq process reads: the model, where files live, Redis, logging."""

    model: str | None = flag(None, "-m", "--model", env="LLAMA_ARG_MODEL",
                             help="model path to load")
    alias: list[str] = flag([], "-a", "--alias", env="LLAMA_ARG_ALIAS",
                            help="set model name aliases, comma-separated (to be used by API)")
    model_url: str | None = flag(None, "-mu", "--model-url", env="LLAMA_ARG_MODEL_URL",
                                 help="model download url (http/https; fetched once into the "
                                 "object store)")
    hf_repo: str | None = flag(None, "-hf", "-hfr", "--hf-repo", env="LLAMA_ARG_HF_REPO",
                               help="Hugging Face model repository <user>/<model>[:quant]")
    hf_file: str | None = flag(None, "-hff", "--hf-file", env="LLAMA_ARG_HF_FILE",
                               help="Hugging Face model file, overrides the quant in --hf-repo")
    hf_token: str | None = flag(None, "-hft", "--hf-token", env="HF_TOKEN",
                                help="Hugging Face access token")
    default_model: bool = flag(False, "--default-model", env="LLAMAQ_DEFAULT_MODEL",
                               negative=("--no-default-model",),
                               help="without -m or -hf, serve the default model (Gemma 3 270M) "
                               "instead of router mode (`scripts/up` sets it)")
    offline: bool = flag(False, "--offline", env="LLAMA_ARG_OFFLINE",
                         help="offline mode: forces use of cache, prevents network access")
    log_verbosity: int = flag(3, "-lv", "--verbosity", "--log-verbosity",
                              env="LLAMA_ARG_LOG_VERBOSITY",
                              help="verbosity threshold: 0 generic, 1 error, 2 warning, 3 info, "
                              "4 trace, 5 debug")
    log_file: str | None = flag(None, "--log-file", env="LLAMA_ARG_LOG_FILE",
                                help="log to file")
    verbose: bool = flag(False, "-v", "--verbose", "--log-verbose",
                         help="set verbosity level to infinity (log all messages); OpenAI "
                         "completion and chat responses carry a `__verbose` debug object")
    log_disable: bool = flag(False, "--log-disable", help="log disable")
    log_prefix: bool = flag(True, "--log-prefix", env="LLAMA_ARG_LOG_PREFIX",
                            negative=("--no-log-prefix",),
                            help="prefix in log messages (level and logger name)")
    log_timestamps: bool = flag(True, "--log-timestamps", env="LLAMA_ARG_LOG_TIMESTAMPS",
                                negative=("--no-log-timestamps",),
                                help="timestamps in log messages")
    prio: int = flag(0, "--prio", choices=(-1, 0, 1, 2, 3),
                     help="set process priority: low(-1), normal(0), medium(1), high(2), "
                     "realtime(3)")
    redis_url: str | None = flag(None, "--redis-url", env="LLAMAQ_REDIS_URL",
                                 help="Redis URL (none = start or use a local redis-server)")
    store_url: str = flag(".llamaq/store", "--store-url", env="LLAMAQ_STORE_URL",
                          help="object store: a folder, or s3://bucket/prefix")
    s3_endpoint_url: str | None = flag(None, "--s3-endpoint-url", env="LLAMAQ_S3_ENDPOINT_URL",
                                       help="S3 endpoint URL (MinIO, moto, ...)")
    cache_dir: str = flag(".llamaq/cache", "--cache-dir", env="LLAMAQ_CACHE_DIR",
                          help="folder where model files are materialised (the spec's "
                          "LLAMA_CACHE, when set, wins over LLAMAQ_CACHE_DIR)")
    drain_timeout: float = flag(30.0, "--drain-timeout", env="LLAMAQ_DRAIN_TIMEOUT",
                                help="on SIGTERM, how long running requests may finish (seconds):"
                                " a worker then ends the rest with an error event, an api pod "
                                "closes its open streams")

    def verbosity(self) -> int:
        """The log verbosity in force: -v means everything (llama-server's INT_MAX)."""
        return 99 if self.verbose else self.log_verbosity

    def debug_responses(self) -> bool:
        """Responses carry `__verbose` (llama-server: verbosity above 9)."""
        return self.verbosity() > 9

    def router_mode(self) -> bool:
        """No model named and no default-model opt-in: the api routes by each request's model
        and a worker waits to be told which model to load (the spec's router mode)."""
        return not (self.model or self.hf_repo or self.model_url or self.default_model)

    @classmethod
    def from_args(cls, argv: Sequence[str] | None = None,
                  environ: Mapping[str, str] | None = None) -> Self:
        """As ProcessSettings.from_args; then the spec's LLAMA_CACHE, when set, names the model
        cache unless --cache-dir is on the command line (it wins over LLAMAQ_CACHE_DIR)."""
        settings = super().from_args(argv, environ)
        args = sys.argv[1:] if argv is None else argv
        env = os.environ if environ is None else environ
        given = any(a == "--cache-dir" or a.startswith("--cache-dir=") for a in args)
        if env.get("LLAMA_CACHE") and not given:
            return settings.model_copy(update={"cache_dir": env["LLAMA_CACHE"]})
        return settings

    def model_cache_dir(self) -> Path:
        """Where model files are kept on this machine."""
        return Path(self.cache_dir).expanduser()

    def model_id(self) -> str:
        """The model's name in the API and in queue names: the first alias, else what -m or
        -hf named, else the file name of -mu, else the default model's file name."""
        if self.alias:
            return self.alias[0]
        if self.model_url and not (self.model or self.hf_repo):
            return url_model_name(self.model_url)
        return self.model or self.hf_repo or DEFAULT_MODEL_FILE


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
            raise FlagError(f"{name} is not supported by llamaq: {refused[name].why}")
        takers = [role for role, known in zip(roles, arities, strict=True) if name in known]
        if not takers:
            what = "flag" if word.startswith("-") else "argument"
            raise FlagError(f"unknown {what} {word!r} (`llamaq flags` lists every flag)")
        width = 2 if any(known[name] for known in arities if name in known) and "=" not in word \
            else 1
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


def _arities(settings: type[ProcessSettings]) -> dict[str, bool]:
    """Each flag name of `settings`, and whether it takes a value."""
    arities: dict[str, bool] = {}
    for option in settings.options():
        arities.update(dict.fromkeys(option.flags, not option.is_switch))
        arities.update(dict.fromkeys(option.negative, False))
    return arities
