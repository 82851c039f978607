"""`POST /models` (download a Hugging Face model, with its sidecars, into the fleet's object
store, in the background) and `DELETE /models` (drop a downloaded model or one sidecar).

The pod that takes the POST downloads: progress goes to Redis (any pod lists the model as
`downloading`, then `incomplete` if it stops unfinished) and to the models channel as the
spec's download_progress / download_finished / download_failed events. Posting an incomplete
model again resumes it from the partial files on disk (those of the pod that downloaded it:
another pod starts the files it lacks from scratch)."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
import uuid
from pathlib import Path

from pydantic import ConfigDict, Field
from sanic import Request, Sanic
from sanic.response import HTTPResponse, json

from api.body import parse_body
from api.routing import Routes
from api.services import pod_services, services
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest, NotFound, Unavailable
from scheduler.downloads import DownloadBoard, DownloadReporter, ModelEvent
from scheduler.registry import WorkerInfo
from storage import InvalidKey, ModelFiles, ModelNotFound, StorageError
from storage.hf import (
    SIDECAR_KEYWORDS,
    is_model_file,
    pick_model,
    pick_sidecar,
    split_parts,
    split_repo_tag,
)
from storage.models import MODELS_PREFIX, hf_store_prefix

log = logging.getLogger(__name__)

routes = Routes("model_files")

STOP_WAIT_S = 30.0
"""How long DELETE waits for a running download of the model to stop."""
UNLOAD_WAIT_S = 60.0
DOWNLOADS_RETRY_AFTER_S = 30
"""How long a DELETE of a running model waits for its workers to stop (they drain first)."""


class DownloadRequest(DeferredModel):
    """The body of POST /models."""

    model_config = ConfigDict(extra="forbid")

    model: str = ""
    sidecars: list[str] = Field(default_factory=lambda: ["mmproj"])


@routes.blueprint.listener("before_server_stop")
async def pause_downloads(app: Sanic) -> None:
    """A stopping pod pauses its downloads (listed as incomplete; a POST resumes them)."""
    for reporter in pod_services(app).downloads.running.values():
        reporter.stop()


def check_allowed(name: str, patterns: list[str]) -> None:
    """--models-allow: the repo (without its tag) must match one pattern (none: any)."""
    repo_id = split_repo_tag(name)[0]
    if patterns and not any(fnmatch.fnmatchcase(repo_id, p) for p in patterns if p):
        raise InvalidRequest(f"model '{name}' is not one this server may download "
                             "(--models-allow)", status=403)


def _in_use(victims: list[str], workers: list[WorkerInfo]) -> list[str]:
    """The files of `victims` a live worker runs (by file name: whatever the model is called
    there, an alias, another tag of one repo)."""
    running = {Path(w.model_path).name for w in workers}
    return [v for v in victims if Path(v).name in running]


def _check_sidecars(kinds: list[str]) -> None:
    unknown = [kind for kind in kinds if kind not in SIDECAR_KEYWORDS]
    if unknown:
        raise InvalidRequest(f"unknown sidecar kind {unknown[0]!r} (one of: "
                             f"{', '.join(SIDECAR_KEYWORDS)})")


@routes.post("/models", body=DownloadRequest, guarded=True, admin="adding a model")
async def post_models(request: Request) -> HTTPResponse:
    body = parse_body(request, DownloadRequest)
    name = body.model.strip()
    if not name:
        raise InvalidRequest("model must be a non-empty string")
    _check_sidecars(body.sidecars)
    pod = services(request)
    settings = pod.settings
    check_allowed(name, settings.models_allow)
    board = DownloadBoard(pod.fleet.redis)
    if await board.is_downloading(name):
        raise InvalidRequest(f"model '{name}' is already being downloaded")
    most = settings.models_downloads_max
    if most > 0 and (running := await board.running()) >= most:
        raise Unavailable(f"{running} model downloads are running (--models-downloads-max "
                          f"{most}); retry later", retry_after_s=DOWNLOADS_RETRY_AFTER_S)
    downloads = pod.downloads
    reporter = DownloadReporter(board, name, asyncio.get_running_loop(),
                                sidecars=body.sidecars)
    files = await downloads.files(reporter, name)
    try:
        plan = await asyncio.to_thread(files.hf_plan, name, None, None, tuple(body.sidecars))
    except (ModelNotFound, InvalidKey) as exc:
        log.info("POST /models %s: %s", name, exc)
        raise InvalidRequest("model validation failed, unable to download") from exc
    cap = settings.models_download_max_bytes
    size = sum(f.size for f in plan.all_files())
    if cap > 0 and size > cap:
        raise InvalidRequest(f"model '{name}' is {size} bytes with its sidecars, more than "
                             f"--models-download-max-bytes ({cap})", status=413)
    await reporter.start()
    downloads.running[name] = reporter

    async def download() -> None:
        try:
            keys = await reporter.run(lambda _listener: files.hf_into_store(plan))
            log.info("model %s downloaded: %s", name, ", ".join(keys))
        except StorageError:
            pass  # logged and published as download_failed by the reporter
        finally:
            downloads.running.pop(name, None)

    request.app.add_task(download(), name=f"llamaq-download-{uuid.uuid4().hex[:12]}")
    return json({"success": True})


def _hf_victims(files: ModelFiles, name: str, sidecar: str | None) -> tuple[str, list[str]]:
    """The repo and the files of it that DELETE /models?model=name[&sidecar=] removes."""
    repo_id, tag = split_repo_tag(name)
    paths = sorted(f.path for f in files.stored_hf_files(repo_id))
    primary = pick_model(paths, tag) or ""
    if sidecar:
        found = pick_sidecar(paths, primary, sidecar, tag)
        return repo_id, [found] if found else []
    if not tag:
        return repo_id, paths
    if not primary:
        return repo_id, []
    victims = split_parts(paths, primary)
    left = [p for p in paths if p not in victims and is_model_file(p)]
    if not left:  # no other quant of the repo loads its sidecars any more
        victims += [p for p in paths if p not in victims]
    return repo_id, victims


class FilesInUse(Exception):
    """Files DELETE /models would remove that a live worker runs."""


def _delete(files: ModelFiles, name: str, sidecar: str | None, partials: bool,
            workers: list[WorkerInfo]) -> list[str]:
    """Remove the files `name` names; FilesInUse (nothing removed) when a live worker runs one
    of them, whatever name it serves them under."""
    pushed = name if name.startswith(MODELS_PREFIX) else MODELS_PREFIX + name
    if not sidecar and name.endswith(".gguf") and files.store.exists(pushed):
        if busy := _in_use([pushed], workers):
            raise FilesInUse(", ".join(busy))
        files.delete_keys([pushed])
        return [pushed]
    # imported here, not at the top: huggingface_hub (and the httpx it loads) costs an api pod
    # ~25 ms of CPU at start, and only a DELETE /models of a Hub name needs it
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(split_repo_tag(name)[0])
    except HFValidationError:
        return []  # not a Hub repo: nothing of it can be cached
    repo_id, victims = _hf_victims(files, name, sidecar)
    if busy := _in_use(victims, workers):
        raise FilesInUse(", ".join(busy))
    prefix = hf_store_prefix(repo_id)
    files.delete_keys([prefix + path for path in victims])
    files.hub.remove_cached(repo_id, victims, partials=partials)
    return victims


async def _unload_first(request: Request, name: str) -> None:
    """A running model is stopped before its files go, as llama-server's router stops the
    instance; a worker started with the model (`-m`, `-hf`) serves it for life: refused."""
    router = services(request).router
    if router is None or not await router.models.unload(name):
        raise InvalidRequest(f"model '{name}' is loaded: unload it before deleting it")
    deadline = time.monotonic() + UNLOAD_WAIT_S
    while await services(request).fleet.workers(name, fresh=True):
        if time.monotonic() > deadline:
            raise Unavailable(f"model '{name}' is still stopping; retry the delete")
        await asyncio.sleep(0.2)


@routes.delete("/models", guarded=True, admin="deleting a model")
async def delete_models(request: Request) -> HTTPResponse:
    name = (request.args.get("model") or "").strip()
    if not name:
        raise InvalidRequest("model must be a non-empty string")
    sidecar = request.args.get("sidecar") or None
    if sidecar:
        _check_sidecars([sidecar])
    fleet = services(request).fleet
    if await fleet.workers(name, fresh=True):
        await _unload_first(request, name)
    board = DownloadBoard(fleet.redis)
    downloads = services(request).downloads
    if await board.request_stop(name):
        if (ours := downloads.running.get(name)) is not None:
            ours.stop()
        if not await board.wait_stopped(name, STOP_WAIT_S):
            raise InvalidRequest(f"model '{name}' is still downloading; retry the delete")
    had_record = await board.record(name) is not None
    files = await downloads.files(label=name)
    running = await fleet.registry.every_live_worker()
    try:
        removed = await asyncio.to_thread(_delete, files, name, sidecar, had_record, running)
    except (ModelNotFound, InvalidKey) as exc:
        raise NotFound(f"model '{name}' not found") from exc
    except FilesInUse as exc:
        raise InvalidRequest(f"model '{name}': its file {exc} is loaded by a running worker "
                             "(under another name); stop it before deleting") from None
    if not removed and not had_record:
        what = f"sidecar '{sidecar}' of model" if sidecar else "model"
        raise NotFound(f"{what} '{name}' not found")
    log.info("model %s: deleted %s", name, ", ".join(removed) or "its partial files")
    if not sidecar:
        await board.forget(name)
        if (router := services(request).router) is not None:
            router.stale = True  # this pod's next listing reads the sources again at once,
            # not only once its own model_remove event has come back from Redis
        await board.publish(ModelEvent(model=name, event="model_remove"))
    return json({"success": True})
