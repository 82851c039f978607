"""Issue 43's holes tried against a live fleet, as a caller would (not a test): one line each,
`closed` or `OPEN`, exit 1 when one is open.

    .venv/bin/python bench/security.py

One Gemma 3 270M worker (one slot, the host prompt cache on), an api pod with --tenants (alice
and carol share caches, bob does not, ops is the admin) and one without keys with every tool
(the default local setup, --cors-origins localhost). What each line tries:

- 2: a caller names `x-tool-runtime: docker-container:redis` (403, nothing run there);
- 3: a foreign page posts `text/plain` to /tools to run a shell command (403/415, not run);
- 5, 11: /cors-proxy to the fleet's own Redis port on loopback (403, nothing sent);
- 7: a plain tenant sets the global LoRA scales, erases a slot, unloads the model (403 each);
- 8: bob sends alice's exact prompt: his `timings.cache_n` is 0 (the slot, then the host
  cache); carol (alice's cache group) gets the hit;
- 10: 65 message_delimiters (400, before a job exists).

Items 1, 4, 6, 9, 12, 13 need setups of their own (a git tree, a regex budget, a dropped
stream, n_probs in Redis, a slow store, a video model): their tests are named in the issue's
closing note.
"""

from __future__ import annotations

import json
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from storage import default_model_path  # noqa: E402
from tests.processes import Fleet, start_redis  # noqa: E402

TENANTS = [
    {"name": "alice", "keys": ["k-alice"], "share_cache_with": ["carol"]},
    {"name": "bob", "keys": ["k-bob"]},
    {"name": "carol", "keys": ["k-carol"], "share_cache_with": ["alice"]},
    {"name": "ops", "keys": ["k-ops"], "admin": True},
]


def key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer k-{name}"}


def cache_n(api: str, tenant: str, prompt: str) -> int:
    answer = httpx.post(f"{api}/completion", headers=key(tenant), timeout=120,
                        json={"prompt": prompt, "n_predict": 2})
    answer.raise_for_status()
    return int(answer.json()["timings"]["cache_n"])


def hole_2(local: str, workdir: Path) -> tuple[bool, str]:
    res = httpx.post(f"{local}/tools", timeout=30, headers={
        "x-tool-runtime": "docker-container:redis"},
        json={"tool": "exec_shell_command", "params": {"command": "true"}})
    return res.status_code == 403, f"x-tool-runtime of a container: {res.status_code}"


def hole_3(local: str, workdir: Path) -> tuple[bool, str]:
    marker = workdir / "pwned"
    body = json.dumps({"tool": "exec_shell_command",
                       "params": {"command": f"touch {marker}"}})
    res = httpx.post(f"{local}/tools", content=body.encode(), timeout=30, headers={
        "Content-Type": "text/plain", "Origin": "http://evil.test"})
    return res.status_code in (403, 415) and not marker.exists(), \
        f"text/plain from http://evil.test: {res.status_code}, command ran: {marker.exists()}"


def hole_5_11(local: str, redis_url: str) -> tuple[bool, str]:
    port = urlsplit(redis_url).port
    res = httpx.get(f"{local}/cors-proxy", params={"url": f"http://127.0.0.1:{port}/"},
                    timeout=30)
    return res.status_code == 403, f"/cors-proxy to loopback Redis: {res.status_code}"


def hole_7(api: str) -> tuple[bool, str]:
    tries = {
        "POST /lora-adapters": lambda: httpx.post(f"{api}/lora-adapters", json=[],
                                                  headers=key("bob"), timeout=30),
        "erase slot 0": lambda: httpx.post(f"{api}/slots/0?action=erase", json={},
                                           headers=key("bob"), timeout=30),
        "POST /models/unload": lambda: httpx.post(f"{api}/models/unload",
                                                  json={"model": "bench-security"},
                                                  headers=key("bob"), timeout=30),
    }
    codes = {what: send().status_code for what, send in tries.items()}
    return all(c == 403 for c in codes.values()), f"a plain tenant's fleet changes: {codes}"


def hole_8(api: str) -> tuple[bool, str]:
    nonce = uuid.uuid4().hex
    prompt = f"{nonce} private: " + " ".join(f"entry {nonce[i % 32]}{i}" for i in range(40))
    cache_n(api, "alice", prompt)
    from_slot = cache_n(api, "bob", prompt)
    from_host_cache = cache_n(api, "carol", prompt)  # the slot is bob's: alice's state
    other = f"{uuid.uuid4().hex} " + prompt
    cache_n(api, "alice", other)
    cache_n(api, "alice", f"{uuid.uuid4().hex} something else entirely")
    bob_host = cache_n(api, "bob", other)
    closed = from_slot == 0 and bob_host == 0 and from_host_cache > 20
    return closed, (f"bob's cache_n for alice's prompt: {from_slot} (slot), {bob_host} (host "
                    f"cache); carol's (alice's group): {from_host_cache}")


def hole_10(api: str) -> tuple[bool, str]:
    res = httpx.post(f"{api}/completion", headers=key("bob"), timeout=30, json={
        "prompt": "Hi", "n_predict": 1,
        "message_delimiters": [{"role": "user", "delimiter": f"d{i}"} for i in range(65)]})
    return res.status_code == 400, f"65 message_delimiters: {res.status_code}"


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="llamaq-security-"))
    tenants_file = workdir / "tenants.json"
    tenants_file.write_text(json.dumps({"tenants": TENANTS}))
    redis_process, redis_url = start_redis(workdir / "redis")
    model = default_model_path(Path.home() / ".cache" / "llamaq-tests")
    fleet = Fleet(redis_url, workdir, ["-m", str(model), "--alias", "bench-security",
                                       "--store-url", str(workdir / "store"), "--cache-dir",
                                       str(workdir / "cache")], logs=workdir / "logs")
    lines: list[tuple[str, bool, str]] = []
    try:
        fleet.add_worker("-c", "2048", "-np", "1")
        api = fleet.add_api("--tenants", str(tenants_file))
        local = fleet.add_api("--tools", "all", "--tools-root", str(workdir))
        fleet.wait_healthy(api)
        fleet.wait_healthy(local)
        checks: list[tuple[str, Callable[[], tuple[bool, str]]]] = [
            ("2", lambda: hole_2(local, workdir)),
            ("3", lambda: hole_3(local, workdir)),
            ("5, 11", lambda: hole_5_11(local, redis_url)),
            ("7", lambda: hole_7(api)),
            ("8", lambda: hole_8(api)),
            ("10", lambda: hole_10(api)),
        ]
        for item, check in checks:
            try:
                closed, detail = check()
            except httpx.HTTPError as error:
                closed, detail = False, f"{type(error).__name__}: {error}"
            lines.append((item, closed, detail))
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()
    for item, closed, detail in lines:
        print(f"item {item:6} {'closed' if closed else 'OPEN  '}  {detail}")
    sys.exit(0 if all(closed for _, closed, _ in lines) else 1)


if __name__ == "__main__":
    main()
