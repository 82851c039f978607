"""The compose nginx lets through what the api takes: a 200 MB batch input upload."""

from __future__ import annotations

import re

from api.endpoints.files.api_router import UPLOAD_LIMIT
from tests.paths import ROOT

NGINX = ROOT / "docker" / "nginx.conf"


def test_nginx_takes_the_largest_upload_the_api_takes() -> None:
    found = re.search(r"client_max_body_size (\d+)m;", NGINX.read_text())
    assert found, "no client_max_body_size in docker/nginx.conf"
    assert int(found.group(1)) << 20 >= UPLOAD_LIMIT
