"""The `ngramspec` command line: one module per command, registered by main.py.

Layers and their import rules: docs/architecture.md."""
