"""The job bodies of a worker, one module per kind (completion, decision, slot_action,
tokenize, embed): each an `async def run(parts, job)` on the WorkerParts (worker/jobs/parts.py)
the process hands in, as arq hands its functions `ctx`. Above the engine; below the process
(worker/process/), which they never import."""
