"""S3Store specifics against a real moto server: bucket creation, prefixes, endpoint down."""

import time

import boto3
import pytest

from storage import InvalidKey, SlotSnapshotStore, StorageUnavailable
from storage.s3 import S3Store, make_s3_client


def test_creates_missing_bucket_and_reuses_existing(
    moto_endpoint: str, aws_env: None, bucket_name: str
) -> None:
    bucket = bucket_name
    first = S3Store(bucket, "", moto_endpoint)
    first.put_bytes("k", b"v")
    again = S3Store(bucket, "", moto_endpoint)  # bucket exists now: no error
    assert again.get_bytes("k") == b"v"
    raw = boto3.client("s3", endpoint_url=moto_endpoint)
    assert bucket in [b["Name"] for b in raw.list_buckets()["Buckets"]]


def test_creates_bucket_outside_us_east_1(
    moto_endpoint: str, aws_env: None, bucket_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    store = S3Store(bucket_name, "p", moto_endpoint)
    store.put_bytes("k", b"v")
    assert store.list_keys() == ["k"]


def test_prefixes_isolate_stores(moto_endpoint: str, aws_env: None, bucket_name: str) -> None:
    bucket = bucket_name
    one = S3Store(bucket, "one", moto_endpoint)
    two = S3Store(bucket, "/two/", moto_endpoint)
    one.put_bytes("k", b"1")
    two.put_bytes("k", b"2")
    assert (one.get_bytes("k"), two.get_bytes("k")) == (b"1", b"2")
    assert one.list_keys() == ["k"]
    raw = boto3.client("s3", endpoint_url=moto_endpoint)
    listed = raw.list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(o["Key"] for o in listed) == ["one/k", "two/k"]


def test_endpoint_down_is_unavailable(closed_port: int, aws_env: None) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    client = make_s3_client(endpoint, connect_timeout=0.5, read_timeout=0.5, max_attempts=1)
    started = time.monotonic()
    with pytest.raises(StorageUnavailable):
        S3Store("any-bucket", "", endpoint, client=client)
    store = S3Store("any-bucket", "", endpoint, client=client, create_bucket=False)
    with pytest.raises(StorageUnavailable):
        store.get_bytes("k")
    with pytest.raises(StorageUnavailable):
        store.list_keys()
    assert time.monotonic() - started < 10


def test_keys_cannot_leave_the_stores_prefix(moto_endpoint: str, aws_env: None,
                                             bucket_name: str) -> None:
    raw = boto3.client("s3", endpoint_url=moto_endpoint)
    store = S3Store(bucket_name, "fleet/a", moto_endpoint)
    raw.put_object(Bucket=bucket_name, Key="fleet/b/secret", Body=b"secret")
    raw.put_object(Bucket=bucket_name, Key="fleet/a/slots/ok.bin", Body=b"ok")
    for key in ("../b/secret", "/fleet/b/secret", "slots/../../b/secret", "slots/../../../x"):
        with pytest.raises(InvalidKey):
            store.get_bytes(key)
        with pytest.raises(InvalidKey):
            store.put_bytes(key, b"overwrite")
    with pytest.raises(InvalidKey):
        store.list_keys("../")
    slots = SlotSnapshotStore(store)
    for name in ("../b/secret", "..", "ok.bin/../../b/secret"):
        with pytest.raises(InvalidKey):
            slots.load(name)
    assert raw.get_object(Bucket=bucket_name, Key="fleet/b/secret")["Body"].read() == b"secret"
