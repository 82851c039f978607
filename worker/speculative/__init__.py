"""Speculative decoding in the slot engine (llama.cpp's common/speculative.* and
common/ngram-*.*, ported): the configuration (`config.py`), the n-gram drafters
(`ngram_mod.py`, `ngram_simple.py`), the chain of drafters with their statistics
(`drafter.py`) and a step's drafts and their verification (`verify.py`)."""
