"""Settings: typed config, the flag table, llama.cpp's value names, paths, strict JSON (no llama.cpp here).

Layers and their import rules: docs/architecture.md."""
