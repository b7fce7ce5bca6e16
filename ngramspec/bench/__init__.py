"""Benchmarks: workloads, the pipeline bench beside llama-server, replay, and their tables.

Layers and their import rules: docs/architecture.md."""
