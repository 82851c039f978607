"""The simulator's KV budget: a prefix cache by block, as vLLM's and SGLang's are. A prompt's
full blocks are named by the hash of everything up to their end; a request finds the longest
run of its leading blocks still cached (its cache_n), and its blocks join the cache. The
budget is in tokens: the running requests' tokens first, cached blocks in what is left,
least recently used evicted first.

Owns: the block table and its accounting. The engine (worker/simulate/engine.py) tells it when
requests start and end.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockCache:
    def __init__(self, kv_tokens: int, block: int) -> None:
        self.kv_tokens = kv_tokens
        self.block = block
        self._blocks: OrderedDict[int, None] = OrderedDict()
        """Cached blocks by prefix hash, least recently used first."""
        self.running_tokens = 0
        """Tokens the running requests hold."""
        self.hits = 0
        self.misses = 0
        """Blocks found and not found, over all lookups."""

    def _names(self, tokens: list[int]) -> list[int]:
        names, running = [], 0
        for end in range(self.block, len(tokens) + 1, self.block):
            running = hash((running, tuple(tokens[end - self.block:end])))
            names.append(running)
        return names

    def lookup(self, prompt: list[int]) -> int:
        """How many leading tokens of `prompt` are cached (whole blocks; the last prompt token
        is always evaluated, as a real engine needs its logits)."""
        found = 0
        names = self._names(prompt)
        for name in names:
            if name not in self._blocks:
                break
            self._blocks.move_to_end(name)
            found += 1
        self.hits += found
        self.misses += len(names) - found
        return min(found * self.block, max(0, len(prompt) - 1))

    def start(self, n_tokens: int) -> None:
        """A request holds `n_tokens` while it runs."""
        self.running_tokens += n_tokens
        self._fit()

    def end(self, held: int, tokens: list[int]) -> None:
        """A request that held `held` tokens ended; its blocks (prompt and text) are cached."""
        self.running_tokens = max(0, self.running_tokens - held)
        for name in self._names(tokens):
            self._blocks[name] = None
            self._blocks.move_to_end(name)
        self._fit()

    def clear(self) -> None:
        self._blocks.clear()

    @property
    def cached_tokens(self) -> int:
        return len(self._blocks) * self.block

    def _fit(self) -> None:
        room = max(0, self.kv_tokens - self.running_tokens)
        while self._blocks and len(self._blocks) * self.block > room:
            self._blocks.popitem(last=False)
