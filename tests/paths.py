"""Where the tests' files are, wherever a test module sits."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
"""The repository."""
DATA = TESTS / "data"
