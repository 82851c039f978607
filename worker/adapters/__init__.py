"""Adapters on a loaded model: aLoRA invocation, the per-request adapter sets and control
vectors."""
