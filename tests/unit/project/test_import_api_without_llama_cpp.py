"""API pods have no llama.cpp: importing the api must not need llama_cpp."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process  # runs python itself (tests/lanes.py)

CODE = """
import sys
sys.modules["llama_cpp"] = None  # any import of llama_cpp now raises ImportError
import api.app, api.endpoints.native.api_router, api.endpoints.native.render, scheduler.client
from api.settings import ApiSettings
app = api.app.create_app(ApiSettings.from_args([], environ={}), "redis://127.0.0.1:1/0")
assert "llama_cpp" not in [m for m in sys.modules if sys.modules[m] is not None]
print("ok")
"""


def test_api_imports_without_llama_cpp() -> None:
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
