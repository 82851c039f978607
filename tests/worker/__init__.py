"""The worker's rooms in-process, on real GGUF files (tests/lanes.py: not in --fast).

Where a test is not about threads, its engine computes with one thread (ContextPlan
n_threads=1; a llama-server it compares with, -t 1 too): ggml's OpenMP threads spin at every
barrier of a graph, and on the 2-core box, beside the suite's other workers, a second thread
spins through the time the first one needs (worker/runtime/compute_threads.py). Measured on
test_kv_checkpoints.py at load 8-12: 282 CPU seconds with two threads, 127 with one
(tests/cpu_report.py). A test whose figures were recorded with two threads (greedy near-ties:
ggml may split a reduction between threads) keeps two."""
