"""How a pydantic field declares the command-line flag and environment variable it is read from.

A field declared with :func:`flag` holds its flag names, environment variable and default in one
place; the settings framework (scheduler/config/settings.py) reads them to build a process's
command line. It lives in the contract because the contract's own SamplingSettings declares the
worker's sampling flags this way (one declaration for the flags and for the requests that
override them), and the contract imports nothing of llamaq outside itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field


def flag(
    default: Any,
    *names: str,
    env: str | None = None,
    help: str,
    negative: tuple[str, ...] = (),
    choices: Iterable[Any] | None = None,
    sep: str | None = ",",
    nargs: int = 1,
) -> Any:
    """Declare a settings field read from ``names`` (flags), then ``env``, then ``default``.

    ``negative`` flags set a bool field to False; ``choices`` restricts the value (or each item
    of a list); ``sep`` splits list values (``None``: one item per occurrence of the flag);
    ``nargs`` > 1: a list field whose flag takes that many values at once (``--range 1 4``).
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
            "nargs": nargs,
        },
    )


def flag_group(model: type[BaseModel], help: str) -> Any:
    """Declare a settings field whose value is `model`, each field of which that is declared
    with :func:`flag` is read as a flag of these settings (its name: ``field.subfield``);
    fields of `model` declared otherwise keep their defaults."""
    return Field(default_factory=model, description=help,
                 json_schema_extra={"flag_group": True})
