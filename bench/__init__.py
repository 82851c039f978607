"""Benchmarks (run as scripts: .venv/bin/python bench/NAME.py; see bench/README.md)."""
