"""Twin runs and the error floor they force (`autoparallel.validation.replicates`).

Hand figures: the weighted-L1 minimum of sum_i |p / m_i - 1| is worked by hand for small sets;
the shipped twin pair is Llama-3 8B FP8 on 8 H100 (TP 1, PP 1, MBS 1, GBS 128, sequence 8,192):
12,273 tokens/s/GPU in NeMo 24.07's performance summary (docs/source/performance/
performance_summary.md @9c5c5e9709) and 13,812 in Megatron-LM's Llama example (examples/llama/
README.md @d98e8a64). Megatron-Bridge's Qwen3_30B_a3B on 16 DGX-H100 (PP 2, VP 12, EP 8; 9,058
tokens/s/GPU in container 26.02.01, 5,113 in 26.02) was a twin until the 26.02 row took the
alltoall dispatcher (that container has no DeepEP, Megatron-Bridge docs/releases/known-issues.md).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from autoparallel.data import PUBLISHED_RUNS
from autoparallel.validation.replicates import (best_constant, floor_errors, floor_summary,
                                                twin_key, twin_table)
from autoparallel.validation.runs import load_cases, read_runs


def test_best_constant_by_hand():
    # f(p) = |p - 1| / 1 + |p - 2| / 2: slope 1 - 1/2 > 0 on [1, 2], so p* = 1
    assert best_constant([2.0, 1.0]) == 1.0
    # weights 1, 1, 1/4: half the total (1.125) is reached at the second 1
    assert best_constant([1.0, 4.0, 1.0]) == 1.0
    # weights 1/2, 1/3, 1/6 (m = 2, 3, 6): half (0.5) is reached at m = 2
    assert best_constant([6.0, 3.0, 2.0]) == 2.0
    # weights 1/3, 1/3, 1/3 (three equal m): any of them
    assert best_constant([3.0, 3.0, 3.0]) == 3.0
    # a lone run is its own best constant
    assert best_constant([7.5]) == 7.5


def test_best_constant_minimises_the_sum():
    m = [0.8, 1.3, 2.9, 3.1, 5.0]
    best = best_constant(m)
    cost = lambda p: sum(abs(p / x - 1.0) for x in m)  # noqa: E731
    grid = [0.5 + 0.001 * i for i in range(5000)]
    assert cost(best) <= min(cost(p) for p in grid) + 1e-12


@pytest.mark.parametrize("bad", [[], [0.0], [-1.0, 2.0], [float("nan")]])
def test_best_constant_rejects_non_positive(bad):
    with pytest.raises(ValueError, match="positive, finite"):
        best_constant(bad)


def test_floor_errors_by_hand():
    errs = floor_errors(["a", "a", "b"], [1.0, 2.0, 5.0])
    # group a predicted at 1: 0 and 1/2 - 1; the lone b at itself
    assert errs.tolist() == pytest.approx([0.0, -0.5, 0.0])


@pytest.fixture(scope="module")
def shipped():
    cases, _ = load_cases(read_runs(PUBLISHED_RUNS))
    return {c.row_id: c for c in cases}


def test_shipped_twins_and_their_floor(shipped):
    a, b = shipped["GT0548"], shipped["GT0559"]  # NeMo 24.07, the Megatron-LM example
    assert twin_key(a) == twin_key(b)
    table = twin_table([a, b])
    assert table["twins"].tolist() == [2, 2]
    # the faster run is the best constant: the slower one is 12,273 / 13,812 - 1 off
    assert table["floor_err"].tolist() == pytest.approx([12273 / 13812 - 1.0, 0.0], abs=2e-3)


def test_a_release_without_deepep_is_not_a_twin(shipped):
    a, b = shipped["GT0929"], shipped["GT0966"]  # 26.02.01, 26.02 (no DeepEP in that container)
    assert twin_key(a) != twin_key(b)
    # the dispatcher is the only input that differs
    same = b.__class__(**{**b.__dict__, "job": b.job | {"moe_dispatcher": "deepep"}})
    assert twin_key(same) == twin_key(a)


def test_twin_key_sees_every_input(shipped):
    a = shipped["GT0929"]
    # another global batch, or another stated job setting, is another problem
    other_batch = a.__class__(**{**a.__dict__, "global_batch": 512})
    other_job = a.__class__(**{**a.__dict__, "job": a.job | {"cuda_graphs": "full"}})
    renamed = a.__class__(**{**a.__dict__, "model": a.model.model_copy(update={"name": "x"})})
    assert twin_key(other_batch) != twin_key(a)
    assert twin_key(other_job) != twin_key(a)
    assert twin_key(renamed) == twin_key(a)


def test_floor_summary_counts():
    table = pd.DataFrame({
        "arch": ["moe", "moe", "moe", "dense"], "key": ["k", "k", "j", "d"],
        "measured_step_s": [1.0, 2.0, 3.0, 4.0], "twins": [2, 2, 1, 1],
        "floor_err": [0.0, -0.5, 0.0, 0.0], "step_err": [0.1, -0.2, 0.3, -0.4]})
    s = floor_summary(table).set_index("arch")
    assert s.loc["moe", "rows_with_twin"] == 2 and s.loc["moe", "twin_groups"] == 1
    assert s.loc["moe", "largest_spread"] == 2.0
    assert math.isnan(s.loc["dense", "largest_spread"])
    assert s.loc["all", "rows"] == 4
    assert s.loc["moe", "model_median_abs_err"] == pytest.approx(0.2)
