"""Where a worker's model file comes from (-m, -hf/-hff, -mu, -dr, or the default model), with the
download's progress in the log and as the spec's /models/sse events on the models channel; and
its adapter files (--lora, --lora-scaled, --control-vector, --control-vector-scaled), which
come from the same places as a model: a local file, a store key, `s3://`, an http(s) URL."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis

from scheduler.downloads import DownloadBoard, DownloadReporter
from storage import ModelFiles, default_model_path, open_store
from storage.docker_hub import Registry
from storage.errors import ModelNotFound
from storage.hf import HubClient, hub_endpoint
from storage.progress import DownloadListener
from worker.runtime.settings import WorkerSettings


def model_files(settings: WorkerSettings, listener: DownloadListener | None = None) -> ModelFiles:
    cache_dir = settings.model_cache_dir()
    hub = HubClient(cache_dir, endpoint=hub_endpoint(os.environ),
                    token=settings.hf_token, offline=settings.offline)
    return ModelFiles(open_store(settings.store_url, settings.s3_endpoint_url), cache_dir,
                      offline=settings.offline, hub=hub, s3_endpoint_url=settings.s3_endpoint_url,
                      listener=listener, label=settings.model_id())


@dataclass(frozen=True)
class ModelSource:
    model: Path
    mmproj: Path | None = None
    """The repo's projector that -hf pulled with the model (--mmproj-auto), if any."""
    draft: Path | None = None
    """The draft model -hfd named (-md, when given too, is the file in its repo)."""


def resolve_model(settings: WorkerSettings,
                  listener: DownloadListener | None = None) -> ModelSource:
    """The local path of the model the settings name (blocking: run it in a thread); with -hf
    and no -mm, the repo's mmproj too, as llama-server's --mmproj-auto (not for an embedding
    worker, which takes no media); with -mmu and no -mm, the projector from that URL (cached
    and stored as -mu's model file); with -hfd, the draft model from the Hub as -hf's."""
    files = model_files(settings, listener)
    source = _model_source(settings, files)
    if settings.mmproj_url and settings.mmproj is None and source.mmproj is None:
        source = ModelSource(source.model, files.from_url(settings.mmproj_url))  # -mmu
    if settings.spec_draft_hf:
        draft = files.from_hf(settings.spec_draft_hf, settings.spec_draft_model,
                              settings.hf_token)
        source = ModelSource(source.model, source.mmproj, draft)
    return source


def _model_source(settings: WorkerSettings, files: ModelFiles) -> ModelSource:
    if settings.model:
        return ModelSource(files.resolve(settings.model))
    if settings.hf_repo:
        if not wants_hub_projector(settings):
            return ModelSource(files.from_hf(settings.hf_repo, settings.hf_file,
                                             settings.hf_token))
        plan = files.hf_plan(settings.hf_repo, settings.hf_file, settings.hf_token,
                             ("mmproj",), sidecars_optional=True)
        paths = {f.path: files.hf_file(plan.repo_id, f, settings.hf_token)
                 for f in plan.all_files()}
        sidecar = plan.sidecars.get("mmproj")
        return ModelSource(paths[plan.primary.path],
                           paths[sidecar.path] if sidecar is not None else None)
    if settings.model_url:
        return ModelSource(files.from_url(settings.model_url))
    if settings.docker_repo:
        return ModelSource(files.from_docker(settings.docker_repo,
                                             Registry.from_environ(os.environ)))
    return ModelSource(default_model_path(settings.model_cache_dir()))


def wants_hub_projector(settings: WorkerSettings) -> bool:
    return (settings.mmproj_auto and settings.mmproj is None and not settings.embedding
            and not settings.rerank)


async def fetch_model(settings: WorkerSettings, redis: Redis) -> ModelSource:
    """resolve_model in a thread; a download from the Hub, a URL or the store is reported to
    the fleet (download_progress / download_finished / download_failed events)."""
    reporter = DownloadReporter(DownloadBoard(redis), settings.model_id(),
                                asyncio.get_running_loop(), stoppable=False)
    return await reporter.run(lambda listener: resolve_model(settings, listener))


def adapter_sources(settings: WorkerSettings) -> list[str]:
    """Every adapter and control vector file the flags name, as given (FNAME of FNAME:SCALE)."""
    scaled = [item.rpartition(":")[0] or item
              for item in (*settings.lora_scaled, *settings.control_vector_scaled)]
    return list(dict.fromkeys([*settings.lora, *settings.control_vector, *scaled]))


def resolve_adapters(settings: WorkerSettings) -> dict[str, Path]:
    """Each adapter source's local file (blocking: run it in a thread): a local file as is;
    `store:<key>`, a store key or `s3://` fetched into this machine's cache (checked against
    the store's SHA-256 when it has one, fetched again only when the cached copy differs); an
    http(s) URL downloaded once through the store, with its SHA-256, like `-mu`; a Hub file
    `hf://<user>/<repo>/<file>` through the store and the Hub, like `-hf`/`-hff`."""
    files = model_files(settings)
    found: dict[str, Path] = {}
    for source in adapter_sources(settings):
        if source.startswith(("http://", "https://")):
            found[source] = files.from_url(source)
        elif source.startswith(HF_SCHEME):
            repo, file = hf_source(source)
            found[source] = files.from_hf(repo, file, settings.hf_token)
        else:
            found[source] = files.resolve(source)
    return found


HF_SCHEME = "hf://"


def hf_source(source: str) -> tuple[str, str]:
    """`hf://<user>/<repo>/<path in the repo>` (huggingface_hub's URL form): repo, file."""
    user, _, rest = source.removeprefix(HF_SCHEME).partition("/")
    repo, _, file = rest.partition("/")
    if not user or not repo or not file:
        raise ModelNotFound(f"adapter source {source!r}: expected hf://<user>/<repo>/<file>")
    return f"{user}/{repo}", file


async def fetch_adapters(settings: WorkerSettings) -> dict[str, Path]:
    return await asyncio.to_thread(resolve_adapters, settings)
