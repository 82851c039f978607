"""The worker role: llama.cpp behind a queue, in rooms that import downward only (bottom first;
tests/unit/project/test_import_layers.py holds the order):

- speculative/  the drafters (n-gram caches and maps, a draft model), nothing of the engine
- runtime/      llama.cpp: model, vocabulary, projector, LoRA loading, --fit, devices, flags
- kv/           slots' token lists, KV moves, checkpoints, prompt cache, KV tier, snapshots
- adapters/     aLoRA, per-request adapter sets, control vectors
- decisions/    decision plans and their run on the engine's thread
- engine/       the slot engine: loop, step plan, prefill, sampling, streaming, verification
- embed/        embedding and rerank inputs, queues, pooling, the embedder (on the engine's batch)
- wires/        Redis and the store: publisher, result offload, media fetch, model sources
- jobs/         one body per job kind
- process/      the worker process: serve, loops, arq wiring, sleep, router-mode host
"""
