"""One command line for several roles: `llamaq up` hands each flag to every role that takes it
(`split_args`), and refuses a flag no role takes or one llamaq refuses (`FlagError`)."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.config.settings import ProcessSettings
from scheduler.config.spec_flags import refusal, refused_names


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
