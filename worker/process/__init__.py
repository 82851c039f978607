"""A worker process: serve (build the worker whole, run, drain), its background loops, the arq
wiring (queues, functions, the lease around every job), idle sleep, and the host of router
mode. The top room of the worker: it imports the job bodies (worker/jobs/) and the engine."""
