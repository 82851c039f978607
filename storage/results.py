"""Final results too big for Redis (scheduler/contract/keys.py RESULT_INLINE_MAX_BYTES), as
their JSON at `results/<job id>.json`: a worker writes one, the api pod that waits for the job
reads it, a sweep deletes it once its job's event log has expired
(worker/wires/result_offload.py)."""

from storage.base import ObjectStore, check_key
from storage.errors import InvalidKey

RESULTS_PREFIX = "results/"


def result_key(job_id: str) -> str:
    return check_key(f"{RESULTS_PREFIX}{job_id}.json")


def _checked(key: str) -> str:
    """`key` (from an event anyone could publish) if it names a stored result."""
    name = key.removeprefix(RESULTS_PREFIX)
    if name == key or "/" in name or not name.endswith(".json"):
        raise InvalidKey(f"not a result key: {key!r}")
    return check_key(key)


class ResultStore:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def put(self, job_id: str, data: bytes) -> str:
        key = result_key(job_id)
        self.store.put_bytes(key, data)
        return key

    def get(self, key: str) -> bytes:
        """Raises ObjectNotFound once it was swept, InvalidKey for a key not a result's."""
        return self.store.get_bytes(_checked(key))

    def delete(self, key: str) -> None:
        self.store.delete(_checked(key))
