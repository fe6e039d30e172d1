"""benchmarks/regret.py on one published tuned recipe, against figures derived from the runs
file and the error-band table, not from the benchmark's own arithmetic."""

import importlib.util
import math
from pathlib import Path

import pandas as pd
import pytest

from autoparallel.bands import BAND_FILE
from autoparallel.data import PUBLISHED_RUNS
from autoparallel.validation.runs import load_cases, read_runs

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("regret", ROOT / "benchmarks" / "regret.py")
regret = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regret)


def _case(row_id):
    runs = read_runs(PUBLISHED_RUNS)
    cases, skipped = load_cases(runs[runs["row_id"] == row_id])
    assert len(cases) == 1, skipped
    return cases[0]


def test_regret_of_the_nemo_llama2_7b_recipe():
    """NeMo 24.07 performance summary, Llama-2-7B on 8 H100 in FP8 (published_runs GT0542): TP1
    PP1, micro-batch 1, 128 sequences of 4096 tokens, 16,934 tokens/s/GPU, so the measured step is
    128 x 4096 / (16,934 x 8) = 3.870 s. Optimism compares plan's #1 with that; the shrunk figure
    divides #1 by exp(p50) of the H100 residuals of the row's stack in error_bands.csv
    (megatron-bridge: NeMo 24.07 runs NVIDIA's recipes; the row of #1's regime, compute- or
    communication-bound)."""
    case = _case("GT0542")
    row = regret.regret_row(case, None, {}, 0.01)
    measured = 128 * 4096 / (16934 * 8)
    assert row["measured_s"] == pytest.approx(measured, rel=1e-9)
    assert row["optimism"] == pytest.approx(row["best_s"] / measured - 1, rel=1e-12)
    bands = pd.read_csv(BAND_FILE, comment="#")
    assert case.stack == row["stack"] == "megatron-bridge"
    mine = bands[(bands["quantity"] == "step") & (bands["stack"] == case.stack)
                 & (bands["gpu"] == "h100")]
    shrunk = {round(row["best_s"] / math.exp(p) / measured - 1, 12) for p in mine["p50"]}
    assert round(row["optimism_shrunk"], 12) in shrunk
    # the recipe's rank counts the fitting layouts strictly faster than its own prediction
    assert row["recipe_fits"] and 1 <= row["rank"] <= row["n_fit"]
    assert row["top"] == (row["rank"] <= 10 or row["rank"] <= math.ceil(0.01 * row["n_fit"]))
    assert row["recipe_pred_s"] >= row["best_s"]


def test_overrides_reach_the_problem_and_the_recipe_recompute_follows():
    """`--grad-dtype bf16` (Megatron `--grad-reduce-in-bf16`, NeMo's performance recipes) makes
    the gradient buffer 2 bytes per parameter; a recipe whose row leaves recompute open gets the
    least recompute plan's own fit rule accepts."""
    case = _case("GT0547")  # Nemotron-4 340B on 128 H100, recompute not stated
    core = regret.recipe_problem(case, "megatron-core", {})
    bf16 = regret.recipe_problem(case, "megatron-core", {"grad_dtype": "bf16"})
    # the row's own stack is Megatron-Bridge, whose recipes reduce gradients in bf16
    assert regret.recipe_problem(case, None, {}).training.grad_dtype == "bf16"
    assert (core.training.grad_dtype, bf16.training.grad_dtype) == ("fp32", "bf16")
    assert regret.recipe_problem(case, "torchtitan", {}).training.stack == "torchtitan"
    lay = regret.recipe_layout(case, bf16)
    from autoparallel.evaluate import estimate

    def fits(problem, r):
        return estimate(problem, lay.model_copy(update={"recompute": lay.recompute.__class__(r)}),
                        rules=regret.RULES)["fits"]

    # 340 B parameters on TP8 x PP8: with bf16 gradients only full recompute fits the planner's
    # rule, and that is what the recipe is ranked with; with fp32 gradients nothing does (the
    # recipe then keeps the least recompute that fits the GPU, as validation infers it)
    assert [fits(bf16, r) for r in ("none", "selective", "full")] == [False, False, True]
    assert lay.recompute.value == "full"
    assert not any(fits(core, r) for r in ("none", "selective", "full"))
