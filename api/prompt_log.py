"""--log-prompts-dir (llama-server's debugging aid): every completion's prompt written to a file
of that folder, named by the milliseconds since the process started (`%012d.txt`, llama-server's
ggml_time_ms), the text itself, or token / multimodal prompts as indented JSON. llama-server
writes one file per request (a multi-prompt request's array in one); llamaq writes one per job
(per prompt and choice), and a second file in the same millisecond gets `-1`, `-2` ... before
`.txt` instead of replacing the first."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from scheduler.contract.jobs import CompletionJob

log = logging.getLogger(__name__)


class PromptLog:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started = time.monotonic()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # llama-server warns and goes on
            log.warning("failed to create prompts-log-dir '%s': %s", folder, exc)

    @staticmethod
    def text(job: CompletionJob) -> str:
        if isinstance(job.prompt, str):
            return job.prompt
        return json.dumps(job.prompt, indent=2, ensure_ascii=False)

    def write(self, job: CompletionJob) -> Path | None:
        """The file written (None: it could not be, logged as llama-server does)."""
        stamp = int((time.monotonic() - self.started) * 1000)
        path = self.folder / f"{stamp:012d}.txt"
        n = 0
        while path.exists():
            n += 1
            path = self.folder / f"{stamp:012d}-{n}.txt"
        try:
            path.write_text(self.text(job), encoding="utf-8")
        except OSError:
            log.error("failed to create %s", path)
            return None
        return path

    async def record(self, job: CompletionJob) -> None:
        await asyncio.to_thread(self.write, job)
