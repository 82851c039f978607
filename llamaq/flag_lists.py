"""`llamaq flags`: every llama-server flag in one of three lists (works, refused, no-op), plus
llamaq's own flags, with the roles that take each one."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from api.settings import ApiSettings
from scheduler.common_settings import CommonSettings
from scheduler.config.command_line import FlagError, split_args
from scheduler.config.settings import ProcessSettings
from scheduler.config.spec_flags import BUILT_IN_PARSER, FlagStatus, SpecFlag, by_status
from worker.runtime.settings import WorkerSettings

ROLES: tuple[tuple[str, type[ProcessSettings]], ...] = (
    ("api", ApiSettings), ("worker", WorkerSettings), ("scheduler", CommonSettings),
)


def declared_names(settings: type[ProcessSettings]) -> set[str]:
    return {name for option in settings.options() for name in (*option.flags, *option.negative)}


def roles_of(flag: SpecFlag) -> str:
    """The roles whose command line takes the flag: `api, worker`, ..."""
    if set(flag.names) & BUILT_IN_PARSER:
        return "every role"
    takers = [role for role, settings in ROLES if set(flag.names) & declared_names(settings)]
    if takers == ["api", "worker", "scheduler"]:
        return "every role"
    return ", ".join(takers) or "(being built on another branch)"


def refuse_other_roles_flags(argv: Sequence[str], role: str) -> None:
    """`llamaq api -c 4096`: exit 2 naming the role that takes the flag."""
    roles = dict(ROLES)
    try:
        parts = split_args(argv, tuple(roles.values()))
    except FlagError:
        return  # unknown or refused: the role's own parser says so
    names = {each: declared_names(settings) for each, settings in roles.items()}  # once a role
    mine = names[role]
    for word in argv:
        name = word.split("=", 1)[0]
        takers = [other for other, settings in roles.items()
                  if other != role and word in parts[settings] and name in names[other]]
        if name.startswith("-") and takers and name not in mine:
            print(f"llamaq {role}: error: {name} is a flag of `llamaq {takers[0]}` (or "
                  "`llamaq up`), not of this role", file=sys.stderr)
            sys.exit(2)


def own_flags() -> list[tuple[str, str, str]]:
    """llamaq's flags that llama-server does not have: (names, roles, help)."""
    spec = {name for flag in by_status(FlagStatus.WORKS) for name in flag.names}
    spec |= {name for flag in by_status(FlagStatus.NOOP) for name in flag.names}
    rows: dict[str, tuple[str, list[str], str]] = {}
    for role, settings in ROLES:
        for option in settings.options():
            if set(option.flags) & spec:
                continue
            label = ", ".join(option.flags)
            rows.setdefault(label, (label, [], option.help))[1].append(role)
    return [(label, ", ".join(roles), text) for label, roles, text in rows.values()]


def why_of(flag: SpecFlag) -> str:
    """Why a flag is refused or a no-op, and the off forms of a refused one (accepted, no-op)."""
    return f"{flag.why} (off, a no-op: {flag.off_label})" if flag.off_label else flag.why


def render() -> str:
    lines = []
    for status, title in ((FlagStatus.WORKS, "works"), (FlagStatus.REFUSED, "refused (exit 2)"),
                          (FlagStatus.NOOP, "no-op (accepted, does nothing)")):
        flags = by_status(status)
        lines.append(f"{title}: {len(flags)} flags")
        for flag in flags:
            detail = roles_of(flag) if status is FlagStatus.WORKS else why_of(flag)
            lines.append(f"  {flag.label:<44} {detail}")
        lines.append("")
    own = own_flags()
    lines.append(f"llamaq's own: {len(own)} flags")
    lines.extend(f"  {label:<44} {roles}: {text}" for label, roles, text in own)
    return "\n".join(lines)


def print_flags() -> None:
    print(render())
