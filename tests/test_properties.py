"""Property tests (hypothesis) of the ledger: monotonicity, non-negativity, one code path."""

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoparallel import Layout, LayoutTable, estimate, evaluate, make_problem
from autoparallel.batch import score_frame

MODELS = ["llama3-8b", "llama3-70b", "mixtral-8x7b", "gpt3-175b"]
PROBLEMS = {m: make_problem(m, "h100", 256, 4096, 1024) for m in MODELS}
settings.register_profile("ap", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ap")

tp_s = st.sampled_from([1, 2, 4, 8])
pp_s = st.sampled_from([1, 2, 4, 8])
zero_s = st.sampled_from([0, 1, 2, 3])
rc_s = st.sampled_from(["none", "selective", "full"])
mb_s = st.sampled_from([1, 2, 4])
model_s = st.sampled_from(MODELS)


def total(problem, layout):
    if problem.model.moe is not None and layout.tp > 1:
        # an MoE model with TP trains with sequence parallelism (rule moe_sp: Megatron-Core's
        # MoE layer refuses TP without SP), so the property is over the layouts that run
        layout = layout.model_copy(update={"sp": True})
    r = estimate(problem, layout)
    return r["memory_gib"]["total"]


@given(model_s, tp_s, pp_s, rc_s, mb_s, st.booleans())
def test_memory_never_rises_with_zero_stage(model, tp, pp, rc, mb, sp):
    p = PROBLEMS[model]
    totals = [total(p, Layout(tp=tp, pp=pp, zero=z, recompute=rc, micro_batch=mb, sp=sp))
              for z in (0, 1, 2, 3)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(totals, totals[1:])), totals


@given(model_s, pp_s, zero_s, rc_s, mb_s, st.booleans())
def test_memory_never_rises_with_tp(model, pp, zero, rc, mb, sp):
    # same dp: more GPUs per replica
    totals = []
    for tp in (1, 2, 4, 8):
        p = make_problem(model, "h100", 8 * tp * pp, 4096, 1024)
        totals.append(total(p, Layout(dp=8, tp=tp, pp=pp, zero=zero, recompute=rc,
                                      micro_batch=mb, sp=sp)))
    assert all(b <= a * (1 + 1e-12) for a, b in zip(totals, totals[1:])), totals


@given(model_s, tp_s, zero_s, rc_s, mb_s)
def test_memory_never_rises_with_pp_1f1b(model, tp, zero, rc, mb):
    # 1F1B (vp = 1): the first stage holds L * min(1, m/p) layer-micro-batches (reference §1.3);
    # interleaving (vp > 1) holds L(1 + (p-1)/(pv)), which grows with p, so it is excluded here
    totals = []
    for pp in (1, 2, 4, 8):
        p = make_problem(model, "h100", 8 * tp * pp, 4096, 1024)
        totals.append(total(p, Layout(dp=8, tp=tp, pp=pp, zero=zero, recompute=rc, micro_batch=mb)))
    assert all(b <= a * (1 + 1e-12) for a, b in zip(totals, totals[1:])), totals


@given(model_s, tp_s, pp_s, zero_s, rc_s, mb_s)
def test_memory_never_rises_with_dp(model, tp, pp, zero, rc, mb):
    totals = []
    for dp in (1, 2, 4, 8, 16):
        p = make_problem(model, "h100", dp * tp * pp, 4096, 1024)
        totals.append(total(p, Layout(dp=dp, tp=tp, pp=pp, zero=zero, recompute=rc, micro_batch=mb)))
    assert all(b <= a * (1 + 1e-12) for a, b in zip(totals, totals[1:])), totals


@given(model_s, tp_s, pp_s, st.sampled_from([1, 2, 4]), zero_s, rc_s, mb_s,
       st.sampled_from([1, 2, 4, 8]))
def test_every_item_non_negative_and_sums(model, tp, pp, vp, zero, rc, mb, ep):
    p = PROBLEMS[model]
    if vp > 1 and pp == 1:
        vp = 1
    lay = Layout(tp=tp, pp=pp, vp=vp, zero=zero, recompute=rc, micro_batch=mb,
                 ep=ep if model == "mixtral-8x7b" else 1)
    try:
        r = estimate(p, lay)
    except ValueError:
        return  # a rule rejected it (e.g. layers % (pp*vp)); covered by rule tests
    mem, tm = r["memory_gib"], r["time_s"]
    # every memory figure is non-negative, per stage too; headroom is negative when it does not fit
    sizes = {k: v for k, v in mem.items() if k not in ("by_stage", "headroom")}
    assert all(v >= 0 for v in sizes.values())
    assert all(v >= 0 for st in mem["by_stage"] for k, v in st.items()
               if isinstance(v, float))
    assert (mem["headroom"] >= 0) == r["fits"]
    assert mem["total"] <= mem["reserved"] <= mem["device"]
    assert all(v >= 0 for v in r["time_s"].values())
    parts = ("params", "grads", "optimizer", "activations", "embedding_logits", "overhead")
    assert np.isclose(sum(mem[k] for k in parts), mem["total"], rtol=1e-12)
    items = [v for k, v in tm.items() if k not in ("step", "step_low", "step_high")]
    assert np.isclose(sum(items), tm["step"], rtol=1e-12)  # the band ends are not items
    assert tm["step_low"] < tm["step"] < tm["step_high"] and mem["total_high"] > mem["total"]
    assert 0 < r["mfu"] < 1


@given(st.lists(st.tuples(tp_s, pp_s, zero_s, rc_s, mb_s), min_size=2, max_size=12))
def test_batch_path_equals_single_path(rows):
    p = PROBLEMS["llama3-70b"]
    layouts = [Layout(tp=tp, pp=pp, zero=z, recompute=rc, micro_batch=mb) for tp, pp, z, rc, mb in rows]
    ev = evaluate(p, LayoutTable.from_layouts(layouts, 256))
    for i, lay in enumerate(layouts):
        assert ev.record(i) == estimate(p, lay)  # exact equality, not approx


def test_csv_batch_equals_single():
    p = PROBLEMS["llama3-8b"]
    frame = pd.DataFrame([
        dict(model="llama3-8b", gpu="h100", n_gpus=256, gpus_per_node=8, seq_len=4096,
             global_batch=1024, dp="", tp=tp, pp=pp, vp=1, cp=1, ep=1, zero=1,
             recompute="selective", sp="", micro_batch=2)
        for tp, pp in ((1, 1), (2, 2), (8, 4))
    ]).astype(str)
    out = score_frame(frame)
    for i, (tp, pp) in enumerate(((1, 1), (2, 2), (8, 4))):
        r = estimate(p, Layout(tp=tp, pp=pp, zero=1, recompute="selective", micro_batch=2))
        assert out.loc[i, "time_step_s"] == r["time_s"]["step"]
        assert out.loc[i, "mem_total_gib"] == r["memory_gib"]["total"]
        assert out.loc[i, "error"] == ""
