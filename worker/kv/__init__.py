"""KV and caches: the slots' token lists, moves between slots and cache, checkpoints, the prompt
cache, the fleet's KV tier and slot snapshots."""
