"""`llamaq health`: exit 0 when a process of the fleet is healthy (container healthchecks).

  llamaq health --worker ID         worker ID's heartbeat is in Redis (LLAMAQ_REDIS_URL)
  llamaq health --worker-file PATH  the same, with the id read from PATH
  llamaq health --url URL           URL (an api pod's /health) answers 200
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from scheduler.common_settings import CommonSettings, redis_url_of
from scheduler.contract import keys

TIMEOUT_S = 5.0


def worker_problem(redis_url: str, worker_id: str) -> str | None:
    """None when the worker's registry entry (refreshed by each heartbeat) exists."""
    try:
        with Redis.from_url(redis_url, socket_timeout=TIMEOUT_S,
                            socket_connect_timeout=TIMEOUT_S) as redis:
            if redis.exists(keys.worker_info(worker_id)):
                return None
    except RedisError as exc:
        return f"redis: {exc}"
    return f"worker {worker_id}: no heartbeat in the last {keys.HEARTBEAT_TTL_S} s"


def url_problem(url: str) -> str | None:
    """None when GET url answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return None if response.status == 200 else f"{url}: HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"{url}: HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {exc}"


def run_health(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="llamaq health", description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--worker", metavar="ID", help="worker id to look for in the registry")
    what.add_argument("--worker-file", metavar="PATH", help="file holding the worker id")
    what.add_argument("--url", help="URL that must answer 200")
    args = parser.parse_args(argv)
    if args.url:
        problem = url_problem(args.url)
    else:

        try:
            worker_id = args.worker or Path(args.worker_file).read_text().strip()
        except OSError as exc:
            sys.exit(f"llamaq health: {exc}")
        problem = worker_problem(redis_url_of(CommonSettings.from_args([])), worker_id)
    if problem:
        sys.exit(f"llamaq health: {problem}")
    print("ok")
