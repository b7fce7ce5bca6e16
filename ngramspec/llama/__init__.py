"""llama.cpp, typed: the library and backend, model, context, prefill twin, KV cells, and our kernels.

Layers and their import rules: docs/architecture.md."""
