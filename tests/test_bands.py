"""Error bands (autoparallel.bands) and the robust pick among near-ties (search.robust)."""

import math

import numpy as np
import pytest

from autoparallel import Layout, estimate, make_problem
from autoparallel.bands import (ANY, COMM_BOUND_SHARE, DEFAULT_STEP_LOG, UNCALIBRATED_WIDEN,
                                BandRow, bands_for, find_row, load_bands)
from autoparallel.search.plan import plan
from autoparallel.search.robust import robust_order, robustness, tied_group, tied_with_first
from autoparallel.search.space import SearchSpace


def _row(q, stack, gpu, regime, runs, p10, p90):
    return BandRow(q, stack, gpu, regime, runs, p10, 0.0, p90, ("s",))


def test_shipped_table_h100_compute_band_matches_its_quantiles():
    """An H100 compute-bound estimate of a stack without H100 runs (DeepSpeed) uses the shipped
    gpu-level compute row: low = step x exp(-p90), high = step x exp(-p10) (p10/p90 from
    autoparallel/data/error_bands.csv); the default stack has its own (stack+gpu) row."""
    row = load_bands()[("step", ANY, "h100", "compute")]
    assert row.runs >= 50 and row.p10 < 0 < row.p90
    mc = estimate(make_problem("llama3-8b", "h100", 8, 4096, 64), Layout(zero=1))
    assert mc["band"]["step_level"] == "stack+gpu"
    p = make_problem("llama3-8b", "h100", 8, 4096, 64, stack="deepspeed")
    r = estimate(p, Layout(zero=1))
    t = r["time_s"]
    assert r["band"]["regime"] == "compute" and r["band"]["step_level"] == "gpu"
    assert t["step_low"] == pytest.approx(t["step"] * math.exp(-row.p90), rel=1e-12)
    assert t["step_high"] == pytest.approx(t["step"] * math.exp(-row.p10), rel=1e-12)
    mem = load_bands()[("memory", ANY, "h100", ANY)]
    assert r["memory_gib"]["total_high"] == pytest.approx(
        r["memory_gib"]["total"] * math.exp(-mem.p10), rel=1e-12)


def test_lookup_falls_back_stack_gpu_then_gpu_then_stack_then_global():
    table = {("step", "megatron-core", "h100", ANY): _row("step", "megatron-core", "h100", ANY, 9, -0.1, 0.1),
             ("step", ANY, "h100", ANY): _row("step", ANY, "h100", ANY, 100, -0.3, 0.1),
             ("step", "megatron-core", ANY, ANY): _row("step", "megatron-core", ANY, ANY, 20, -0.2, 0.2),
             ("step", ANY, ANY, ANY): _row("step", ANY, ANY, ANY, 200, -0.4, 0.15)}
    assert find_row("step", "megatron-core", "h100", table=table)[0] == "stack+gpu"
    assert find_row("step", "fsdp", "h100", table=table)[0] == "gpu"
    assert find_row("step", "megatron-core", "mi300x", table=table)[0] == "stack"
    assert find_row("step", "fsdp", "mi300x", table=table)[0] == "global"
    assert find_row("step", None, "h100", table={}) == ("none", None)


def test_uncalibrated_gpu_gets_a_widened_band_and_an_empty_table_the_default():
    p = make_problem("llama3-8b", "mi300x", 8, 4096, 64)
    time = {k: np.array([0.0]) for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")}
    time["step"] = np.array([10.0])
    table = {("step", ANY, ANY, ANY): _row("step", ANY, ANY, ANY, 200, -0.4, 0.15)}
    b = bands_for(p, time, np.array([1.0]), table)
    assert b.step_basis["compute"]["level"] == "global"
    assert b.step_low[0] == pytest.approx(10 * math.exp(-UNCALIBRATED_WIDEN * 0.15))
    assert b.step_high[0] == pytest.approx(10 * math.exp(UNCALIBRATED_WIDEN * 0.4))
    b = bands_for(p, time, np.array([1.0]), {})
    assert b.step_basis["compute"]["level"] == "none"
    assert (b.step_low[0], b.step_high[0]) == pytest.approx(
        (10 * math.exp(-DEFAULT_STEP_LOG[1]), 10 * math.exp(-DEFAULT_STEP_LOG[0])))  # 5 s, 20 s
    assert "no validation residuals" in b.basis(0)["note"]


def test_comm_bound_rows_use_the_comm_quantiles_and_bands_always_contain_the_prediction():
    p = make_problem("llama3-8b", "h100", 8, 4096, 64)
    table = {("step", ANY, "h100", "compute"): _row("step", ANY, "h100", "compute", 50, -0.1, 0.05),
             ("step", ANY, "h100", "comm"): _row("step", ANY, "h100", "comm", 10, -0.5, 0.3),
             ("step", ANY, "h100", ANY): _row("step", ANY, "h100", ANY, 60, -0.2, -0.05)}
    share = np.array([0.0, COMM_BOUND_SHARE + 0.01])
    time = {k: np.zeros(2) for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm")}
    time["step"] = np.array([1.0, 1.0])
    time["dp_comm"] = share
    b = bands_for(p, time, np.ones(2), table)
    assert list(b.regime) == ["compute", "comm"]
    assert b.step_high == pytest.approx([math.exp(0.1), math.exp(0.5)])
    assert b.step_low == pytest.approx([math.exp(-0.05), math.exp(-0.3)])
    # a regime row with too few runs falls back to the pooled row, whose p90 < 0 is clamped
    table[("step", ANY, "h100", "comm")] = _row("step", ANY, "h100", "comm", 3, -0.5, 0.3)
    b = bands_for(p, time, np.ones(2), table)
    assert b.step_high[1] == pytest.approx(math.exp(0.2))
    assert b.step_low[1] == pytest.approx(math.exp(-0.01))


def test_tied_and_robust_order_on_a_constructed_near_tie():
    step = np.array([1.00, 1.02, 1.05, 2.0])
    low, high = step * 0.9, step * 1.1
    tied = tied_with_first(low, high)
    assert list(tied) == [True, True, True, False]  # 2.0 x 0.9 > 1.1
    score = np.array([1.30, 1.10, 1.20, 0.5])  # the untied row never jumps ahead
    assert list(robust_order(step, tied, score)) == [1, 2, 0, 3]


@pytest.mark.parametrize("args", [("llama3-8b", "h100", 16, 4096, 64),
                                  ("mixtral-8x7b", "h100", 32, 4096, 256)])
def test_tied_group_is_the_tie_over_every_rows_bands(args):
    """`plan` costs bands only for the rows that can overlap the fastest's (`tied_group`); the
    group must be what `tied_with_first` finds over every survivor's bands, in plan's order and
    in another order with the same first row. DeepSpeed on H100 takes the gpu-level rows, whose
    regimes differ (p90 of ln(pred / meas): compute 0.066, comm 0.187 in the shipped table), and
    some tied comm-bound rows are slower than row 0's `step_high` x exp(compute p90): a bound
    that assumes one regime's p90 for all rows drops them and fails here."""
    from autoparallel.bands import step_bases

    res = plan(make_problem(*args, stack="deepspeed"), top=5, keep=0)
    full = res.survivors.bands()
    want = tied_with_first(full.step_low, full.step_high)
    assert np.array_equal(res.tied, want)
    assert want.sum() > 1 and (~want).sum() > 0
    p90 = [b["p90"] for b in step_bases(res.problem).values()]
    beyond = res.survivors.time["step"] > full.step_high[0] * math.exp(min(p90))
    assert (want & beyond).any()  # the test has power: the regimes' difference matters
    rng = np.random.default_rng(0)
    order = np.concatenate([[0], 1 + rng.permutation(len(want) - 1)])
    assert np.array_equal(tied_group(res.survivors.take(order)), want[order])
    # the robustness of a subset of rows is those rows' robustness over the whole table
    rows = want | (np.arange(len(want)) < 5)
    some, every = robustness(res.survivors, rows), robustness(res.survivors)
    for k, v in every.items():
        assert np.allclose(some[k][rows], v[rows], rtol=1e-12, equal_nan=True), k
    assert np.isnan(some["score"][~rows]).all()


def test_plan_robust_pick_prefers_tp_inside_the_node_among_near_ties():
    """A known near-tie: llama3-8b on 16 H100 (two nodes) restricted to tp 8 or 16 (TP across
    nodes allowed). With pp 1, tp16 spans both nodes: with sequence parallelism its TP
    all-gathers and reduce-scatters run as rings over the network (NCCL has no tree for them),
    so its step is slower and far more sensitive to network bandwidth (without SP the
    all-reduces take NCCL's 2-node tree, which halves the bytes on the network: NVLink binds).
    Ranked by time, the fastest is first; ranked robust, every tied layout is ordered by
    step x (1 + penalty)."""
    from autoparallel.rules import active_rules

    p = make_problem("llama3-8b", "h100", 16, 4096, 64)
    space = SearchSpace().narrowed(tp=[8, 16], cp=[1], ep=[1], pp=[1, 2], vp=[1], zero=[1],
                                   recompute=["selective"], micro_batch=[1])
    rules = active_rules(disabled=["tp_in_node"])
    by_time = plan(p, space, top=20, rules=rules, keep=0)
    robust = plan(p, space, top=20, rules=rules, keep=0, rank_by="robust")
    recs_t, recs_r = by_time.records(), robust.records()
    steps = [r["time_s"]["step"] for r in recs_t]
    assert steps == sorted(steps)
    assert all(recs_t[0]["time_s"]["step_low"] < r["time_s"]["step"] for r in recs_t[:1])
    tied = [r for r in recs_r if r["tied"]]
    scores = [r["robustness"]["score_s"] for r in tied]
    assert len(tied) >= 2 and scores == sorted(scores)
    for r in recs_r:  # score = step x (1 + penalty)
        assert r["robustness"]["score_s"] == pytest.approx(
            r["time_s"]["step"] * (1 + r["robustness"]["penalty"]), rel=1e-12)
    cross = [r for r in recs_r if r["layout"]["tp"] == 16 and r["layout"]["pp"] == 1
             and r["layout"]["sp"]]
    inside = [r for r in recs_r if r["layout"]["tp"] == 8]
    assert cross and inside
    # TP across two nodes: its step rises with a 20 % slower network far more than tp8's
    assert cross[0]["robustness"]["net_sensitivity"] > 5 * max(
        r["robustness"]["net_sensitivity"] for r in inside)
    assert not cross[0]["robustness"]["tp_ep_in_node"]
    assert recs_r[0]["layout"]["tp"] == 8


def test_memory_quantiles_pool_the_memory_runs():
    """The dedicated memory runs (memory_runs.csv; the memory model has no fitted knob, so their
    residuals are out of sample) join the step-time runs that report memory in the memory
    quantiles: a stack with memory runs but no step-time memory gets its own row, and the
    quantiles are those of the pooled log residuals."""
    import pandas as pd

    from autoparallel.validation.error_bands import band_rows, memory_residual_frame, table_of

    records = pd.DataFrame({
        "row_id": ["a", "b", "c", "d", "e", "f"], "source": ["s1"] * 3 + ["s2"] * 3,
        "gpu": ["h100"] * 6, "stack": ["paddlenlp"] * 6, "moe": [False] * 5 + [True],
        "mem_err": [0.1, -0.1, 0.0, 0.2, -0.2, 5.0]})
    mem = memory_residual_frame(records)
    assert len(mem) == 5  # the MoE row is left out
    res = pd.DataFrame(columns=["row_id", "source", "gpu", "stack", "r_step", "r_memory",
                                "regime"])
    table = table_of(band_rows(res, mem))
    row = table[("memory", "paddlenlp", "h100", ANY)]
    r = np.log1p(np.array([0.1, -0.1, 0.0, 0.2, -0.2]))
    assert row.runs == 5 and row.p10 == pytest.approx(np.percentile(r, 10), abs=1e-4)
    assert ("step", ANY, ANY, ANY) not in table
