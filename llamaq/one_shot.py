"""llama-server's one-shot flags, answered by every role before it starts: `-cl/--cache-list`
(the models in this machine's Hugging Face cache, as llama.cpp names and prints them) and
`--completion-bash` (a bash completion script for `llamaq`, in llama.cpp's form)."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.catalog import CatalogSources, load_catalog
from scheduler.common_settings import CommonSettings
from scheduler.config.settings import ProcessSettings
from storage.hf import hub_cache_dir

ONE_SHOT = ("-cl", "--cache-list", "--completion-bash")
SIDE_FILES = ("mmproj", "mtp-", "eagle3-", "dflash-", "dspark-")
"""File name parts llama.cpp's common_list_cached_models leaves out."""


def cache_list(settings: CommonSettings) -> str:
    """`number of models in cache: N`, then `   1. user/repo:TAG` a line."""
    catalog = load_catalog(CatalogSources(cache_dir=hub_cache_dir(settings.model_cache_dir())))
    names = [name for name, entry in catalog.entries.items()
             if not any(part in (entry.hf_file or "") for part in SIDE_FILES)]
    lines = [f"number of models in cache: {len(names)}"]
    lines += [f"{i:4d}. {name}" for i, name in enumerate(names, start=1)]
    return "\n".join(lines) + "\n"


def completion_bash(roles: Sequence[type[ProcessSettings]]) -> str:
    """llama.cpp's completion script (common_params_print_completion) over every flag of the
    roles, for the `llamaq` command."""
    names: list[str] = []
    for role in roles:
        for option in role.options():
            names += [n for n in (*option.flags, *option.negative) if n not in names]
    return "\n".join([
        "_llama_completions() {",
        "    local cur prev opts",
        "    COMPREPLY=()",
        '    cur="${COMP_WORDS[COMP_CWORD]}"',
        '    prev="${COMP_WORDS[COMP_CWORD-1]}"',
        "",
        '    opts="' + "".join(f"{name} " for name in names) + '"',
        "",
        '    case "$prev" in',
        "        --model|-m)",
        "            COMPREPLY=( $(compgen -f -X '!*.gguf' -- \"$cur\") "
        '$(compgen -d -- "$cur") )',
        "            return 0",
        "            ;;",
        "        --grammar-file)",
        "            COMPREPLY=( $(compgen -f -X '!*.gbnf' -- \"$cur\") "
        '$(compgen -d -- "$cur") )',
        "            return 0",
        "            ;;",
        "        --chat-template-file)",
        "            COMPREPLY=( $(compgen -f -X '!*.jinja' -- \"$cur\") "
        '$(compgen -d -- "$cur") )',
        "            return 0",
        "            ;;",
        "        *)",
        '            COMPREPLY=( $(compgen -W "${opts}" -- "$cur") )',
        "            return 0",
        "            ;;",
        "    esac",
        "}",
        "",
        "complete -F _llama_completions llamaq",
        ""])


def answer_one_shot(command: str, args: Sequence[str],
                    roles: Sequence[type[ProcessSettings]]) -> str | None:
    """What a role's command line with a one-shot flag prints (None: it has none). The cache
    folder is read from --cache-dir / LLAMA_CACHE / LLAMAQ_CACHE_DIR, the rest is ignored."""
    if not set(args) & set(ONE_SHOT):
        return None
    if "--completion-bash" in args:
        return completion_bash(roles)
    cache_args: list[str] = []
    for i, word in enumerate(args):
        if word == "--cache-dir" and i + 1 < len(args):
            cache_args = [word, args[i + 1]]
        elif word.startswith("--cache-dir="):
            cache_args = [word]
    return cache_list(CommonSettings.from_args(cache_args))
