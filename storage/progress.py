"""How a download reports: bytes done per file, to the log and to whoever listens."""

import logging
import time
from typing import Protocol

logger = logging.getLogger(__name__)

LOG_EVERY_S = 5.0


class DownloadListener(Protocol):
    """Told about each file of a download as bytes arrive (from any thread)."""

    def on_progress(self, source: str, done: int, total: int) -> None:
        """`source`: the file's URL (or `store:<key>`); `total` 0 when unknown."""
        ...

    def cancelled(self) -> bool:
        """True when the download must stop now (pause or cancel asked for)."""
        ...


class NoListener:
    def on_progress(self, source: str, done: int, total: int) -> None:
        return None

    def cancelled(self) -> bool:
        return False


class LoggedProgress:
    """Wraps a listener: also logs each file's progress every LOG_EVERY_S seconds and at its end."""

    def __init__(self, inner: DownloadListener, label: str) -> None:
        self.inner = inner
        self.label = label
        self._logged: dict[str, float] = {}

    def on_progress(self, source: str, done: int, total: int) -> None:
        now = time.monotonic()
        finished = total > 0 and done >= total
        if finished or now - self._logged.get(source, 0.0) >= LOG_EVERY_S:
            self._logged[source] = now
            share = f" ({100.0 * done / total:.1f}%)" if total else ""
            logger.info("model %s: downloading %s: %d/%d bytes%s", self.label,
                        source.rsplit("/", 1)[-1], done, total, share)
        self.inner.on_progress(source, done, total)

    def cancelled(self) -> bool:
        return self.inner.cancelled()
