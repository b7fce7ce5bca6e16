"""pytest plugin (`-p llama_server_swap`) for llama.cpp's server test suite: one local model.

llama.cpp's harness (tools/server/tests/utils.py) names its models as Hugging Face repos,
files and URLs, which cannot be fetched offline. This plugin rewrites them, and only them,
to the GGUF in $NGRAMSPEC_SWAP_MODEL; no test file is edited.

Invariants:
- Loaded before the harness's conftest, it patches the `utils` module in place, so every
  `from utils import *` in conftest and the test files sees the patched names.
- `ServerProcess.start` replaces the main model (hf repo/file, model URL or file) and the
  draft model with $NGRAMSPEC_SWAP_MODEL right before the command line is built; a server
  that names no model at all (the router preset) is left as it is.
- `download_file` returns $NGRAMSPEC_SWAP_MODEL for a `.gguf` URL (the speculative tests
  download their draft model that way); any other URL goes to the original, which fails
  offline, and the test falls as it would on any server.
- `ServerPreset.load_all` (a warm-up that downloads every preset's model) does nothing:
  the one model is already on disk.
"""
from __future__ import annotations

import os

import utils  # the harness module; its folder is on sys.path (see llama_server_tests.py)

MODEL = os.environ["NGRAMSPEC_SWAP_MODEL"]

_original_start = utils.ServerProcess.start
_original_download = utils.download_file


def _names_a_model(server: utils.ServerProcess) -> bool:
    return bool(server.model_hf_repo or server.model_hf_file or server.model_url
                or server.model_file)


def _start_with_local_model(self: utils.ServerProcess, *args, **kwargs):
    """ServerProcess.start with every model field pointing at MODEL."""
    if _names_a_model(self):
        self.model_file = MODEL
        self.model_hf_repo = None
        self.model_hf_file = None
        self.model_url = None
    if self.model_draft:
        self.model_draft = MODEL
    return _original_start(self, *args, **kwargs)


def _download_local_model(url: str, output_file_path: str | None = None) -> str:
    """download_file: a GGUF URL resolves to MODEL, anything else to the original."""
    if url.split("?")[0].endswith(".gguf"):
        return MODEL
    return _original_download(url, output_file_path)


def _load_nothing() -> None:
    """ServerPreset.load_all: nothing to download, the one model is local."""


utils.ServerProcess.start = _start_with_local_model
utils.download_file = _download_local_model
utils.ServerPreset.load_all = staticmethod(_load_nothing)
