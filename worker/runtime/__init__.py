"""The llama.cpp runtime: the model and its vocabulary, the projector, LoRA loading, --fit and the
memory probe, devices, tensor overrides, compute threads, the worker's flags and settings."""
