"""Every message of the models channel (keys.MODELS_CHANNEL), read by a background subscriber."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import redis

from scheduler.contract import keys


class ModelEvents:
    """The models channel's events, decoded, in the order they came (`seen`)."""

    def __init__(self, redis_url: str) -> None:
        self.client = redis.Redis.from_url(redis_url)
        self.pubsub = self.client.pubsub()
        self.pubsub.subscribe(keys.MODELS_CHANNEL)
        self.seen: list[dict[str, Any]] = []
        self.running = True
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while self.running:
            message = self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is not None:
                self.seen.append(json.loads(message["data"]))

    def wait(self, model: str, event: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for item in self.seen:
                if item["model"] == model and item["event"] == event:
                    return item
            time.sleep(0.05)
        raise TimeoutError(f"no {event} for {model}; saw {self.seen[-5:]}")

    def of(self, model: str, event: str) -> list[dict[str, Any]]:
        return [e for e in self.seen if e["model"] == model and e["event"] == event]

    def close(self) -> None:
        self.running = False
        self.thread.join(timeout=2)
        self.pubsub.close()
        self.client.close()
