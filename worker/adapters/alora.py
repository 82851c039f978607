"""Activated LoRA (aLoRA): an adapter that declares invocation tokens applies only from their
last occurrence in the prompt on, as llama-server runs it (server-context.cpp): the prompt
before that point is decoded without it (so its cache is the base model's, shared with plain
requests), the rest of the prompt and the generation with it.

llama-server's rules, kept: an aLoRA applies when every adapter the request enables is one; two
enabled aLoRAs are refused; an aLoRA whose invocation tokens are not in the prompt is switched
off for the request; the prompt is decoded without it up to one token before the invocation
starts (its index minus 1), and a cached prefix is reused only up to there. Ours: when the run
ends, its slot keeps only that base prefix (the adapter's tail is dropped), so no later run
reuses KV made under an adapter it does not run.

Owns: finding the invocation and the run's plan. The engine decodes the two phases
(worker/engine/loop.py, worker/adapters/adapter_sets.py)."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.contract.errors import InvalidRequest
from worker.runtime.lora import LoraAdapters

AdapterSet = tuple[float, ...]


@dataclass(frozen=True)
class ALoraRun:
    adapter_set: AdapterSet
    """The request's set: its one aLoRA enabled."""
    pre_end: int
    """Prompt tokens [0, pre_end) are decoded without the adapter (llama-server: the
    invocation's start - 1)."""

    @property
    def base(self) -> AdapterSet:
        return tuple(0.0 for _ in self.adapter_set)


def invocation_start(prompt: list[int], invocation: list[int]) -> int | None:
    """Where the last occurrence of `invocation` starts in `prompt` (None: absent), scanned
    backwards as llama-server scans it (a mismatch restarts the match at the next position)."""
    match = len(invocation) - 1
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] == invocation[match]:
            if match == 0:
                return i
            match -= 1
        else:
            match = len(invocation) - 1
    return None


def alora_plan(adapters: LoraAdapters, adapter_set: AdapterSet,
               prompt: list[int]) -> tuple[AdapterSet, ALoraRun | None]:
    """The set the request runs under and its aLoRA plan (None: not an aLoRA request)."""
    enabled = [i for i, scale in enumerate(adapter_set) if scale != 0]
    invocations = [adapters.adapters[i].info.alora_invocation_tokens for i in enabled]
    if not enabled or not all(invocations):
        return adapter_set, None
    if len(enabled) != 1:
        raise InvalidRequest("Cannot run multiple aLoRAs in a single request")
    start = invocation_start(prompt, list(invocations[0] or []))
    if start is None:  # llama-server switches the aLoRA off for this request
        return tuple(0.0 for _ in adapter_set), None
    return adapter_set, ALoraRun(adapter_set, start - 1)
