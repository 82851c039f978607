"""`llamaq up` hands every flag to the roles that take it, and prints no Redis password."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.processes import free_port, wait_until

pytestmark = pytest.mark.process  # starts llamaq or redis-server (tests/lanes.py)


def test_up_passes_flags_to_both_roles_and_hides_the_redis_password(
        tmp_path: Path, gemma_path: Path) -> None:
    binary = shutil.which("redis-server")
    assert binary
    redis_port = free_port()
    redis_process = subprocess.Popen(
        [binary, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--requirepass", "hunter2-pw", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL)
    port = free_port()
    log = tmp_path / "up.log"
    env = {**os.environ, "LLAMAQ_REDIS_URL": f"redis://:hunter2-pw@127.0.0.1:{redis_port}/0"}
    up = subprocess.Popen(
        [sys.executable, "-m", "llamaq", "up", "-m", str(gemma_path), "--alias", "gemma-up",
         "-c", "512", "-np", "1", "-t", "1", "--port", str(port), "-r", "\\n", "--prio", "-1",
         "-v", "--store-url", str(tmp_path / "store"), "--cache-dir", str(tmp_path / "cache"),
         "--no-warmup"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 120,
                   what="llamaq up")
        assert up.stdout is not None
        banner = up.stdout.readline()
        assert f"serving on http://127.0.0.1:{port}" in banner
        assert f"redis://:***@127.0.0.1:{redis_port}/0" in banner
        body = {"prompt": "A list:\n1.", "n_predict": 64, "temperature": 0}
        result = httpx.post(f"{url}/completion", json=body, timeout=120).json()
        assert "\n" not in result["content"]
        assert result["stop_type"] in ("word", "eos")
        assert result["generation_settings"]["stop"] == ["\n"]  # -r "\n" with -e: a newline
    finally:
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=60)
        redis_process.terminate()
        redis_process.wait()
    errors = log.read_text(errors="replace")
    assert "hunter2-pw" not in errors
    assert " DEBUG " in errors  # -v reached the processes


def test_up_without_a_model_is_a_router_over_the_store(tmp_path: Path) -> None:
    """`llamaq up` with no -m (and no --default-model, which scripts/up passes) is the
    spec's router mode: the model in the object store is listed; a preset adds options to it
    (they reach the worker) and loads it at start."""
    from storage import LocalStore
    from tests.tiny_gguf import write_tiny_llama

    store = tmp_path / "store"
    LocalStore(store).put_file("models/tiny.gguf", write_tiny_llama(tmp_path / "t.gguf"))
    preset = tmp_path / "presets.ini"
    preset.write_text("version = 1\n[*]\nn-predict = 3\n[tiny.gguf]\nload-on-startup = true\n"
                      "chat-template = chatml\njinja = true\nLLAMA_ARG_CACHE_RAM = 0\n"
                      f"[bad]\nmodel = {tmp_path / 't.gguf'}\nno-such-option = 1\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "LLAMAQ_"))}
    up = subprocess.Popen(
        [sys.executable, "-m", "llamaq", "up", "-c", "512", "-np", "1", "-t", "1",
         "--no-warmup", "--port", str(port), "--store-url", str(store),
         "--cache-dir", str(tmp_path / "cache"), "--models-preset", str(preset),
         "--models-max", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=(tmp_path / "up.log").open("w"),
        text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 120,
                   what="llamaq up")
        assert up.stdout is not None
        assert "in router mode" in up.stdout.readline()
        models = httpx.get(f"{url}/v1/models").json()["data"]
        assert sorted((m["id"], m["source"]) for m in models) == [("bad", "preset"),
                                                                   ("tiny.gguf", "preset")]

        def status(name: str = "tiny.gguf") -> dict[str, object]:
            data = httpx.get(f"{url}/models").json()["data"]
            return dict(next(m["status"] for m in data if m["id"] == name))

        wait_until(lambda: status()["value"] == "loaded", 120, what="load-on-startup")
        assert status()["args"] == ["llamaq", "worker", "-m", "tiny.gguf",
                                    "--alias", "tiny.gguf", "--n-predict", "3",
                                    "--chat-template", "chatml", "--jinja", "true",
                                    "LLAMA_ARG_CACHE_RAM=0"]
        body = {"model": "tiny.gguf", "prompt": "the", "ignore_eos": True}
        result = httpx.post(f"{url}/completion", json=body, timeout=120)
        assert result.status_code == 200, result.text
        assert result.json()["tokens_predicted"] == 3  # the preset's n-predict
        chat = {"model": "tiny.gguf", "messages": [{"role": "user", "content": "hi"}]}
        rendered = httpx.post(f"{url}/apply-template", json=chat, timeout=30)
        assert rendered.status_code == 200, rendered.text  # the preset's api keys, applied
        assert rendered.json()["prompt"] == (
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        # the one worker is idle: a load evicts tiny; an option no worker takes fails it (2)
        assert httpx.post(f"{url}/models/load", json={"model": "bad"}).status_code == 200
        wait_until(lambda: status("bad").get("failed"), 60, what="the failed load")
        assert status("bad")["exit_code"] == 2 and status() == {"value": "unloaded"}
        result = httpx.post(f"{url}/completion", json=body, timeout=120)  # loads tiny again
        assert result.status_code == 200 and status()["value"] == "loaded"
    finally:
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=60)


def test_api_with_a_missing_models_dir_stops_at_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "LLAMAQ_"))}
    done = subprocess.run(
        [sys.executable, "-m", "llamaq", "api", "--models-dir", str(tmp_path / "nope"),
         "--port", str(free_port())], capture_output=True, text=True, timeout=60, env=env,
        cwd=tmp_path)
    assert done.returncode == 1
    assert "does not exist or is not a directory" in done.stderr


def test_up_starts_with_a_llama_server_env_file_and_off_switches(tmp_path: Path,
                                                                  gemma_path: Path,
                                                                  redis_url: str) -> None:
    """A typical llama-server deployment's environment (LLAMA_ARG_*), with unbuilt features
    switched off on the command line and in the environment: it starts and serves."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "LLAMAQ_"))}
    env.update({
        "LLAMAQ_REDIS_URL": redis_url, "LLAMA_ARG_HOST": "127.0.0.1", "LLAMA_ARG_PORT": str(port),
        "LLAMA_ARG_MODEL": str(gemma_path), "LLAMA_ARG_CTX_SIZE": "1024",
        "LLAMA_ARG_N_PARALLEL": "2", "LLAMA_ARG_FLASH_ATTN": "on",
        "LLAMA_ARG_CACHE_TYPE_K": "f16", "LLAMA_ARG_CACHE_TYPE_V": "f16",
        "LLAMA_ARG_N_GPU_LAYERS": "99", "LLAMA_ARG_CACHE_RAM": "0",
        "LLAMA_ARG_NO_MMPROJ_AUTO": "1", "LLAMA_ARG_ENDPOINT_METRICS": "1",
        "LLAMA_API_KEY": "sekrit", "LLAMA_ARG_ALIAS": "my-model", "LLAMA_ARG_THREADS": "1",
        "LLAMA_ARG_SPEC_TYPE": "none", "LLAMA_ARG_AGENT": "false"})
    up = subprocess.Popen(
        [sys.executable, "-m", "llamaq", "up", "--no-mmproj", "--cache-ram", "0", "--spec-type",
         "none", "--no-agent", "--fit", "off", "--no-warmup", "--store-url",
         str(tmp_path / "store"), "--cache-dir", str(tmp_path / "cache")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "up.log").open("w"))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: up.poll() is not None
                   or httpx.get(f"{url}/health").status_code == 200, 120, what="llamaq up")
        assert up.poll() is None, (tmp_path / "up.log").read_text()[-2000:]
        auth = {"Authorization": "Bearer sekrit"}
        assert httpx.get(f"{url}/v1/models").status_code == 401
        models = httpx.get(f"{url}/v1/models", headers=auth).json()["data"]
        assert [m["id"] for m in models] == ["my-model"]
        reply = httpx.post(f"{url}/completion", headers=auth, timeout=120,
                           json={"prompt": "Hello", "n_predict": 4, "temperature": 0})
        assert reply.status_code == 200 and reply.json()["tokens_predicted"] >= 1
        assert httpx.get(f"{url}/metrics", headers=auth).status_code == 200
        props = httpx.get(f"{url}/props", headers=auth).json()
        assert props["default_generation_settings"]["n_ctx"] == 512  # 1024 over 2 slots
    finally:
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=60)


def test_up_in_router_mode_holds_models_max_models_at_once(tmp_path: Path) -> None:
    """`llamaq up --models-dir D --models-max 2` runs two workers: two models are loaded at
    once; an unload then at once a load of a third model succeeds (the unloading worker takes
    it once drained), as with llama-server's router."""
    from tests.tiny_gguf import write_tiny_llama

    models = tmp_path / "models"
    models.mkdir()
    for name in ("one", "two", "three"):
        write_tiny_llama(models / f"{name}.gguf")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "LLAMAQ_"))}
    up = subprocess.Popen(
        [sys.executable, "-m", "llamaq", "up", "-c", "256", "-np", "1", "-t", "1",
         "--no-warmup", "--port", str(port), "--models-dir", str(models), "--models-max", "2",
         "--store-url", str(tmp_path / "store"), "--cache-dir", str(tmp_path / "cache")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "up.log").open("w"))
    url = f"http://127.0.0.1:{port}"

    def status(name: str) -> str:
        data = httpx.get(f"{url}/models", timeout=30).json()["data"]
        return str(next(m["status"]["value"] for m in data if m["id"] == name))

    try:
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 120, what="llamaq up")
        for name in ("one", "two"):
            wait_until(lambda name=name: httpx.post(f"{url}/models/load", json={"model": name},
                                                    timeout=30).status_code == 200, 60,
                       what=f"{name} placed (the workers register first)")
        wait_until(lambda: status("one") == status("two") == "loaded", 120,
                   what="two models loaded at once")
        assert httpx.post(f"{url}/models/unload", json={"model": "one"}).status_code == 200
        load = httpx.post(f"{url}/models/load", json={"model": "three"}, timeout=30)
        assert load.status_code == 200, load.text
        wait_until(lambda: status("three") == "loaded", 120, what="three, on the freed worker")
        assert (status("one"), status("two")) == ("unloaded", "loaded")
        full = httpx.post(f"{url}/models/load", json={"model": "one"}, timeout=30)
        assert full.status_code == 200, full.text  # two and three are idle: the LRU goes
    finally:
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=60)


def command_lines_under(pid: int) -> list[str]:
    """The command lines of every process below `pid` (as `ps` shows them to any user)."""
    found, parents = [], {pid}
    for _ in range(3):  # up -> api, workers, redis -> sanic's own
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError, ValueError):
                continue
            if parent in parents and int(proc.name) not in parents:
                parents.add(int(proc.name))
                found.append(cmdline)
    return found


def test_up_keeps_secrets_off_the_children_command_lines(tmp_path: Path, tiny_model_path: Path,
                                                         redis_url: str) -> None:
    """API keys, the Hub token and a Redis URL given as flags reach the children through
    their environment, not their argv (which every user of the machine sees in `ps`)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "LLAMAQ_"))}
    up = subprocess.Popen(
        [sys.executable, "-m", "llamaq", "up", "-m", str(tiny_model_path), "-c", "256",
         "-np", "1", "-t", "1", "--no-warmup", "--port", str(port), "--api-key", "first-key",
         "--api-key=second-key", "-hft", "hf_secret_token", "--redis-url", redis_url,
         "--store-url", str(tmp_path / "store"), "--cache-dir", str(tmp_path / "cache")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "up.log").open("w"))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 120, what="llamaq up")
        for key in ("first-key", "second-key"):
            models = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert models.status_code == 200, key
        assert httpx.get(f"{url}/v1/models").status_code == 401
        lines = command_lines_under(up.pid)
        assert any(" api " in line for line in lines) and any(" worker " in line
                                                                 for line in lines), lines
        for secret in ("first-key", "second-key", "hf_secret_token", redis_url):
            assert not [line for line in lines if secret in line], secret
    finally:
        up.send_signal(signal.SIGTERM)
        up.communicate(timeout=60)


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children of children included)."""
    found: set[int] = set()
    parents = {pid}
    for _ in range(4):
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) in found:
                continue
            try:
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent in parents:
                found.add(int(proc.name))
                parents.add(int(proc.name))
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("listeners", ["one-host", "hosts-socket-tls"])
def test_nothing_of_up_is_left_5_s_after_it_is_stopped(tmp_path: Path, tiny_model_path: Path,
                                                        redis_url: str, sig: signal.Signals,
                                                        listeners: str) -> None:
    """`llamaq up` stopped by SIGTERM or killed by SIGKILL, listening on one address, or on
    several addresses, a UNIX socket and TLS at once: 5 s later none of its processes is left
    (Sanic's own shutdown loop once spun for ever with several listeners)."""
    port = free_port()
    where = ["--host", "127.0.0.1"]
    if listeners != "one-host":
        key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "1", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True)
        where = ["--host", f"127.0.0.1,::1,{tmp_path / 'api.sock'}", "--ssl-key-file",
                 str(key), "--ssl-cert-file", str(cert)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "LLAMAQ_"))}
    up = subprocess.Popen(
        [sys.executable, "-m", "llamaq", "up", "-m", str(tiny_model_path), "-c", "256",
         "-np", "1", "-t", "1", "--no-warmup", "--port", str(port), *where, "--redis-url",
         redis_url, "--store-url", str(tmp_path / "store"), "--cache-dir",
         str(tmp_path / "cache")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "up.log").open("w"))
    scheme = "https" if listeners != "one-host" else "http"
    try:
        wait_until(lambda: httpx.get(f"{scheme}://127.0.0.1:{port}/health",
                                     verify=False).status_code == 200, 120, what="llamaq up")
        family = descendants(up.pid)
        assert len(family) >= 2, family  # the api and the worker
        up.send_signal(sig)
        deadline = time.monotonic() + 5
        while (left := {p for p in family if not _zombie(p)}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:120] for p in left]
    finally:
        if up.poll() is None:
            up.kill()
        up.wait(timeout=30)
        for pid in descendants(up.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
