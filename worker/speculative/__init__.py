"""Speculative decoding in the slot engine (llama.cpp's common/speculative.* and
common/ngram-*.*, ported): the configuration (`config.py`), the n-gram drafters
(`ngram_simple.py`, `ngram_map.py`, `ngram_mod.py`), the chain of drafters (`drafter.py`),
synthetic acceptance (`synthetic.py`) and a step's drafts and their verification
(`verify.py`)."""
