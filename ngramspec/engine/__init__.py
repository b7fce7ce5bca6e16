"""The engine: draft, verify in one batched decode, accept; sampling, output, loading.

Layers and their import rules: docs/architecture.md."""
