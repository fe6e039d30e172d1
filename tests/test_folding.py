"""MoE Parallel Folding (Megatron-Core, arXiv 2504.14960): expert layers run ETP x EP x EDP on the
ranks where attention runs TP x CP x DP, so EP may exceed DP. The layout field `etp` (default tp)
and the derived `edp` everywhere a layout appears: slug, rules, placement, memory, JSON, CSV,
exports and the search."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autoparallel import ExportError, Layout, estimate, make_problem
from autoparallel.cost.model_arch import build_arch
from autoparallel.cost.memory import stage_params
from autoparallel.cost.stages import stages
from autoparallel.errors import SpecError
from autoparallel.exporters import check, render
from autoparallel.layouts import LayoutTable, edp
from autoparallel.placement import layout_groups
from autoparallel.rules import Reject, check_rules
from autoparallel.search.enumerate import enumerate_layouts
from autoparallel.search.space import SearchSpace
from conftest import run_cli
from launcher_checks import megatron_script_layout, torchtitan_layout

HERE = Path(__file__).parent
PYTHON = os.environ.get("AUTOPARALLEL_LAUNCHER_PYTHON")
DS_1024 = dict(seq_len=4096, global_batch=8192)
PUBLISHED = "dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep64-etp1-z1-rselective-sp-mb1"
"""DeepSeek-V3 on 1,024 H100 as the issue quotes it: TP2 PP16 EP64 expert-TP 1 DP32 (the
balanced uneven split of its 61 layers over 16 stages pinned)."""


def _ds(n=1024):
    return make_problem("deepseek-v3", "h100", n, **DS_1024)


def test_slug_round_trip_and_default_form():
    lay = Layout.from_slug(PUBLISHED)
    assert (lay.tp, lay.ep, lay.etp, lay.expert_tp, lay.dp) == (2, 64, 1, 1, 32)
    assert lay.slug == PUBLISHED
    # edp = tp x cp x dp / (etp x ep) = 2 x 1 x 32 / (1 x 64) = 1
    assert lay.edp == 1
    # etp = tp is Megatron's default: the canonical form leaves it out of the slug
    same = Layout(dp=8, tp=4, ep=8, etp=4).resolved(32)
    assert same.etp is None and "-etp" not in same.slug and same.expert_tp == 4
    assert Layout.from_slug(same.slug) == same
    # edp with the default: 4 x 1 x 8 / (4 x 8) = 1; with etp 1: 32 / 8 = 4
    assert same.edp == 1 and Layout(dp=8, tp=4, ep=8, etp=1).edp == 4


def test_rule_lets_ep_exceed_dp_and_refuses_what_does_not_fold():
    p = _ds()
    arch = build_arch(p.model)
    lays = [Layout.from_slug(PUBLISHED),
            Layout.from_slug(PUBLISHED.replace("etp1", "etp2")),  # 2 x 64 = 128 > 64 ranks
            Layout.from_slug(PUBLISHED.replace("etp1", "etp3")),  # 3 divides no 2048-wide shard
            Layout.from_slug(PUBLISHED.replace("-etp1", ""))]     # etp = tp = 2: 128 again
    t = LayoutTable.from_layouts(lays, 1024, 61)
    flags = check_rules(p, arch, t) & int(Reject.EXPERTS)
    assert flags.tolist() == [0, int(Reject.EXPERTS), int(Reject.EXPERTS), int(Reject.EXPERTS)]
    # dp x cp = 32 < ep = 64: before folding this was the only way to say "EP > DP"
    assert lays[0].dp * lays[0].cp < lays[0].ep


def test_estimate_accepts_the_published_layout_and_names_what_breaks():
    rec = estimate(_ds(), Layout.from_slug(PUBLISHED))
    assert (rec["layout"]["etp"], rec["layout"]["edp"], rec["layout"]["ep"]) == (1, 1, 64)
    with pytest.raises(SpecError, match=r"etp x ep = 2 x 64 = 128 must divide the tp x cp x dp = 2 x 1 x 32 = 64 ranks"):
        estimate(_ds(), Layout.from_slug(PUBLISHED.replace("etp1", "etp2")))
    dense = make_problem("llama3-8b", "h100", 8, 4096, 64)
    with pytest.raises(SpecError, match="a dense model has no experts"):
        estimate(dense, Layout(tp=2, etp=1))


def test_placement_of_the_expert_grid():
    """Expert ranks are numbered ETP innermost, then EP, then EDP (Megatron's expert
    RankGenerator in tp-cp-ep-dp-pp order): on nodes of 8, an EP group of 64 at stride etp = 1
    puts 8 ranks on each of 8 nodes; with etp = tp = 2 an EP group of 32 is strided 2, 4 ranks
    on each of 8 nodes, and the expert-DP group (size 2 x 32 / (2 x 32) = 1) is trivial."""
    t = LayoutTable.from_layouts([Layout.from_slug(PUBLISHED),
                                  Layout(dp=32, tp=2, pp=16, ep=32)], 1024, 61)
    g = layout_groups(t, 8)
    assert g["ep"].size.tolist() == [64, 32]
    assert g["ep"].per_node.tolist() == [8, 4] and g["ep"].nodes.tolist() == [8, 8]
    assert g["etp"].size.tolist() == [1, 2] and g["edp"].size.tolist() == [1, 1]


CASES = [  # (tp, cp, dp, pp, etp, ep)
    (2, 1, 32, 16, 1, 64), (2, 1, 32, 16, 2, 32), (1, 2, 16, 2, 1, 32), (4, 1, 8, 2, 2, 8),
    (8, 1, 4, 1, 1, 8), (2, 2, 8, 1, 4, 2),
]


@pytest.mark.skipif(not PYTHON, reason="AUTOPARALLEL_LAUNCHER_PYTHON is not set: no Megatron-Core")
def test_placement_matches_megatron_rank_generator():
    """Every group's size, ranks per node and nodes spanned as Megatron-Core's own
    `RankGenerator` builds them (megatron-core 0.16.1 parallel_state), for each case."""
    args = json.dumps([dict(tp=tp, cp=cp, dp=dp, pp=pp, etp=etp, ep=ep, per_node=8)
                       for tp, cp, dp, pp, etp, ep in CASES])
    r = subprocess.run([PYTHON, str(HERE / "real_launchers" / "check.py"), "megatron_groups", args],
                       capture_output=True, text=True, timeout=300)
    line = next(x for x in r.stdout.splitlines() if x.startswith("AUTOPARALLEL-RESULT "))
    wanted = json.loads(line.removeprefix("AUTOPARALLEL-RESULT "))
    if isinstance(wanted, dict) and "skip" in wanted:
        pytest.skip(wanted["skip"])
    for (tp, cp, dp, pp, etp, ep), want in zip(CASES, wanted, strict=True):
        t = LayoutTable.from_arrays(dp=dp, tp=tp, pp=pp, vp=1, cp=cp, ep=ep, etp=etp, zero=1,
                                    rc=0, sp=1, mb=1)
        got = layout_groups(t, 8)
        for kind, shape in want.items():
            g = got[kind]
            assert (int(g.size[0]), int(g.per_node[0]), int(g.nodes[0])) == (
                shape["size"], shape["per_node"], shape["nodes"]), (kind, tp, cp, dp, pp, etp, ep)


def test_expert_weights_over_etp_x_ep_and_their_states_over_edp():
    """DeepSeek-V3's routed experts: 256 x 3 x 7168 x 2048 = 11,274,289,152 parameters per MoE
    layer. A middle stage of [3,4x14,2] holds 4 MoE layers; with ETP 1 x EP 64 each GPU keeps
    4 x 11,274,289,152 / 64 = 704,643,072 of them, with ETP 2 x EP 32 the same (the product
    shards), with ETP 1 x EP 32 twice that, 1,409,286,144. ZeRO-1 spreads their 12 optimizer
    bytes over EDP = 64 / (etp x ep) = 1, 1 and 2."""
    p = _ds()
    arch = build_arch(p.model)
    base = Layout.from_slug(PUBLISHED)
    lays = [base, base.model_copy(update={"ep": 32, "etp": None}),
            base.model_copy(update={"ep": 32})]
    t = LayoutTable.from_layouts(lays, 1024, 61)
    st = stages(arch, t, 8192)["middle"]
    assert st.n_moe.tolist() == [4.0, 4.0, 4.0]
    dense, expert = stage_params(arch, t, st)
    assert arch.p_routed == 256 * 3 * 7168 * 2048
    assert expert.tolist() == [704_643_072.0, 704_643_072.0, 1_409_286_144.0]
    assert edp(t).tolist() == [1.0, 1.0, 2.0]
    from autoparallel.cost.memory import stage_memory

    opt = stage_memory(p, arch, t, st)["optimizer"]
    want = 12.0 * (dense / 32.0 + expert / np.array([1.0, 1.0, 2.0]))
    assert np.allclose(opt, want, rtol=1e-12)


def test_enumerator_searches_folded_layouts():
    p = _ds()
    space = SearchSpace(tp=[2], pp=[16], cp=[1], zero=[1], recompute=["selective"], sp=[True],
                        micro_batch=[1], stage_layers=[3] + [4] * 14 + [2])
    t = enumerate_layouts(p, space)
    pairs = set(zip(t["ep"].tolist(), t["etp"].tolist()))
    # by default etp is 1 or tp (= 2), and etp x ep divides the 64 ranks of a stage, ep the 256
    # experts: (ep, etp) with ep | 256, ep x etp | 64
    want = {(e, x) for e in (1, 2, 4, 8, 16, 32, 64) for x in (1, 2) if 64 % (e * x) == 0}
    assert pairs == want
    assert (64, 1) in pairs  # the published EP64 x ETP1 on DP32
    # asked for, any etp dividing the 2048 expert width inside the node of 8
    t = enumerate_layouts(p, space.narrowed(etp=[1, 2, 4, 8]))
    pairs = set(zip(t["ep"].tolist(), t["etp"].tolist()))
    assert pairs == {(e, x) for e in (1, 2, 4, 8, 16, 32, 64) for x in (1, 2, 4, 8)
                     if 64 % (e * x) == 0}
    with pytest.raises(SpecError, match="no experts"):
        enumerate_layouts(make_problem("llama3-8b", "h100", 8, 4096, 64), SearchSpace(etp=[1]))


def test_megatron_export_writes_expert_tp_and_reads_back():
    text = render("megatron", _ds(), Layout.from_slug(PUBLISHED))
    assert "--expert-model-parallel-size 64 --expert-tensor-parallel-size 1" in text
    got = megatron_script_layout(text)
    assert (got["etp"], got["ep"], got["tp"], got["dp"]) == (1, 64, 2, 32)


def test_torchtitan_expert_grid_per_release():
    p = make_problem("deepseek-v3", "h100", 256, 4096, 1024)
    split = [15, 16, 16, 14]
    folded = Layout(tp=8, pp=4, ep=64, etp=1, stage_layers=split)  # EP 64 > dp_shard x cp = 8
    # 0.2.2: the TOML's expert_tensor_parallel_degree, ETP = TP or 1
    cfg = torchtitan_layout(render("torchtitan", p, folded, "0.2.2"), 256, 61)
    assert (cfg["ep"], cfg["etp"]) == (64, 1)
    assert cfg["config"]["parallelism"]["expert_tensor_parallel_degree"] == 1
    # 0.3: experts take no TP with EP; ETP = TP is refused there but written by 0.2.2
    assert not check("torchtitan", p, folded)
    tp_experts = Layout(tp=8, pp=4, ep=8, stage_layers=split)
    with pytest.raises(ExportError, match="TorchTitan 0.3 borrows EP from dp_shard x cp x tp"):
        render("torchtitan", p, tp_experts)
    assert torchtitan_layout(render("torchtitan", p, tp_experts, "0.2.2"), 256, 61)["etp"] == 8
    # an ETP other than 1 or TP: 0.2.2's _validate refuses it
    odd = Layout(tp=8, pp=4, ep=16, etp=2, stage_layers=split)
    assert any("supports ETP = TP (8) or 1 only" in r for r in check("torchtitan", p, odd, "0.2.2"))
    # the targets without folding say so and name megatron
    for target in ("deepspeed", "nanotron"):
        assert any("parallel folding" in r for r in check(target, p, odd))


def test_cli_estimate_plan_and_versus_take_etp():
    flags = ["--model", "deepseek-v3", "--gpu", "h100", "--gpus", "1024", "--seq-len", "4096",
             "--global-batch", "8192"]
    r = run_cli("estimate", *flags, "--tp", "2", "--pp", "16", "--ep", "64", "--etp", "1",
                "--dp", "32", "--zero", "1", "--recompute", "selective", "--micro-batch", "1",
                "--stage-layers", "3,4x14,2", "--format", "json")
    assert r.returncode == 0, r.stderr
    lay = json.loads(r.stdout)["layout"]
    assert (lay["etp"], lay["edp"], lay["ep"], lay["dp"]) == (1, 1, 64, 32)
    r = run_cli("plan", *flags, "--tp", "2", "--pp", "16", "--stage-layers", "3,4x14,2",
                "--zero", "1", "--recompute", "selective", "--micro-batch", "1", "--sp", "on",
                "--etp", "1", "--versus", PUBLISHED, "--format", "csv")
    assert r.returncode == 0, r.stderr
    import io

    import pandas as pd

    frame = pd.read_csv(io.StringIO(r.stdout))
    assert set(frame["etp"]) == {1}
    assert (frame["tp"] * frame["cp"] * frame["dp"] == frame["etp"] * frame["ep"] * frame["edp"]).all()
