"""Speculative decoding's drafters (llama.cpp's common/speculative.* and common/ngram-*.*,
ported): the configuration (`config.py`), the n-gram drafters (`ngram_simple.py`,
`ngram_map.py`, `ngram_mod.py`), the lookup cache and its sharing (`ngram_cache.py`,
`lookup_share.py`), a draft model (`draft_model.py`), the chain of drafters (`drafter.py`) and
synthetic acceptance (`synthetic.py`). Nothing of the engine: a step's drafts are verified by
worker/engine/verify.py."""
