"""Settings: the flag table, the typed settings a command's flag values become (`typed`),
llama.cpp's value names, paths, strict JSON (no llama.cpp call here).

Layers and their import rules: docs/architecture.md."""
