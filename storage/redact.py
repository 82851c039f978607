"""What of a storage error may leave the process: no URL, bucket, endpoint, absolute path or
credential. Full details stay in DEBUG logs."""

import re
from urllib.parse import urlsplit, urlunsplit

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
_ARN = re.compile(r"arn:aws[\w-]*:[^\s'\"]*")
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/[^\s'\"]+")
_ACCESS_KEY = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{12,}\b")


def redact(text: str) -> str:
    """`text` with URLs, ARNs, absolute paths and AWS access key ids replaced by placeholders."""
    text = _URL.sub("<url>", text)
    text = _ARN.sub("<arn>", text)
    text = _ABSOLUTE_PATH.sub("<path>", text)
    return _ACCESS_KEY.sub("<key>", text)


def redacted_url(url: str) -> str:
    """`url` without its password (`redis://user:***@host:6379/0`)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
