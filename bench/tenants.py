"""Tenants under load (not a test): three tenants drive one fleet together, one with
`max_concurrent 2`, one with `tokens_per_minute`, one unlimited (docs/tenants.md).

    .venv/bin/python bench/tenants.py [--seconds 120] [--alone-seconds 40] [--np 4]

First the unlimited tenant runs alone (its TTFT p50 is the baseline), then all three for
`--seconds`. Clients send streamed requests one after another, honouring Retry-After. Checks
and prints: the limited tenants see only 200s and 429s with Retry-After; the unlimited one
sees only 200s, its p50 TTFT within 10 % of running alone; no 5xx anywhere. Exits 1 when a
check fails. Run it on a quiet machine (it measures latency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from storage import default_model_path  # noqa: E402
from tests.processes import Fleet, start_redis  # noqa: E402

TENANTS = [
    {"name": "conc", "keys": ["k-conc"], "max_concurrent": 2},
    {"name": "tpm", "keys": ["k-tpm"], "tokens_per_minute": 600},
    {"name": "free", "keys": ["k-free"]},
]


@dataclass
class Seen:
    statuses: Counter[str] = field(default_factory=Counter)
    ttft_s: list[float] = field(default_factory=list)
    prompt_s: list[float] = field(default_factory=list)
    """The worker's prompt time of each answer (its final timings): the TTFT less the hops and
    the wait for a step."""
    token_rate: list[float] = field(default_factory=list)
    """Each answer's generation tokens/s (its final timings)."""
    bad: Counter[str] = field(default_factory=Counter)
    """429 without Retry-After, a 5xx, an HTTP error, a stream without its end."""


async def client(http: httpx.AsyncClient, api: str, key: str, n: int, until: float,
                 seen: Seen, n_predict: int) -> None:
    body = {"prompt": f"Client {n} tells a story:", "n_predict": n_predict, "stream": True}
    headers = {"Authorization": f"Bearer {key}"}
    while time.monotonic() < until:
        sent = time.monotonic()
        try:
            async with http.stream("POST", f"{api}/completion", json=body,
                                   headers=headers) as response:
                status = response.status_code
                seen.statuses[str(status)] += 1
                if status != 200:
                    await response.aread()
                    if status == 429 and "retry-after" in response.headers:
                        wait = float(response.headers["retry-after"])
                        await asyncio.sleep(min(wait, max(0.0, until - time.monotonic())))
                    else:
                        seen.bad[f"status {status}"] += 1
                        await asyncio.sleep(1)
                    continue
                first = True
                ended = False
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        seen.bad[f"stream error {event['error'].get('code')}"] += 1
                        break
                    if first and event.get("content"):
                        seen.ttft_s.append(time.monotonic() - sent)
                        first = False
                    if event.get("stop"):
                        ended = True
                        timings = event.get("timings") or {}
                        seen.prompt_s.append(timings.get("prompt_ms", 0.0) / 1000)
                        seen.token_rate.append(timings.get("predicted_per_second", 0.0))
                if not ended:
                    seen.bad["stream without its end"] += 1
        except httpx.HTTPError as error:
            seen.bad[type(error).__name__] += 1


async def drive(api: str, plan: dict[str, int], seconds: float,
                n_predict: int) -> dict[str, Seen]:
    """`plan`: tenant key -> clients."""
    seen = {key: Seen() for key in plan}
    until = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as http:
        await asyncio.gather(*(client(http, api, key, n, until, seen[key], n_predict)
                               for key, clients in plan.items() for n in range(clients)))
    return seen


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def times(seen: Seen) -> str:
    return f"the worker's prompt time p50 {p50(seen.prompt_s) * 1000:.0f} ms, generation " \
           f"p50 {p50(seen.token_rate):.1f} tok/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--alone-seconds", type=float, default=40)
    parser.add_argument("--np", type=int, default=4, dest="n_slots")
    parser.add_argument("--n-predict", type=int, default=32)
    parser.add_argument("--free-clients", type=int, default=1)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="llamaq-tenants-"))
    tenants_file = workdir / "tenants.json"
    tenants_file.write_text(json.dumps({"tenants": TENANTS}))
    redis_process, redis_url = start_redis(workdir / "redis")
    model = default_model_path(Path.home() / ".cache" / "llamaq-tests")
    fleet = Fleet(redis_url, workdir, ["-m", str(model), "--alias", "bench-tenants",
                                       "--store-url", str(workdir / "store"), "--cache-dir",
                                       str(workdir / "cache")], logs=workdir / "logs")
    try:
        fleet.add_worker("-c", str(512 * args.n_slots), "-np", str(args.n_slots))
        api = fleet.add_api("--tenants", str(tenants_file))
        fleet.wait_healthy(api)
        asyncio.run(drive(api, {"k-free": 1}, 3, 4))  # warm-up
        alone = asyncio.run(drive(api, {"k-free": args.free_clients}, args.alone_seconds,
                                  args.n_predict))["k-free"]
        together = asyncio.run(drive(api, {"k-conc": 4, "k-tpm": 2,
                                           "k-free": args.free_clients},
                                     args.seconds, args.n_predict))
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()
    print(f"free alone: {sum(alone.statuses.values())} requests, TTFT p50 "
          f"{p50(alone.ttft_s) * 1000:.0f} ms ({times(alone)}), statuses "
          f"{dict(alone.statuses)}")
    for key, seen in together.items():
        print(f"{key} together: statuses {dict(seen.statuses)}, TTFT p50 "
              f"{p50(seen.ttft_s) * 1000:.0f} ms ({times(seen)}), problems {dict(seen.bad)}")
    free = together["k-free"]
    ratio = p50(free.ttft_s) / p50(alone.ttft_s)
    print(f"free TTFT p50 together / alone: {ratio:.2f}")
    limited_ok = all(set(together[k].statuses) <= {"200", "429"} and not together[k].bad
                     for k in ("k-conc", "k-tpm"))
    refused_some = all(together[k].statuses["429"] > 0 for k in ("k-conc", "k-tpm"))
    free_ok = set(free.statuses) == {"200"} and not free.bad and not alone.bad
    checks = {"limited tenants: only 200 and 429 with Retry-After": limited_ok,
              "limited tenants were limited (some 429)": refused_some,
              "unlimited tenant: only 200, no 5xx": free_ok,
              "unlimited tenant's TTFT p50 within 10 % of alone": ratio <= 1.10}
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print("OK" if all(checks.values()) else "FAILED")
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
