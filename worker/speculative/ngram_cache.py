"""ngram-cache: lookup decoding (llama.cpp's common/ngram-cache and
common_speculative_impl_ngram_cache, ported).

Owns: the n-gram caches (n-gram of 1..4 tokens → counts of the token after it), their update
from a sequence's tokens, the draft (context cache with lax thresholds, then the dynamic cache
with strict ones, each validated by the static cache's 2-grams, then the static cache alone),
and llama.cpp's cache file format (common_ngram_cache_save/load).

As llama-server: the context cache of a sequence only grows (never reset between requests;
the tokens past its size, the sampled one included, are added as one new run, so n-grams
that straddle two updates are not counted); -lcs and -lcd are read once, read-only. Where
llama-server never writes -lcd (its save_dynamic is false), llamaq keeps each request's tokens
for worker/speculative/lookup_share.py, which counts them into the fleet's dynamic cache in
the object store, as llama.cpp's lookup example counts a generation into it at its end. When
two tokens tie for
the most counts llama.cpp takes the first in its unordered_map's iteration order: each part's
dict keeps libstdc++'s order (`emplace`), so ties go as in the vendored llama-server (built
with g++ 12; another C++ library could order them otherwise).
"""

from __future__ import annotations

import bisect
import struct
from collections import deque
from collections.abc import Sequence
from pathlib import Path

NGRAM_MIN = 1
NGRAM_MAX = 4
NGRAM_STATIC = 2
N_DRAFT = 8
"""create_state_ngram_cache's n_draft (llama.cpp: `TODO get from config?`)."""
TOKEN_NULL = -1

MIN_SAMPLE_LAX = (2, 2, 1, 1)
MIN_PERCENT_LAX = (66, 50, 50, 50)
MIN_SAMPLE_STRICT = (4, 3, 2, 2)
MIN_PERCENT_STRICT = (75, 66, 66, 66)

Ngram = tuple[int, int, int, int]
NO_NGRAM: Ngram = (TOKEN_NULL, TOKEN_NULL, TOKEN_NULL, TOKEN_NULL)
"""An n-gram longer than the sequence (llama.cpp reads before its start: undefined; here
it matches nothing)."""
Cache = dict[Ngram, dict[int, int]]
"""n-gram (padded with -1 to four tokens) → token after it → times seen."""


_GROWS_AT = (1, 14, 30, 60, 128, 258, 542, 1110, 2358, 5088, 10274, 20754, 42044, 85230,
             172934, 351062)
_BUCKETS = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933,
            351061, 712697)
"""libstdc++'s bucket count of an unordered_map<int, int> grown one insertion at a time from
empty: _BUCKETS[i] from _GROWS_AT[i] elements on (its prime rehash policy, max load 1.0;
printed by a g++ 12 program, the compiler the vendored llama-server is built with)."""
_SIZE_T = 1 << 64


def _bucket_count(n: int) -> int:
    return _BUCKETS[bisect.bisect_right(_GROWS_AT, n) - 1]


def _place(keys: list[int], token: int, n_buckets: int) -> None:
    """libstdc++'s _M_insert_bucket_begin: first of its bucket's run of nodes, or first of
    the list when its bucket is empty (std::hash<int>: the value as size_t)."""
    bucket = token % _SIZE_T % n_buckets
    for i, key in enumerate(keys):
        if key % _SIZE_T % n_buckets == bucket:
            keys.insert(i, token)
            return
    keys.insert(0, token)


def emplace(part: dict[int, int], token: int, count: int) -> dict[int, int]:
    """`part` with `token` (not in it) added as std::unordered_map::emplace adds it: the
    dict's order is the map's iteration order (a rehash re-threads the nodes in their order,
    each first of its new bucket's run), which decides ties for the most counts in
    llama.cpp's drafts (its strict `>` keeps the first)."""
    n = len(part)
    n_buckets = _bucket_count(n + 1)
    keys = list(part)
    if n and n_buckets != _bucket_count(n):
        rehashed: list[int] = []
        for key in keys:
            _place(rehashed, key, n_buckets)
        keys = rehashed
    _place(keys, token, n_buckets)
    return {key: part.get(key, count) for key in keys}


def ngram_of(tokens: list[int]) -> Ngram:
    padded = [*tokens, TOKEN_NULL, TOKEN_NULL, TOKEN_NULL, TOKEN_NULL][:NGRAM_MAX]
    return (padded[0], padded[1], padded[2], padded[3])


def update(cache: Cache, ngram_min: int, ngram_max: int, inp: list[int], nnew: int) -> None:
    """common_ngram_cache_update: count every n-gram ending in the last `nnew` tokens."""
    size = len(inp)
    for n in range(ngram_min, ngram_max + 1):
        for i in range(max(size - nnew, n), size):
            ngram = ngram_of(inp[i - n:i])
            part = cache.get(ngram, {})
            if inp[i] in part:
                part[inp[i]] += 1
            else:
                cache[ngram] = emplace(part, inp[i], 1)


def _try_static(nc_static: Cache, ngram: Ngram) -> int:
    part = nc_static.get(ngram)
    if part is None:
        return TOKEN_NULL
    max_count = 0
    total = 0
    max_token = TOKEN_NULL
    for token, count in part.items():
        if count > max_count:
            max_token, max_count = token, count
        total += count
    if total < MIN_SAMPLE_LAX[NGRAM_STATIC - 1]:
        return TOKEN_NULL
    if 100 * max_count < MIN_PERCENT_LAX[NGRAM_STATIC - 1] * total:
        return TOKEN_NULL
    return max_token


def _try_primary(nc: Cache, ngrams: list[Ngram], part_static: dict[int, int],
                 min_sample: tuple[int, ...], min_percent: tuple[int, ...]) -> int:
    """The longest n-gram first; a token's static weight is 100×its static count, or 1."""
    for i in range(len(ngrams) - 1, -1, -1):
        part = nc.get(ngrams[i])
        if part is None:
            continue
        max_primary = 0
        max_static = 0
        total = 0
        max_token = TOKEN_NULL
        for token, count in part.items():
            weight = 100 * part_static[token] if token in part_static else 1
            if count * weight > max_primary * max_static:
                max_token, max_primary, max_static = token, count, weight
            total += count
        if total < min_sample[i]:
            continue
        if 100 * max_primary < min_percent[i] * total:
            continue
        return max_token
    return TOKEN_NULL


def draft(inp: list[int], n_draft: int, ngram_min: int, ngram_max: int, nc_context: Cache,
          nc_dynamic: Cache, nc_static: Cache) -> list[int]:
    """common_ngram_cache_draft: the drafted tokens (without the sampled one, which `inp`
    ends with), at most `n_draft`."""
    out: list[int] = []
    if len(inp) < NGRAM_STATIC:
        return out
    while len(out) < n_draft:
        seq = inp + out
        part_static = nc_static.get(ngram_of(seq[len(seq) - NGRAM_STATIC:]), {})
        ngrams = [ngram_of(seq[len(seq) - n:]) if n <= len(seq) else NO_NGRAM
                  for n in range(ngram_min, ngram_max + 1)]
        token = _try_primary(nc_context, ngrams, part_static, MIN_SAMPLE_LAX, MIN_PERCENT_LAX)
        if token == TOKEN_NULL:
            token = _try_primary(nc_dynamic, ngrams, part_static, MIN_SAMPLE_STRICT,
                                 MIN_PERCENT_STRICT)
        if token == TOKEN_NULL:
            token = _try_static(nc_static, ngram_of(seq[len(seq) - NGRAM_STATIC:]))
        if token == TOKEN_NULL:
            break
        out.append(token)
    return out


class CacheFileError(ValueError):
    pass


def dumps(cache: Cache) -> bytes:
    """common_ngram_cache_save's bytes: per n-gram its four int32 tokens, int32 count of
    tokens, then (int32 token, int32 count) pairs; little-endian as on llama.cpp's hosts."""
    out = bytearray()
    for ngram, part in cache.items():
        if not part:
            continue
        out += struct.pack("<4ii", *ngram, len(part))
        for token, count in part.items():
            out += struct.pack("<ii", token, count)
    return bytes(out)


def loads(data: bytes, name: str = "cache") -> Cache:
    """common_ngram_cache_load (a truncated record or a count ≤ 0 is an error, as its
    asserts)."""
    cache: Cache = {}
    pos = 0
    size = len(data)
    while pos + 16 <= size:
        t0, t1, t2, t3 = struct.unpack_from("<4i", data, pos)
        pos += 16
        if pos + 4 > size:
            raise CacheFileError(f"{name}: truncated n-gram record")
        (ntokens,) = struct.unpack_from("<i", data, pos)
        pos += 4
        if ntokens <= 0 or pos + 8 * ntokens > size:
            raise CacheFileError(f"{name}: bad token count {ntokens}")
        part: dict[int, int] = {}
        for _ in range(ntokens):
            token, count = struct.unpack_from("<ii", data, pos)
            pos += 8
            if count <= 0:
                raise CacheFileError(f"{name}: bad count {count}")
            if token not in part:
                part = emplace(part, token, count)
        cache.setdefault((t0, t1, t2, t3), part)
    if pos != size:
        raise CacheFileError(f"{name}: trailing {size - pos} bytes")
    return cache


def load_file(path: str, missing_ok: bool = False) -> Cache:
    """The cache file at `path`; `missing_ok`: none there is an empty cache (-lcd, which
    llamaq writes, as llama.cpp's lookup example creates it)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise CacheFileError(f"failed to open lookup cache: {path} (no such file)") from None
    except OSError as e:
        raise CacheFileError(f"failed to open lookup cache: {path} ({e.strerror})") from e
    return loads(data, path)


def count_runs(cache: Cache, runs: list[list[int]]) -> None:
    """Count every n-gram of each token run into `cache` (the context cache llama.cpp's
    lookup example builds over one generation, merged into its dynamic cache at the end)."""
    for tokens in runs:
        update(cache, NGRAM_MIN, NGRAM_MAX, tokens, len(tokens))


def file_size(cache: Cache) -> int:
    """The bytes `dumps(cache)` makes."""
    return sum(20 + 8 * len(part) for part in cache.values() if part)


def prune(cache: Cache, max_bytes: int) -> Cache:
    """`cache` when its file fits `max_bytes`; else the n-grams seen most often (their counts
    summed) that fit three quarters of it (room to grow before the next prune), in `cache`'s
    order."""
    if file_size(cache) <= max_bytes:
        return cache
    ranked = sorted(((sum(part.values()), i, ngram) for i, (ngram, part)
                     in enumerate(cache.items()) if part), key=lambda r: (-r[0], r[1]))
    kept: set[Ngram] = set()
    room = max_bytes * 3 // 4
    for _, _, ngram in ranked:
        size = 20 + 8 * len(cache[ngram])
        if size <= room:
            kept.add(ngram)
            room -= size
    return {ngram: part for ngram, part in cache.items() if ngram in kept}


def merge(target: Cache, add: Cache) -> None:
    """common_ngram_cache_merge."""
    for ngram, part in add.items():
        into = target.get(ngram)
        if into is None:
            target[ngram] = dict(part)  # a copy keeps the order
            continue
        for token, count in part.items():
            if token in into:
                into[token] += count
            else:
                into = target[ngram] = emplace(into, token, count)


class NgramCache:
    """The mode's drafter: a context cache per sequence; the static and dynamic caches shared
    (read-only, as llama-server's per-sequence copies of them are)."""

    name = "ngram-cache"

    def __init__(self, n_seq: int, nc_static: Cache | None = None,
                 nc_dynamic: Cache | None = None, learns: bool = False) -> None:
        """`learns`: keep each request's tokens for the dynamic cache's next save (-lcd)."""
        self.n_max = N_DRAFT
        self.nc_static: Cache = nc_static or {}
        self.nc_dynamic: Cache = nc_dynamic or {}
        self._context: list[Cache] = [{} for _ in range(n_seq)]
        self._size = [0] * n_seq
        self._learned: deque[list[int]] | None = deque() if learns else None

    def learn(self, tokens: Sequence[int]) -> None:
        """A request left its slot with `tokens` (prompt and generation) in its cache; copied
        only when -lcd keeps them (the slot's list changes with its next request)."""
        if self._learned is not None and tokens:
            self._learned.append(list(tokens))

    def take_learned(self) -> list[list[int]]:
        """The runs learned since the last call (any thread: a deque's pops are atomic)."""
        runs: list[list[int]] = []
        while self._learned:
            runs.append(self._learned.popleft())
        return runs

    def begin(self, seq: int, prompt: list[int]) -> None:
        pass

    def draft(self, seq: int, prompt: list[int], id_last: int) -> list[int]:
        context = self._context[seq]
        if self._size[seq] < len(prompt) + 1:
            new = [*prompt[self._size[seq]:], id_last]
            update(context, NGRAM_MIN, NGRAM_MAX, new, len(new))
            self._size[seq] = len(prompt) + 1
        return draft([*prompt, id_last], N_DRAFT, NGRAM_MIN, NGRAM_MAX, context,
                     self.nc_dynamic, self.nc_static)

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        pass
