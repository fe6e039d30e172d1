"""The attention prior: what training keeps of the kernels' forward benchmarks, fitted across
the sources whose long-sequence runs pin it (autoparallel/attention_prior.py)."""

import math

import pytest

from autoparallel.presets import load_gpu, load_stack
from autoparallel.attention_prior import CELLS, KEPT, derated, kept


def test_kept_is_the_geometric_mean_of_the_cells_without_the_held_out_source():
    # by hand from the module's table: H100 FA2 0.1791 / 0.33, A100 FA2 0.3146 / 0.50,
    # H100 cuDNN 0.3360 / 0.60
    h100_fa2, a100_fa2, h100_cudnn = 0.1791 / 0.33, 0.3146 / 0.50, 0.3360 / 0.60
    assert KEPT == pytest.approx((h100_fa2 * a100_fa2 * h100_cudnn) ** (1 / 3), rel=1e-12)
    assert KEPT == pytest.approx(0.576, abs=5e-4)
    # a held-out source's own cells never set its fold's prior
    assert kept("llmfoundry_mpt") == pytest.approx(h100_cudnn, rel=1e-12)
    assert kept("nemo_longseq_h100") == pytest.approx(math.sqrt(h100_fa2 * a100_fa2), rel=1e-12)
    assert kept("megatron_bridge_perf") == KEPT


def test_derated_scales_both_attention_knobs_and_nothing_else():
    ref = load_gpu("b200").reference()
    d = derated(ref, exclude="llmfoundry_mpt")
    k = kept("llmfoundry_mpt")
    assert d.attention_efficiency == pytest.approx(ref.attention_efficiency * k, rel=1e-12)
    assert d.cudnn_attention_efficiency == pytest.approx(ref.cudnn_attention_efficiency * k,
                                                         rel=1e-12)
    same = {n for n in ref.model_dump() if n not in ("attention_efficiency",
                                                      "cudnn_attention_efficiency")}
    assert {n: getattr(d, n) for n in same} == {n: getattr(ref, n) for n in same}


def test_the_cells_are_the_shipped_fits_they_name():
    """Each cell is the value `benchmarks/calibrate_stacks.py --write` fitted into the stack
    profile its source pins (within 2 %: refitting from these priors moves it less), over the
    GPU's reference (literature) value; a refit that moves them past that must update CELLS."""
    shipped = {("llmfoundry_mpt", "h100"): load_stack("fsdp").profile["h100"]["attention_efficiency"],
               ("llmfoundry_mpt", "a100"): load_stack("fsdp").profile["a100-80gb"]["attention_efficiency"],
               ("nemo_longseq_h100", "h100"):
                   load_stack("megatron-bridge").profile["h100"]["cudnn_attention_efficiency"]}
    refs = {("llmfoundry_mpt", "h100"): load_gpu("h100").reference().attention_efficiency,
            ("llmfoundry_mpt", "a100"): load_gpu("a100-80gb").reference().attention_efficiency,
            ("nemo_longseq_h100", "h100"): load_gpu("h100").reference().cudnn_attention_efficiency}
    assert len(CELLS) == 3
    for source, gpu, fitted, bench in CELLS:
        assert fitted == pytest.approx(shipped[(source, gpu)], rel=0.02), (source, gpu)
        assert bench == refs[(source, gpu)]


def test_a_stack_without_long_sequence_runs_prices_attention_at_what_training_keeps():
    # Megatron-Bridge on GB200 has only 4K-8K-token runs, which do not pin attention: its fit
    # stays at the derated prior, not at the cuDNN forward benchmark
    fitted = load_stack("megatron-bridge").profile["gb200"]["cudnn_attention_efficiency"]
    bench = load_gpu("gb200").reference().cudnn_attention_efficiency
    assert fitted < 0.7 * bench
    assert fitted == pytest.approx(KEPT * bench, rel=0.1)


def test_a_stack_with_no_fit_anywhere_keeps_only_the_preset_s_calibrated_attention():
    """DeepSpeed has no runs: its profile is the GPU preset's, whose literature attention knobs
    (B200's 0.45 FA2, H100's 0.6 cuDNN) take KEPT and whose fitted one (H100's FA2 0.184, fitted
    on the H100 runs) stays as fitted."""
    from autoparallel import make_problem

    b200 = make_problem("llama3-8b", "b200", 8, 4096, 64, stack="deepspeed")
    assert "no deepspeed fit" in b200.profile_basis
    assert b200.profile.attention_efficiency == pytest.approx(0.45 * KEPT, rel=1e-12)
    assert b200.profile.cudnn_attention_efficiency == pytest.approx(
        load_gpu("b200").default_profile().cudnn_attention_efficiency * KEPT, rel=1e-12)
    h100 = make_problem("llama3-8b", "h100", 8, 4096, 64, stack="deepspeed")
    assert h100.profile.attention_efficiency == load_gpu("h100").default_profile().attention_efficiency
    assert h100.profile.attention_efficiency != load_gpu("h100").reference().attention_efficiency
    assert h100.profile.cudnn_attention_efficiency == pytest.approx(0.6 * KEPT, rel=1e-12)
