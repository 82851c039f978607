"""How many threads the embedder computes with, chosen by trying (plain state).

ggml's OpenMP threads spin at every barrier before they sleep (OMP_WAIT_POLICY unset, as
llama-server ships). On a quiet machine that is the fastest way to wait, but beside a process
that wants a core all the time, two spinning threads on two cores collapse: each barrier waits a
whole time slice for the preempted thread (MiniLM beside one busy loop: 3 texts/s against 100
with one thread). The completion engine reads that from /proc/stat
(worker/runtime/compute_threads.py),
but an embedding worker's own api pod and clients use about a core in bursts while it computes
(serializing vectors), and that rule took a thread away for them (0.66 of llama-server at 1 input
a request, against 0.74 with the threads kept). Bursts cost the spinning threads little; a steady
hog costs them everything. Telling the two apart from the outside is guesswork, so the embedder
measures instead: decode seconds per token with the threads it keeps, and now and then with one
thread more or less, for a short trial; the faster count is kept. A kept count that gets much
slower is tried against its neighbour at once.

Owns: that choice. Does not own: llama.cpp (the embedder applies the count with
llama_set_n_threads) or the decode timing (the embedder passes each decode's tokens and seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

WINDOW_S = 0.15
"""Decode time a measurement spans (and at least MIN_DECODES decodes)."""
MIN_DECODES = 3
FIRST_TRIAL_S = 2.0
"""A trial after this much time when the last change was recent; each lost trial doubles it."""
LONGEST_WAIT_S = 16.0
"""At most this long between trials: a quiet box pays one short trial at a slower count."""
AFTER_COLLAPSE_S = 64.0
"""At most this long after a trial whose count collapsed (each costs a slow decode); the load
falling (LOAD_FALL) brings the next trial forward."""
LOAD_FALL = 0.5
"""While fewer threads are kept: other processes' use fell this many cores below what it was
at the last trial, at two samples in a row: try at once (a hog ended)."""
SLOWER = 1.5
"""The kept count's seconds per token grew this much since its last window: try one thread
fewer at once (never more: a slower step beside fewer threads is the load, not the count)."""
BETTER = 1.05
"""A trial's count is kept when it is this much faster than the window before the trial."""
HOPELESS = 2.0
"""A trial's first decode this much slower than the reference ends the trial at once; a single
decode of the kept count as long as a window and this much slower starts one."""


@dataclass
class Window:
    seconds: float = 0.0
    tokens: int = 0
    decodes: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.seconds += seconds
        self.tokens += tokens
        self.decodes += 1

    def full(self) -> bool:
        return self.seconds >= WINDOW_S and self.decodes >= MIN_DECODES

    def per_token(self) -> float:
        return self.seconds / max(1, self.tokens)


@dataclass
class ThreadTrial:
    """The thread count for the next decode, between 1 and `configured`."""

    configured: int
    kept: int = 0
    trying: int | None = None
    reference: float = 0.0
    """Seconds per token of the kept count's window just before the trial."""
    window: Window = field(default_factory=Window)
    wait_s: float = FIRST_TRIAL_S
    next_trial_s: float = 0.0
    """When the next trial is due (the first right after the first window)."""
    last_tried_at: dict[int, float] = field(default_factory=dict)
    trials: int = 0
    """Trials run (for the log and the tests)."""
    load_at_trial: float | None = None
    """Other processes' cores (worker/runtime/compute_threads.py) when the last trial ended."""
    load_fell: int = 0
    """Samples in a row with the load LOAD_FALL below load_at_trial."""
    load: float | None = None
    """Other processes' cores at the latest sample."""

    def __post_init__(self) -> None:
        self.kept = self.kept or self.configured

    @property
    def current(self) -> int:
        return self.trying if self.trying is not None else self.kept

    def observe_load(self, others_cores: float | None) -> None:
        """Other processes' cores over the last interval (None: not known)."""
        if others_cores is None:
            return
        self.load = others_cores
        fell = (self.kept < self.configured and self.load_at_trial is not None
                and others_cores < self.load_at_trial - LOAD_FALL)
        self.load_fell = self.load_fell + 1 if fell else 0

    def record(self, tokens: int, seconds: float, now_s: float) -> int | None:
        """One decode's tokens and seconds at `current` threads; the count to compute with
        from now on when it changes, else None."""
        if self.configured <= 1 or tokens <= 0:
            return None
        self.window.add(tokens, seconds)
        if self.trying is not None:
            first_hopeless = (self.window.decodes == 1 and self.reference
                              and seconds / tokens > HOPELESS * self.reference)
            if first_hopeless or self.window.full():
                return self._end_trial(now_s)
            return None
        collapsed = (seconds >= WINDOW_S and self.reference
                     and seconds / tokens > HOPELESS * self.reference)
        if not (self.window.full() or collapsed):
            return None
        per_token, last = self.window.per_token(), self.reference
        self.reference, self.window = per_token, Window()
        if last and per_token > SLOWER * last and self.kept > 1:  # a hog came: one fewer
            return self._start_trial(now_s, [self.kept - 1])
        if now_s >= self.next_trial_s or self.load_fell >= 2:
            return self._start_trial(now_s, [self.kept - 1, self.kept + 1])
        return None

    def _start_trial(self, now_s: float, counts: list[int]) -> int | None:
        candidates = [n for n in counts if 1 <= n <= self.configured]
        if not candidates:
            return None
        self.trying = min(candidates, key=lambda n: self.last_tried_at.get(n, -1.0))
        self.last_tried_at[self.trying] = now_s
        self.trials += 1
        return self.trying

    def _end_trial(self, now_s: float) -> int | None:
        tried, self.trying = self.trying, None
        assert tried is not None
        per_token = self.window.per_token()
        won = per_token * BETTER < self.reference
        collapsed = per_token > HOPELESS * self.reference
        if won:
            self.reference = per_token
        self.window = Window()
        self.load_at_trial, self.load_fell = self.load, 0
        if won:
            self.wait_s = FIRST_TRIAL_S
        elif collapsed:
            self.wait_s = min(AFTER_COLLAPSE_S, max(self.wait_s, FIRST_TRIAL_S) * 4)
        else:
            self.wait_s = min(LONGEST_WAIT_S, self.wait_s * 2)
        self.next_trial_s = now_s + self.wait_s
        if won:
            self.kept = tried
            return None
        return self.kept
