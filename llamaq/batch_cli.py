"""`llamaq batch submit|status|list|cancel|results`: the Batch API from a shell, with a progress
bar (lines done / total, rate, ETA) for `submit --wait` and `status --wait`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

FINAL = ("completed", "failed", "cancelled", "expired")
POLL_S = 1.0
BAR_WIDTH = 30


class Api:
    def __init__(self, url: str, api_key: str | None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=600)

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            sys.exit(f"llamaq batch: cannot reach {self._client.base_url}: {error}")
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text
            sys.exit(f"llamaq batch: {response.status_code}: {message}")
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        data: dict[str, Any] = self.call(method, path, **kwargs).json()
        return data


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="llamaq batch", description=__doc__)
    top.add_argument("--url", default=os.environ.get("LLAMAQ_URL", "http://127.0.0.1:9931"),
                     help="the api (env LLAMAQ_URL)")
    top.add_argument("--api-key", default=os.environ.get("LLAMA_API_KEY"),
                     help="API key (env LLAMA_API_KEY)")
    commands = top.add_subparsers(dest="command", required=True)
    submit = commands.add_parser("submit", help="upload a JSONL file and start a batch")
    submit.add_argument("file", type=Path)
    submit.add_argument("--endpoint", help="default: the `url` of the file's first line")
    submit.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument("--wait", action="store_true", help="follow it to its end")
    status = commands.add_parser("status", help="one batch")
    status.add_argument("batch_id")
    status.add_argument("--wait", action="store_true", help="follow it to its end")
    listing = commands.add_parser("list", help="batches, newest first")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--after")
    cancel = commands.add_parser("cancel", help="stop a batch (what is done is kept)")
    cancel.add_argument("batch_id")
    results = commands.add_parser("results", help="a batch's output (or error) lines")
    results.add_argument("batch_id")
    results.add_argument("--errors", action="store_true", help="the error file instead")
    results.add_argument("-o", "--output", type=Path, help="write to a file (default stdout)")
    return top


def run_batch_cli(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    api = Api(args.url, args.api_key)
    if args.command == "submit":
        batch = submit(api, args.file, args.endpoint, args.metadata)
        print(batch["id"])
        if args.wait:
            follow(api, batch["id"])
    elif args.command == "status":
        if args.wait:
            follow(api, args.batch_id)
        else:
            print(json.dumps(api.json("GET", f"/v1/batches/{args.batch_id}"), indent=2))
    elif args.command == "list":
        params: dict[str, Any] = {"limit": args.limit}
        if args.after:
            params["after"] = args.after
        for batch in api.json("GET", "/v1/batches", params=params)["data"]:
            print(summary(batch))
    elif args.command == "cancel":
        print(summary(api.json("POST", f"/v1/batches/{args.batch_id}/cancel")))
    elif args.command == "results":
        write_results(api, args.batch_id, args.errors, args.output)


def submit(api: Api, path: Path, endpoint: str | None, metadata: list[str]) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as error:
        sys.exit(f"llamaq batch: {error}")
    if endpoint is None:
        endpoint = first_url(data)
    pairs = dict(item.partition("=")[::2] for item in metadata)
    uploaded = api.json("POST", "/v1/files", data={"purpose": "batch"},
                        files={"file": (path.name, data, "application/jsonl")})
    body: dict[str, Any] = {"input_file_id": uploaded["id"], "endpoint": endpoint,
                            "completion_window": "24h"}
    if pairs:
        body["metadata"] = pairs
    return api.json("POST", "/v1/batches", json=body)


def first_url(data: bytes) -> str:
    for raw in data.splitlines():
        if raw.strip():
            try:
                url = json.loads(raw).get("url")
            except (ValueError, AttributeError):
                break
            if isinstance(url, str):
                return url
            break
    sys.exit("llamaq batch: give --endpoint (the file's first line names no url)")


def summary(batch: dict[str, Any]) -> str:
    counts = batch.get("request_counts") or {}
    return (f"{batch['id']}  {batch['status']:<11} {batch['endpoint']:<21} "
            f"{counts.get('completed', 0) + counts.get('failed', 0)}/{counts.get('total', 0)}"
            f" done, {counts.get('failed', 0)} failed")


def progress_line(batch: dict[str, Any], started: float, first_done: int) -> str:
    counts = batch.get("request_counts") or {}
    total = counts.get("total", 0)
    done = counts.get("completed", 0) + counts.get("failed", 0)
    filled = int(BAR_WIDTH * done / total) if total else 0
    elapsed = max(time.monotonic() - started, 1e-6)
    rate = (done - first_done) / elapsed
    eta = f"{int((total - done) / rate)}s" if rate > 0 and total > done else "-"
    return (f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} lines "
            f"{rate:.1f}/s ETA {eta} {batch['status']}")


def follow(api: Api, batch_id: str) -> None:
    started = time.monotonic()
    first_done: int | None = None
    while True:
        batch = api.json("GET", f"/v1/batches/{batch_id}")
        counts = batch.get("request_counts") or {}
        if first_done is None:
            first_done = counts.get("completed", 0) + counts.get("failed", 0)
        line = progress_line(batch, started, first_done)
        if sys.stderr.isatty():
            print("\r" + line, end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)
        if batch["status"] in FINAL:
            if sys.stderr.isatty():
                print(file=sys.stderr)
            print(summary(batch))
            for error in (batch.get("errors") or {}).get("data") or []:
                print(f"  line {error.get('line')}: {error.get('code')}: {error.get('message')}")
            if batch["status"] != "completed":
                sys.exit(1)
            return
        time.sleep(POLL_S)


def write_results(api: Api, batch_id: str, errors: bool, output: Path | None) -> None:
    batch = api.json("GET", f"/v1/batches/{batch_id}")
    file_id = batch.get("error_file_id" if errors else "output_file_id")
    if not file_id:
        if batch["status"] not in FINAL:
            sys.exit(f"llamaq batch: {batch_id} is {batch['status']}; no results yet")
        return  # no such lines
    content = api.call("GET", f"/v1/files/{file_id}/content").content
    if output is None:
        sys.stdout.buffer.write(content)
    else:
        output.write_bytes(content)
