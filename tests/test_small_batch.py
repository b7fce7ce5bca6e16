"""A small -b/--batch-size never crashes loading (regression: llama.cpp's router preset
passes `--batch-size 16 --ctx-size 1024`; calibrating the cost model then wrote 512
scratch tokens into a 64-row llama_batch: "ValueError: NULL pointer access")."""
import pytest

from ngramspec.speculative.cost import calibrate_context, calibration_shapes, fits_batch


@pytest.mark.parametrize("n_batch", [2, 16, 64, 512])
@pytest.mark.parametrize("per_seq_streams,n_seq", [(False, 1), (True, 4)])
def test_calibration_shapes_fit_the_batch(n_batch, per_seq_streams, n_seq):
    shapes = calibration_shapes(per_seq_streams, n_seq, 1024, n_batch)
    assert all(fits_batch(sh, n_batch) for sh in shapes)
    assert all(sum(s.n_tokens + 1 for s in sh) <= n_batch for sh in shapes)
    unpadded = calibration_shapes(per_seq_streams, n_seq, 1024, n_batch, pad=False)
    assert unpadded and all(sum(s.n_tokens for s in sh) <= n_batch for sh in unpadded)
    if n_batch >= 64:  # nothing dropped when every shape fits
        assert shapes == calibration_shapes(per_seq_streams, n_seq, 1024)


def test_oversized_decode_raises_before_touching_the_batch(model, threads):
    from ngramspec.llama.context import Context, ContextParams

    ctx = Context(model, ContextParams(n_ctx=256, n_batch=64, n_threads=threads,
                                       batch_invariant=False))
    try:
        with pytest.raises(ValueError, match="exceeds n_batch=64"):
            ctx.run_rows([(0, list(range(1000, 1100)), 0, False)], {})
        ctx.run_rows([(0, list(range(1000, 1064)), 0, False)], {})  # exactly n_batch: fine
    finally:
        ctx.close()


@pytest.mark.parametrize("invariant,n_batch", [(True, 16), (False, 16), (False, 1)])
def test_engine_loads_and_calibrates_with_a_small_batch(invariant, n_batch, threads, tmp_path,
                                                        monkeypatch):
    """The router preset's flags (-c 1024 -b 16 -np 1): start-up probes, then a full
    calibration that runs every measurement (it used to crash only then); -b 1 too."""
    from ngramspec.settings.config import SpecConfig
    from ngramspec.engine.runtime import load_engine
    from ngramspec.settings.engine import EngineSettings, LoadOptions

    monkeypatch.setenv("NGRAMSPEC_CACHE_DIR", str(tmp_path))
    from ngramspec.speculative.policy import CostPolicy

    engine = load_engine(EngineSettings(n_ctx=1024, threads=threads, spec=SpecConfig(policy="cost"),
                                        batch_invariant=invariant,
                                        options=LoadOptions(n_batch=n_batch)))
    try:
        assert isinstance(engine.policy, CostPolicy)
        assert engine.calibration.source == "default"  # start-up: nothing measured
        full = calibrate_context(engine.model.path, engine.ctx, refresh=True)
        assert full.source == "measured"  # every measurement
        assert (tmp_path / "decode_cost.json").is_file()
        assert engine.ctx.n_batch == (64 if invariant else n_batch)
    finally:
        engine.ctx.close()
