"""The simulated engine (`llamaq worker --simulate`, ours): a real worker process whose engine
is a timing model (prefill speed, inter-token latency with jitter and batch slowdown, a KV
budget with prefix caching by block) writing deterministic text; no model is loaded. Fleet
tests and load measurements run it where the real engine cannot reach (docs/scale.md)."""
