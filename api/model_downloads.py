"""The model downloads an api pod runs (POST /models, api/endpoints/models/downloads.py): their
reporters, to pause them when the pod stops, and the object store they write to."""

from __future__ import annotations

import asyncio
import os

from api.settings import ApiSettings
from scheduler.downloads import DownloadReporter
from storage import ModelFiles, ObjectStore, open_store
from storage.hf import HubClient, hub_endpoint
from storage.progress import DownloadListener


class PodDownloads:
    """The downloads this pod runs (to pause them when it stops) and its object store."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.running: dict[str, DownloadReporter] = {}
        self._store: ObjectStore | None = None

    async def files(self, listener: DownloadListener | None = None,
                    label: str = "model") -> ModelFiles:
        s = self.settings
        if self._store is None:
            self._store = await asyncio.to_thread(open_store, s.store_url, s.s3_endpoint_url)
        hub = HubClient(s.model_cache_dir(), endpoint=hub_endpoint(os.environ),
                        token=s.hf_token, offline=s.offline)
        return ModelFiles(self._store, s.model_cache_dir(), offline=s.offline, hub=hub,
                          s3_endpoint_url=s.s3_endpoint_url, listener=listener, label=label)
