"""Storage errors and URLs leave the process without buckets, endpoints, paths or passwords."""

from __future__ import annotations

from storage.redact import redact, redacted_url


def test_redact_removes_locations_and_credentials() -> None:
    text = ("write 'slots/a.bin' in s3://my-bucket/some/prefix at http://10.0.0.5:9000: Could "
            "not connect to the endpoint URL: \"http://10.0.0.5:9000/my-bucket/some/prefix/x\" "
            "[Errno 13] Permission denied: '/srv/llamaq/store/slots/a.bin' "
            "arn:aws:s3:::my-bucket/some AKIAABCDEFGHIJKLMNOP")
    out = redact(text)
    for secret in ("my-bucket", "10.0.0.5", "/srv/llamaq", "AKIAABCDEFGHIJKLMNOP", "prefix"):
        assert secret not in out, secret
    assert out.startswith("write 'slots/a.bin' in <url>")
    assert "Permission denied: '<path>'" in out


def test_redacted_url_hides_only_the_password() -> None:
    assert redacted_url("redis://:hunter2@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redacted_url("redis://u:hunter2@r/1") == "redis://u:***@r/1"
    assert redacted_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
