"""Which measured step times `tune` accepts (autoparallel/validation/plausible.py), old studies
holding absurd results, and calibration refusing degenerate fits."""

import math

import optuna
import pytest

from autoparallel import make_problem
from autoparallel.errors import SpecError
from autoparallel.specs.layout import Layout
from autoparallel.tune.calibrate import fit_profile
from autoparallel.validation.plausible import MAX_OVER_PREDICTION, fastest_step_s, implausible
from autoparallel.tune.results import collect


def test_the_fastest_possible_step_of_llama3_8b_on_8_h100():
    """Derived by hand from Llama 3 8B's shapes (Meta's config: 32 layers, hidden 4096, FFN
    14336, 32 query / 8 KV heads of 128, vocabulary 128256) and the H100 SXM BF16 dense peak
    (989 TFLOP/s, NVIDIA datasheet), Megatron's causal FLOP convention:
    GEMM weights per layer: attention 4096 x (4096 + 2 x 1024 + 4096) = 41.94 M, SwiGLU MLP
    3 x 4096 x 14336 = 176.16 M, so 32 layers = 6.979 G; logits 4096 x 128256 = 525.3 M;
    per sequence of 4096 tokens: 6 x 4096 x (6.979 G + 0.525 G) = 1.8444e14 GEMM FLOPs, plus
    causal attention 6 x 4096^2 x 32 x 4096 = 1.3194e13; a step of 64 sequences on 8 GPUs at
    100 % of 989e12 FLOP/s: 64 x 1.9763e14 / 7.912e15 = 1.5986 s."""
    gemm = 32 * (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336) + 4096 * 128256
    per_seq = 6 * 4096 * gemm + 6 * 4096**2 * 32 * 4096
    want = 64 * per_seq / (8 * 989e12)
    assert want == pytest.approx(1.5986, abs=1e-4)
    got = fastest_step_s(make_problem("llama3-8b", "h100", 8, 4096, 64))
    assert got == pytest.approx(want, rel=1e-9)


def test_fp8_jobs_are_bounded_by_the_fp8_peak():
    bf16 = fastest_step_s(make_problem("llama3-8b", "h100", 8, 4096, 64))
    fp8 = fastest_step_s(make_problem("llama3-8b", "h100", 8, 4096, 64, precision="fp8"))
    assert fp8 == pytest.approx(bf16 * 989 / 1979, rel=1e-3)  # H100 SXM FP8 dense: 1979 TFLOP/s


@pytest.mark.parametrize("value, words", [
    (0.0, "a step takes time"), (-1.0, "a step takes time"), (math.nan, "not a number"),
    (math.inf, "infinite"), (-math.inf, "infinite"), (1.0, "faster than the GPUs' peak"),
    (3.0 * MAX_OVER_PREDICTION * 1.01, "x the prediction")])
def test_implausible_step_times_say_why(value, words):
    why = implausible(value, fastest_s=1.6, predicted_s=3.0)
    assert why is not None and words in why


@pytest.mark.parametrize("value", [1.6, 2.0, 3.0, 299.0])
def test_plausible_step_times_pass(value):
    assert implausible(value, fastest_s=1.6, predicted_s=3.0) is None


def test_an_absurd_result_stored_by_an_earlier_version_is_reported_as_a_failure():
    study = optuna.create_study()
    for value in (0.0, 2.5):
        study.add_trial(optuna.trial.create_trial(
            params={}, distributions={}, value=value,
            user_attrs={"layout": "dp8-tp1-pp1-vp1-cp1-ep1-z1-rnone-mb1", "predicted_s": 3.0}))
    rows = collect(study, fastest_s=1.6)
    assert [(r.state, r.failure, r.measured_s) for r in rows] == [
        ("FAIL", "implausible", None), ("COMPLETE", None, 2.5)]
    assert "earlier version" in rows[0].detail


def test_calibration_refuses_degenerate_fits():
    problem = make_problem("llama3-8b", "h100", 8, 4096, 64)
    a = Layout.from_slug("dp8-tp1-pp1-vp1-cp1-ep1-z1-rnone-mb1")
    b = Layout.from_slug("dp4-tp2-pp1-vp1-cp1-ep1-z1-rnone-sp-mb1")
    with pytest.raises(SpecError, match="2 distinct measured layouts"):
        fit_profile(problem, [(a, 3.0), (a, 3.1)])
    with pytest.raises(SpecError, match="not positive finite"):
        fit_profile(problem, [(a, 3.0), (b, math.inf)])
    with pytest.raises(SpecError, match="not positive finite"):
        fit_profile(problem, [(a, 0.0), (b, 3.0)])
