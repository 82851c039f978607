"""Where the api pod finds llama.cpp's web UI: api/ui_dist (the package, or scripts/install's
link), else the build scripts/build-ui leaves in the cache for the pinned llama-cpp-python (a
checkout that has not run scripts/install since the UI stopped being committed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.endpoints.ui import bundle


def test_the_package_folder_first_then_the_cache_of_the_pin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "repo" / "api" / "ui_dist"
    monkeypatch.setattr(bundle, "BUNDLE_DIR", package)
    monkeypatch.setenv("LLAMAQ_UI_CACHE", str(tmp_path / "cache"))
    (tmp_path / "repo").mkdir()
    assert bundle.bundle_dir() == package  # no pyproject.toml: nothing else to look at
    (tmp_path / "repo" / "pyproject.toml").write_text(
        'worker = ["llama-cpp-python==9.8.7", "numpy"]\n')
    assert bundle.bundle_dir() == tmp_path / "cache" / "9.8.7" / "dist"
    package.mkdir(parents=True)
    (package / "index.html").write_text("<html></html>")
    assert bundle.bundle_dir() == package
    assert list(bundle.load_bundle()) == ["index.html", ""]


def test_a_missing_bundle_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="scripts/install"):
        bundle.load_bundle(tmp_path)
