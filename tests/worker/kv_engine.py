"""An in-process engine on a real GGUF for the KV cache tests (context checkpoints, the host
prompt cache): the engine, its sink, a greedy run's result, and the KV buffer sizes llama.cpp
logs when a context is made (llamaq's and the llama-server binary's)."""

from __future__ import annotations

import logging
import queue
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scheduler.contract.jobs import CompletionJob, SamplingParams, SamplingSettings
from scheduler.contract.message_delimiters import MessageDelimiter
from scheduler.contract.results import CompletionResult, ErrorEvent, FinalEvent
from tests.processes import free_port
from worker.engine.loop import Engine, JobEvent
from worker.engine.requests import EngineDefaults
from worker.runtime.model import ContextPlan, LoadedModel

TIMEOUT_S = 300
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
LLAMA_SERVER = Path.home() / ".cache/llamaq-bench/bin/llama-server"
KV_LINE = re.compile(r"KV buffer size\s*=\s*([0-9.]+) MiB")


def plan(n_ctx: int, n_slots: int, n_ubatch: int = 512, swa_full: bool = False) -> ContextPlan:
    return ContextPlan(n_ctx=n_ctx, n_slots=n_slots, kv_unified=False, n_batch=2048,
                       n_ubatch=n_ubatch, n_threads=1, n_threads_batch=1, swa_full=swa_full,
                       flash_attn="auto", cache_type_k="f16", cache_type_v="f16")


class Sink:
    def __init__(self) -> None:
        self.queue: queue.Queue[JobEvent] = queue.Queue()

    def __call__(self, events: list[JobEvent]) -> None:
        for event in events:
            self.queue.put(event)

    def result(self, job_id: str) -> CompletionResult:
        while True:
            got, event = self.queue.get(timeout=TIMEOUT_S)
            if got == job_id and isinstance(event, FinalEvent | ErrorEvent):
                assert isinstance(event, FinalEvent), event
                assert isinstance(event.result, CompletionResult)
                return event.result


@contextmanager
def running(model: LoadedModel, **defaults: object) -> Iterator[tuple[Engine, Sink]]:
    sink = Sink()
    engine = Engine(model, EngineDefaults(
        sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0, cache_prompt=True,
        special=False, model_alias="gemma", worker_id="w-kv", **defaults),  # type: ignore[arg-type]
        sink)
    engine.start()
    try:
        yield engine, sink
    finally:
        engine.stop()
        for slot in engine.slots:  # the next engine on this model starts from nothing
            slot.forget_tokens()


def complete(engine: Engine, sink: Sink, prompt: str, n_predict: int,
             delimiters: list[MessageDelimiter] | None = None,
             n_probs: int = 8) -> CompletionResult:
    """A greedy run; `n_probs=0` where its probabilities are not compared (each token's
    top candidates are a sort of Gemma's 262k logits: a third of a token's CPU)."""
    job = CompletionJob(model="gemma", prompt=prompt, n_predict=n_predict, sampling=GREEDY,
                        n_probs=n_probs, return_tokens=True, message_delimiters=delimiters or [])
    engine.submit(engine.prepare(job))
    return sink.result(job.job_id)


def same_next_token(a: CompletionResult, b: CompletionResult, tolerance: float = 0.05) -> bool:
    """The first sampled token's candidates agree (log-probabilities within `tolerance`): a
    prefix restored whole gives the distribution that decoding it again gives, up to the
    rounding of another batch split; attention over lost cells would not. (Greedy text on
    a 270M model over near-ties may part on that rounding alone, so the text is not it.)"""
    top_a = {c.id: c.p for c in a.probs[0].top}
    top_b = {c.id: c.p for c in b.probs[0].top}
    shared = top_a.keys() & top_b.keys()
    return len(shared) >= len(top_a) - 1 and all(
        abs(top_a[i] - top_b[i]) <= tolerance for i in shared)


def document(seed: int, n_words: int) -> str:
    """A long prompt of its own (no two seeds share more than a few tokens)."""
    words = ["river", "stone", "lamp", "orchard", "copper", "violet", "harbor", "meadow",
             "signal", "ember", "lantern", "glacier", "thimble", "saddle", "quartz", "willow"]
    return f"Document {seed}. " + " ".join(
        f"{words[(i * 7 + seed * 5) % len(words)]}{(i * 31 + seed) % 97}" for i in range(n_words))


@contextmanager
def kv_log() -> Iterator[list[str]]:
    """llama.cpp's log lines while a context is made (worker/runtime/llama_logs.py routes them)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("llama_cpp")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def kv_mib(lines: list[str]) -> float:
    """The KV buffers' total (llama-server's fit probe logs 0.00 MiB ones first)."""
    return sum(float(m.group(1)) for line in lines if (m := KV_LINE.search(line)))


def llama_server_kv_mib(model_path: Path, *args: str) -> float:
    """Start the llama-server binary with `args`, read the KV buffer sizes it logs, stop it."""
    port = free_port()
    process = subprocess.Popen(
        [str(LLAMA_SERVER), "-m", str(model_path), "--port", str(port), "-t", "1",
         "--no-warmup", "-v", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "listening on" in line or len(lines) > 20000:
                break
    finally:
        process.terminate()
        process.wait(timeout=30)
    return kv_mib(lines)
