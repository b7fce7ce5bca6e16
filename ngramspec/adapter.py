"""Use ngramspec's drafters inside llama-cpp-python's own speculative path.

    from llama_cpp import Llama
    from ngramspec.adapter import NgramDraftModel

    llm = Llama(model_path=path, draft_model=NgramDraftModel("ngram-mod"))
    llm.create_completion(prompt, max_tokens=256, temperature=0)

`Llama.generate` calls the draft model with all token ids so far (prompt +
output, the last one just sampled) and verifies what it returns. The adapter
maps that onto the Drafter protocol: a call whose ids do not extend the
previous call's is a new request (`begin`); otherwise the tokens that arrived
since tell how much of the previous draft was accepted (`settle`). The calls go
through one `Speculation`, as in the engine.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .settings.config import SpecConfig, spec_config_from_options
from .speculative.drafters import DrafterChain, common_prefix
from .speculative.policy import FixedPolicy
from .speculative.speculation import Speculation

try:  # the base class, when llama-cpp-python is installed (it is a dependency)
    from llama_cpp.llama_speculative import LlamaDraftModel
except ImportError:  # pragma: no cover
    LlamaDraftModel = object  # type: ignore[misc,assignment]


class NgramDraftModel(LlamaDraftModel):
    """A `LlamaDraftModel` backed by an ngramspec drafter chain (one sequence)."""

    def __init__(self, spec_type: str = "ngram-mod", num_pred_tokens: int = 16,
                 config: SpecConfig | None = None, **options: Any):
        cfg = config if config is not None else spec_config_from_options(spec_type=spec_type,
                                                                         **options)
        if cfg.auto or not cfg.enabled:
            from .errors import ConfigError
            raise ConfigError("NgramDraftModel needs concrete spec types (e.g. 'ngram-mod'), "
                              "not 'auto' or 'none'")
        self.chain = DrafterChain(cfg)
        self.speculation = Speculation(0, self.chain, FixedPolicy())
        self.num_pred_tokens = num_pred_tokens
        self._prev: np.ndarray | None = None
        self._draft = np.zeros(0, dtype=np.int32)

    def __call__(self, input_ids, /, **kwargs: Any):
        ids = np.asarray(input_ids, dtype=np.int32)
        if len(ids) == 0:
            return np.zeros(0, dtype=np.intc)
        prev = self._prev
        if prev is None or len(ids) <= len(prev) or not np.array_equal(ids[:len(prev)], prev):
            if prev is not None:
                self.speculation.end()
            self.speculation.begin(ids[:-1])
        else:
            new = ids[len(prev):]
            n_acc = common_prefix(self._draft, new)
            self.speculation.settle(new[:n_acc + 1].tolist(), n_acc)
        opts = self.speculation.plan(ids[:-1], int(ids[-1]), self.num_pred_tokens)
        self._draft = self.speculation.commit(opts.k_max)
        self._prev = ids.copy()
        return self._draft.astype(np.intc)

    @property
    def stats(self):
        return self.chain.stats
