"""The worker's wires to Redis and the store: the event publisher, result offload, media fetch and
model sources."""
