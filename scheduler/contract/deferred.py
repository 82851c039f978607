"""The base of llamaq's pydantic models: each builds its validator and serializer when first
used, not when its module is imported.

Building them at import cost every process ~0.1 CPU-s at start (the api pod imports ~140
models, most of which a pod never validates: the bodies of endpoints it is not asked, the jobs
and results of other kinds). The first request that uses a model pays for its build (well
under a millisecond for most) instead. Nothing else changes: fields, defaults, validation and
the JSON schema are the same (`defer_build`, pydantic's own setting)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class DeferredModel(BaseModel):
    """A pydantic model built on first use (its subclasses' own `model_config` adds to this)."""

    model_config = ConfigDict(defer_build=True)
