"""A worker started without a model (router mode): a *host* that serves one model at a time.

It reports itself free in the registry of hosts (`scheduler/fleet_models.py`) and takes
commands from its own Redis list, in order: `load` runs a `WorkerRuntime` for the model (the
same runtime a worker started with `-m` runs, under the model's name, with the model's preset
options under this process's own flags), `unload` drains it (running requests finish, up to
--drain-timeout) and frees the memory. A load that fails (a corrupt file, a bad preset option)
is recorded with an exit code, as llama-server records its child's, and the host is free
again. Which host loads what is decided by the api pods (scheduler/placement.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from scheduler.catalog import ModelEntry
from scheduler.common_settings import redis_url_of
from scheduler.config.settings import PRESET_TRUE, preset_key, spec_flag_of_a_role
from scheduler.config.spec_flags import SpecFlag, refused_envs, refused_names
from scheduler.connections import open_redis
from scheduler.contract import keys
from scheduler.fleet_models import (
    Claim,
    FleetModels,
    HostCommand,
    HostInfo,
    ModelFailure,
    status_event,
)
from scheduler.placement import HostState
from scheduler.redis_clock import stamp
from worker.runtime.settings import WorkerSettings

log = logging.getLogger(__name__)

READY_POLL_S = 0.2
PROGRESS_STEP = 0.1
REDIS_RETRY_S = 1.0
EXIT_LOAD_FAILED = 1
EXIT_BAD_ARGS = 2
_CLAIM_DONE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class PresetError(ValueError):
    """A preset option that no worker flag takes."""


def preset_argv(options: dict[str, str]) -> list[str]:
    """A model's preset options as worker flags (keys: long names without dashes, short names
    or environment variable names; booleans as true/false). The api pods apply the options of
    theirs (`chat-template`, `jinja`, ...): the worker leaves them."""
    refused, refused_env = refused_names(), refused_envs()
    argv: list[str] = []
    for key, value in options.items():
        found = preset_key(WorkerSettings, key)
        if found is None:
            row = refused_env.get(key) or next(
                (refused[n] for n in (f"--{key}", f"-{key}") if n in refused), None)
            if row is not None:
                if not preset_is_off(row, key, value):
                    argv.append(row.names[0])  # the parser refuses it, naming it and why
                continue  # an off value of an unbuilt feature: a no-op
            if spec_flag_of_a_role(key):
                continue  # an api pod's option
            raise PresetError(f"preset option {key!r} is not a flag of llama-server or llamaq")
        option = found.option
        if not option.is_switch:
            argv += [found.name, value]
        elif found.switch_on(value):
            argv.append(option.flags[0])
        elif option.negative:
            argv.append(option.negative[0])
        else:
            raise PresetError(f"preset option {key!r} cannot be turned off")
    return argv


def preset_is_off(row: SpecFlag, key: str, value: str) -> bool:
    """Whether a refused flag's preset option only turns its feature off (a no-op)."""
    if key == row.env:
        return row.env_is_off({key: value})
    name = next(n for n in (f"--{key}", f"-{key}") if n in row.names)
    if row.switch or row.off_names:  # a switch: true/false, its negative names invert
        return (value.strip().lower() in PRESET_TRUE) == (name in row.off_names)
    return row.is_off(name, value)


def model_argv(entry: ModelEntry, own: Sequence[str], host_id: str) -> list[str]:
    """The command line of the runtime that serves `entry`: preset options, then this
    process's own flags (they win, as the router's own flags do), then what the router sets
    (the model, its projector, its name, this worker's id)."""
    argv = [*preset_argv(entry.options), *own]
    if entry.model:
        argv += ["-m", entry.model]
    elif entry.hf_repo:
        argv += ["-hf", entry.hf_repo]
        if entry.hf_file:
            argv += ["-hff", entry.hf_file]
    if entry.mmproj:  # a folder's mmproj* sidecar, a preset's `mmproj` key
        argv += ["-mm", entry.mmproj]
    if entry.stop_timeout_s is not None:  # a preset-only key: it wins
        argv += ["--drain-timeout", str(entry.stop_timeout_s)]
    return [*argv, "--alias", entry.name, "--worker-id", host_id]


class WorkerHost:
    def __init__(self, settings: WorkerSettings, argv: Sequence[str]) -> None:
        self.settings = settings
        self.argv = list(argv)
        self.host_id = settings.worker_id or uuid.uuid4().hex[:12]
        self.info = HostInfo(host_id=self.host_id, state=HostState.FREE, since=time.time())
        self.redis: Redis | None = None
        self.models: FleetModels | None = None
        self._serving: tuple[asyncio.Task[None], asyncio.Event, ModelEntry] | None = None
        self._report_task: asyncio.Future[None] | None = None
        self._progress_tasks: dict[asyncio.Future[None], None] = {}  # in order

    async def run(self, redis_url: str, stop: asyncio.Event) -> None:
        self.redis = open_redis(redis_url)
        self.models = FleetModels(self.redis)
        commands: asyncio.Queue[HostCommand] = asyncio.Queue()
        tasks = [asyncio.create_task(self._heartbeat()),
                 asyncio.create_task(self._take_commands(commands))]
        stopped = asyncio.create_task(stop.wait())
        log.info("worker %s is free (router mode): it loads a model when asked", self.host_id)
        try:
            while True:
                got = asyncio.create_task(commands.get())
                done, _ = await asyncio.wait([stopped, got, *tasks],
                                             return_when=asyncio.FIRST_COMPLETED)
                if got not in done:
                    got.cancel()
                for task in done & set(tasks):
                    task.result()
                    raise RuntimeError(f"host task {task.get_coro()!r} ended")
                if stopped in done:
                    break
                await self._run_command(got.result())
        finally:
            stopped.cancel()
            await self._unload()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(RedisError):
                await self.redis.zrem(keys.HOSTS, self.host_id)
                await self.redis.delete(keys.host_info(self.host_id))
            await self.redis.aclose()

    async def _run_command(self, command: HostCommand) -> None:
        if command.op == "unload":
            await self._unload()
            await self._claim_done(None)
        elif command.entry is not None:
            await self._unload()
            await self._load(command.entry)

    # -- loading and unloading --------------------------------------------------------------

    async def _load(self, entry: ModelEntry) -> None:
        from worker.process.serve import serve  # llama.cpp: only once a model is asked for

        assert self.models is not None
        args = entry.args()
        await self._set_state(HostState.LOADING, entry.name, args)
        await self._claim_done(entry.name)
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                settings = WorkerSettings.from_args(model_argv(entry, self.argv, self.host_id))
        except (SystemExit, ValueError) as exc:  # the parser exits 2 naming the flag
            why = said.getvalue().strip().splitlines()[-1:] or [str(exc)]
            await self._failed(entry, args, EXIT_BAD_ARGS, f"bad options: {why[0]}")
            return
        stop = asyncio.Event()
        task = asyncio.create_task(serve(settings, self._redis_url(), stop,
                                         self._progress_reporter(entry.name)))
        self._serving = (task, stop, entry)
        mine = None
        while not task.done():
            workers = await self.models.registry.live_workers(entry.name)
            mine = next((w for w in workers if w.worker_id == self.host_id), None)
            if mine is not None:
                break
            await asyncio.sleep(READY_POLL_S)
        if task.done():
            self._serving = None
            error = task.exception()
            message = f"{type(error).__name__}: {error}" if error else "stopped while loading"
            await self._failed(entry, args, EXIT_LOAD_FAILED, message)
            return
        task.add_done_callback(lambda t: self._crashed(t, entry))
        await self._set_state(HostState.LOADED, entry.name, args)
        log.info("worker %s: model %s loaded", self.host_id, entry.name)
        info = {} if mine is None else {"id": entry.name, "n_slots": mine.n_slots,
                                        "n_ctx": mine.n_ctx_slot, "meta": mine.meta.model_dump(
                                            include={"vocab_type", "n_vocab", "n_ctx_train",
                                                     "n_embd", "n_params", "size"})}
        await self.models.publish(status_event(entry.name, "loaded", info=info))

    def _progress_reporter(self, model: str) -> Callable[[list[str], str, float], None]:
        """Load progress from llama.cpp's loading thread, as the spec's loading events: each
        stage's (text_model, spec_model, mmproj_model) start, one per tenth, and its end."""
        loop = asyncio.get_running_loop()
        sent = [-1.0]
        current = [""]

        def report(stages: list[str], stage: str, value: float) -> None:
            if stage != current[0]:
                current[0], sent[0] = stage, -1.0
            if value < 1.0 and value - sent[0] < PROGRESS_STEP:
                return
            sent[0] = value
            event = status_event(model, "loading", progress={
                "stages": stages, "current": stage, "value": round(value, 3)})
            loop.call_soon_threadsafe(self._publish_soon, event)

        return report

    def _publish_soon(self, event: dict[str, Any]) -> None:
        """Publish after the previous progress event, so that they arrive in order."""
        models = self.models
        assert models is not None
        previous = next(reversed(self._progress_tasks), None)

        async def publish_in_order() -> None:
            if previous is not None:
                with contextlib.suppress(Exception):
                    await previous
            await models.publish(event)

        self._progress_tasks[task := asyncio.ensure_future(publish_in_order())] = None
        task.add_done_callback(lambda done: self._progress_tasks.pop(done, None))

    def _crashed(self, task: asyncio.Task[None], entry: ModelEntry) -> None:
        """The runtime ended by itself (not by an unload): the model is gone from here."""
        if self._serving is None or self._serving[0] is not task:
            return
        self._serving = None
        error = None if task.cancelled() else task.exception()
        log.error("worker %s: model %s stopped: %r", self.host_id, entry.name, error)
        self._report_task = asyncio.ensure_future(self._failed(
            entry, entry.args(), EXIT_LOAD_FAILED, f"the model stopped: {error!r}"))

    async def _failed(self, entry: ModelEntry, args: list[str], code: int,
                      message: str) -> None:
        assert self.models is not None
        log.error("worker %s: model %s failed to load (exit code %d): %s", self.host_id,
                  entry.name, code, message)
        await self.models.record_failure(entry.name, ModelFailure(exit_code=code, args=args,
                                                                  message=message))
        await self._set_state(HostState.FREE, None, [])
        await self.models.publish(status_event(entry.name, "unloaded", exit_code=code))

    async def _unload(self) -> None:
        if self._serving is None:
            return
        task, stop, entry = self._serving
        self._serving = None
        assert self.models is not None
        await self._set_state(HostState.UNLOADING, entry.name, self.info.args)
        log.info("worker %s: unloading %s", self.host_id, entry.name)
        stop.set()
        with contextlib.suppress(Exception):
            await task
        await self._set_state(HostState.FREE, None, [])
        others = [w for w in await self.models.registry.live_workers(entry.name)
                  if w.worker_id != self.host_id]
        if not others:
            await self.models.publish(status_event(entry.name, "unloaded", exit_code=0))

    # -- reporting ------------------------------------------------------------------------

    async def _set_state(self, state: HostState, model: str | None, args: list[str]) -> None:
        self.info = HostInfo(host_id=self.host_id, state=state, model=model, args=args,
                             since=time.time())
        await self._write_info()

    async def _write_info(self) -> None:
        assert self.redis is not None
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.host_info(self.host_id), self.info.model_dump_json(),
                     ex=keys.HEARTBEAT_TTL_S)
            stamp(pipe, keys.HOSTS, self.host_id)
            await pipe.execute()

    async def _claim_done(self, model: str | None) -> None:
        """The host now shows what the placement claimed: the claim is no longer needed."""
        assert self.redis is not None
        await self.redis.eval(_CLAIM_DONE, 1, keys.host_claim(self.host_id),  # type: ignore[misc]
                              Claim(model=model).model_dump_json())

    async def _heartbeat(self) -> None:
        while True:
            try:
                await self._write_info()
            except RedisError as error:
                log.warning("cannot report to Redis (%s); retrying", error)
            await asyncio.sleep(keys.HEARTBEAT_EVERY_S)

    async def _take_commands(self, queue: asyncio.Queue[HostCommand]) -> None:
        assert self.redis is not None
        while True:
            try:
                item = await self.redis.blpop(  # type: ignore[misc]
                    [keys.host_commands(self.host_id)], timeout=1)
            except RedisError as error:
                log.warning("cannot read commands (%s); retrying", error)
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            if item is None:
                continue
            try:
                queue.put_nowait(HostCommand.model_validate_json(item[1]))
            except ValueError:
                log.warning("worker %s: malformed command %r", self.host_id, item[1][:200])

    def _redis_url(self) -> str:
        return redis_url_of(self.settings)
