"""The router's model catalog (scheduler/catalog.py): the spec's sources and precedence, the
offline `architecture` from GGUF metadata, and preset options as worker flags."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from api.settings import ApiSettings
from scheduler.catalog import CatalogError, CatalogSources, load_catalog
from scheduler.gguf_meta import GgufError, read_metadata
from storage import LocalStore
from worker.process.host import PresetError, model_argv, preset_argv
from worker.runtime.settings import WorkerSettings


def write_gguf(path: Path, arch: str = "llama", **values: object) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in values.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        else:
            writer.add_string(key, str(value))
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_metadata_is_read_offline_and_junk_is_refused(tmp_path: Path) -> None:
    meta = read_metadata(write_gguf(tmp_path / "m.gguf", **{"general.name": "tiny"}))
    assert meta["general.architecture"] == "llama" and meta["general.name"] == "tiny"
    assert "tokenizer.ggml.tokens" not in meta  # arrays are skipped
    (tmp_path / "junk.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 7)
    for bad in (tmp_path / "junk.gguf", tmp_path / "missing.gguf"):
        with pytest.raises(GgufError):
            read_metadata(bad)


def test_keys_after_a_large_vocabulary_are_read(tmp_path: Path) -> None:
    """The vocabulary is skipped in chunks: strings across a chunk's end, one longer than a
    chunk, and the keys written after it all come out as gguf wrote them."""
    path = tmp_path / "vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    tokens = [f"token-{i}" * (i % 7) for i in range(300_000)]
    tokens[150_000] = "x" * (3 << 20)
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_string("general.name", "after the vocabulary")
    writer.add_uint32("llama.context_length", 4096)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    meta = read_metadata(path)
    assert meta["general.name"] == "after the vocabulary"
    assert meta["llama.context_length"] == 4096
    with path.open("r+b") as stream:  # cut inside the vocabulary
        stream.truncate(path.stat().st_size // 3)
    with pytest.raises(GgufError):
        read_metadata(path)


def test_models_dir_layout_names_files_folders_shards_and_sidecars(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    write_gguf(models / "llama-3.2-1b-Q4_K_M.gguf")
    (models / "mmproj-loose.gguf").write_bytes(b"x")  # a companion alone is no model
    vision = models / "gemma-3-4b-it-Q8_0"
    vision.mkdir()
    write_gguf(vision / "gemma-3-4b-it-Q8_0.gguf")
    write_gguf(vision / "mmproj-F16.gguf", "clip", **{"clip.has_vision_encoder": True})
    (vision / "mtp-head.gguf").write_bytes(b"x")
    shards = models / "Kimi"
    shards.mkdir()
    for part in (1, 2):
        (shards / f"Kimi-0000{part}-of-00002.gguf").write_bytes(b"x")
    (models / "empty").mkdir()
    catalog = load_catalog(CatalogSources(models_dir=models))
    assert sorted(catalog.entries) == ["Kimi", "gemma-3-4b-it-Q8_0", "llama-3.2-1b-Q4_K_M"]
    gemma = catalog.entries["gemma-3-4b-it-Q8_0"]
    assert gemma.source == "models_dir" and gemma.sidecars == ["mmproj", "mtp"]
    assert gemma.model == str(vision / "gemma-3-4b-it-Q8_0.gguf")
    assert gemma.architecture.input_modalities == ["text", "image"]
    assert gemma.architecture.output_modalities == ["text"]
    assert catalog.entries["Kimi"].model == str(shards / "Kimi-00001-of-00002.gguf")
    assert catalog.entries["Kimi"].architecture.input_modalities == ["text"]  # unreadable
    with pytest.raises(CatalogError):
        load_catalog(CatalogSources(models_dir=tmp_path / "nope"))


def test_preset_precedence_global_then_model_and_preset_only_keys(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    write_gguf(models / "tiny.gguf")
    preset = tmp_path / "p.ini"
    preset.write_text(
        "version = 1\n[*]\nc = 8192\nn-gpu-layers = 8\nport = 1234\n"
        "[tiny]\nc = 4096\nalias = small,mini\ntags = local\nload-on-startup = true\n"
        "stop-timeout = 3\nLLAMA_ARG_CACHE_RAM = 0\n"
        f"[custom]\nmodel = {models / 'tiny.gguf'}\n")
    catalog = load_catalog(CatalogSources(models_dir=models, models_preset=preset))
    tiny = catalog.entries["tiny"]
    assert tiny.source == "preset"
    assert tiny.options == {"c": "4096", "n-gpu-layers": "8", "LLAMA_ARG_CACHE_RAM": "0"}
    assert tiny.aliases == ["mini", "small"] and tiny.tags == ["local"]
    assert tiny.load_on_startup and tiny.stop_timeout_s == 3
    assert catalog.find("mini") is tiny
    custom = catalog.entries["custom"]
    assert custom.options == {"c": "8192", "n-gpu-layers": "8"}
    assert not custom.load_on_startup and custom.stop_timeout_s is None
    assert custom.args()[:4] == ["llamaq", "worker", "-m", str(models / "tiny.gguf")]
    preset.write_text("[orphan]\nc = 1\n")
    with pytest.raises(CatalogError, match="orphan"):
        load_catalog(CatalogSources(models_preset=preset))


def test_cache_and_store_sources_and_dedup(tmp_path: Path) -> None:
    cache = tmp_path / "hf"
    snapshot = cache / "models--ggml-org--tiny-GGUF" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    write_gguf(snapshot / "tiny-Q4_K_M.gguf")
    store = LocalStore(tmp_path / "store")
    store.put_bytes("models/stored.gguf", b"x")
    store.put_bytes("models/mmproj-stored.gguf", b"x")
    store.put_bytes("models/hf/ggml-org/other-GGUF/other-Q8_0.gguf", b"x")
    catalog = load_catalog(CatalogSources(cache_dir=cache, store=store))
    assert sorted(catalog.entries) == ["ggml-org/other-GGUF:Q8_0",
                                       "ggml-org/tiny-GGUF:Q4_K_M", "stored.gguf"]
    assert catalog.entries["stored.gguf"].model == "stored.gguf"  # -m NAME.gguf: the store's
    assert catalog.entries["ggml-org/other-GGUF:Q8_0"].hf_repo == "ggml-org/other-GGUF:Q8_0"
    cached = catalog.entries["ggml-org/tiny-GGUF:Q4_K_M"]
    assert cached.source == "cache" and cached.hf_repo == "ggml-org/tiny-GGUF:Q4_K_M"
    assert cached.hf_file == "tiny-Q4_K_M.gguf"  # loads from the cache without a listing
    preset = tmp_path / "p.ini"
    preset.write_text("[*]\ndedup-cache-models = true\n"
                      "[mine]\nhf-repo = ggml-org/tiny-GGUF:Q4_K_M\n")
    catalog = load_catalog(CatalogSources(cache_dir=cache, models_preset=preset))
    assert [e.name for e in catalog.visible()] == ["mine"]


def test_preset_options_become_worker_flags(tmp_path: Path) -> None:
    argv = preset_argv({"c": "4096", "n-gpu-layers": "8", "LLAMA_ARG_N_PARALLEL": "2",
                        "warmup": "false", "context-shift": "true"})
    assert argv == ["-c", "4096", "--n-gpu-layers", "8", "-np", "2", "--no-warmup",
                    "--context-shift"]
    with pytest.raises(PresetError, match="no-such-option"):
        preset_argv({"no-such-option": "1"})
    model = tmp_path / "m.gguf"
    write_gguf(model)
    entry = load_catalog(CatalogSources(models_dir=tmp_path)).entries["m"]
    entry.options = {"c": "4096", "t": "1"}
    settings = WorkerSettings.from_args(model_argv(entry, ["-c", "512"], "host-1"), environ={})
    assert settings.ctx_size == 512  # the worker's own flags win over the preset
    assert settings.drain_timeout == 30  # the worker's own, without a stop-timeout
    entry.stop_timeout_s = 3
    assert WorkerSettings.from_args(model_argv(entry, ["--drain-timeout", "9"], "h"),
                                    environ={}).drain_timeout == 3
    assert (settings.threads, settings.model, settings.alias) == (1, str(model), ["m"])
    assert settings.worker_id == "host-1" and not settings.router_mode()


def test_the_specs_example_preset_keys_go_to_the_role_that_takes_them() -> None:
    """The spec's example section: api keys (chat-template, jinja) are left to the api pods,
    which apply them; off values of unbuilt features (spec-type = none) are no-ops; the
    host prompt cache's size (LLAMA_ARG_CACHE_RAM) is a worker flag (issue 24)."""
    options = {"chat-template": "chatml", "n-gpu-layers": "123", "jinja": "true", "c": "4096",
               "LLAMA_ARG_CACHE_RAM": "0", "reasoning-format": "none", "no-mmproj": "true",
               "mmproj-auto": "false", "spec-type": "none"}
    assert preset_argv(options) == ["--n-gpu-layers", "123", "-c", "4096", "-cram", "0",
                                    "--no-mmproj", "--no-mmproj",  # a worker switch (issue 28)
                                    "--spec-type", "none"]  # a worker flag (issue 22)
    assert preset_argv({"LLAMA_ARG_MOE_CACHE_MIB": "512"}) == ["--moe-cache-mib"]  # refused
    assert preset_argv({"mmproj-auto": "true"}) == ["--mmproj-auto"]
    api = ApiSettings.from_args(["--no-jinja"], environ={}).with_preset(options)
    assert (api.chat_template, api.jinja, api.reasoning_format) == ("chatml", False, "none")
    assert ApiSettings.from_args([], environ={}).with_preset({"no-jinja": "true"}).jinja is False


def test_api_options_by_their_environment_names() -> None:
    """The spec: environment variable names are valid preset keys. The worker leaves an api
    option written so (it raised PresetError and the model never loaded); the api applies it."""
    options = {"LLAMA_ARG_CHAT_TEMPLATE": "chatml", "LLAMA_ARG_JINJA": "false",
               "LLAMA_ARG_CTX_SIZE": "1024"}
    assert preset_argv(options) == ["-c", "1024"]
    api = ApiSettings.from_args([], environ={}).with_preset(options)
    assert (api.chat_template, api.jinja) == ("chatml", False)
    with pytest.raises(PresetError, match="LLAMA_ARG_NO_SUCH"):
        preset_argv({"LLAMA_ARG_NO_SUCH": "1"})
    with pytest.raises(ValueError, match="reasoning-format"):
        ApiSettings.from_args([], environ={}).with_preset({"reasoning-format": "hiccup"})


def test_a_folders_mmproj_sidecar_is_loaded_with_the_model(tmp_path: Path) -> None:
    """Router mode loads what it advertises (issue 28): the folder's mmproj* file goes to
    the worker as -mm, and `status.args` says so."""
    from tests.tiny_mmproj import write_tiny_mmproj

    folder = tmp_path / "vision"
    folder.mkdir()
    write_gguf(folder / "vision-Q4_K_M.gguf")
    projector = write_tiny_mmproj(folder / "mmproj-vision-F16.gguf")
    entry = load_catalog(CatalogSources(models_dir=tmp_path)).entries["vision"]
    assert entry.mmproj == str(projector) and entry.sidecars == ["mmproj"]
    assert entry.architecture.input_modalities == ["text", "image"]
    settings = WorkerSettings.from_args(model_argv(entry, [], "h"), environ={})
    assert settings.mmproj == str(projector)
    assert entry.args()[-4:-2] == ["-mm", str(projector)]
