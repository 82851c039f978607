"""`llamaq up | api | worker | scheduler`: each takes the llama-server flags that concern it."""

from __future__ import annotations

import sys

USAGE = """usage: llamaq {up,api,worker,scheduler,flags,health,models,batch} [flags]

  up         everything on this machine: Redis (started if none answers), one worker, the api
  api        a stateless api pod (Sanic)
  worker     a worker: loads the model and runs completions in slots
  scheduler  fleet housekeeping (registry pruning)
  flags      every llama-server flag: works, refused (and why) or no-op (and why)
  health     exit 0 if a worker heartbeats (--worker ID) or a URL answers 200 (--url)
  models     `models push FILE`: upload a local GGUF to the object store
  batch      the Batch API: submit FILE.jsonl [--wait], status, list, cancel, results

`llamaq COMMAND --help` lists that command's flags with their environment variables."""


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = args[0], args[1:]
    if command in ("api", "worker", "scheduler", "up"):  # -cl, --completion-bash: print, exit
        from llamaq.flag_lists import ROLES
        from llamaq.one_shot import answer_one_shot

        answer = answer_one_shot(command, rest, [settings for _, settings in ROLES])
        if answer is not None:
            sys.stdout.write(answer)
            return
    if command == "api":
        from llamaq.processes import run_api

        run_api(rest)
    elif command == "worker":
        from llamaq.processes import run_worker

        run_worker(rest)
    elif command == "scheduler":
        from llamaq.processes import run_scheduler

        run_scheduler(rest)
    elif command == "flags":
        from llamaq.flag_lists import print_flags

        print_flags()
    elif command == "health":
        from llamaq.health import run_health

        run_health(rest)
    elif command == "models":
        from llamaq.models_cli import run_models

        run_models(rest)
    elif command == "batch":
        from llamaq.batch_cli import run_batch_cli

        run_batch_cli(rest)
    elif command == "up":
        from llamaq.up import run_up

        run_up(rest)
    else:
        sys.exit(f"llamaq: unknown command {command!r}\n\n{USAGE}")
