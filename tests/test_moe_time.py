"""The MoE layer's time terms (`cost.moe_layer`, `cost.moe_dispatch`), each against a derivation
written out here: the bytes each dispatcher sends (recorded at the collective, so the link
formulas of `cost.comm` stay out of it), the node deduplication of DeepEP/HybridEP, the
expert-TP traffic and GEMM shapes, the fp32 router, the routing imbalance, the host overhead and
what each overlap hides."""

import numpy as np
import pytest

from autoparallel import Layout, make_problem
from autoparallel.cost import moe_dispatch
from autoparallel.cost.model_arch import build_arch
from autoparallel.cost.compute import linear_time
from autoparallel.cost.moe_dispatch import dispatch_time, node_dedup
from autoparallel.cost.moe_layer import (expert_gemms, exposed_dispatch, hidden_dispatch_nic,
                                         host_overhead, imbalance,
                                         moe_ffn)
from autoparallel.errors import SpecError
from autoparallel.layouts import LayoutTable
from autoparallel.placement import Group, layout_groups
from autoparallel.rules import Reject, check_rules
from autoparallel.units import US

# DeepSeek-V3: h 7168, 256 experts of width 2048, top-8, 8 groups of which 4 (group-limited)
H, E, K, F_E = 7168, 256, 8, 2048
SEQ = 4096


def _ds(**job):
    return make_problem("deepseek-v3", "h100", 1024, SEQ, 8192, **job)


def _table(*slugs, n=1024):
    return LayoutTable.from_layouts([Layout.from_slug(s) for s in slugs], n, 61)


def _record(monkeypatch):
    """Collectives the dispatcher asks for: (op, bytes per row, group size per row)."""
    calls = []

    def fake(problem, op, nbytes, grp):
        calls.append((str(op), np.broadcast_to(np.asarray(nbytes, dtype=float),
                                               grp.size.shape).copy(), grp.size.copy()))
        return calls[-1][1]  # "seconds" = bytes: the Dispatch fields then sum bytes

    monkeypatch.setattr(moe_dispatch, "collective_time", fake)
    return calls


def test_node_dedup_against_its_derivation():
    """A token's k = 8 experts over N nodes hit N (1 - (1 - 1/N)^8) distinct ones: over 8 nodes
    8 (1 - (7/8)^8) = 5.2511, i.e. 0.6564 of the 8 copies plain all-to-all sends; with 4 of 8
    node-aligned groups a token reaches at most 4 nodes: 4 (1 - (3/4)^8) / 8 = 0.4499; inside
    one node nothing is deduplicated."""
    arch = build_arch(make_problem("deepseek-v3", "h100", 64, SEQ, 64).model)
    assert (arch.n_groups, arch.topk_groups) == (8, 4)
    nodes = Group(size=np.array([64.0, 64.0, 8.0]), per_tier=(np.array([8.0, 8.0, 8.0]),))
    assert list(nodes.nodes) == [8.0, 8.0, 1.0]
    free = arch.__class__(**{**arch.__dict__, "n_groups": 0, "topk_groups": 0})
    assert node_dedup(free, nodes)[0] == pytest.approx(8 * (1 - (7 / 8) ** 8) / 8, rel=1e-12)
    assert node_dedup(arch, nodes)[1] == pytest.approx(4 * (1 - (3 / 4) ** 8) / 8, rel=1e-12)
    assert node_dedup(arch, nodes)[2] == 1.0


def test_alltoall_bytes_and_the_expert_tp_gather(monkeypatch):
    """alltoall, tp = etp = 2 with SP: a rank routes T_r = 4096 / 2 = 2048 tokens, sends
    k T_r = 16,384 copies of 2h bytes (dispatch), the same back (combine) and 4 bytes of fp32
    probability per copy; the backward sends two 2h-byte all-to-alls again. The expert-TP group
    then all-gathers what arrived, so each of its ranks holds etp k T_r = k T = 32,768 copies,
    2 h k T bytes = 469,762,048 (the whole routed input, not / t), and reduce-scatters as much
    back after the experts, forward and backward."""
    calls = _record(monkeypatch)
    p = _ds()
    t = _table("dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep32-z1-rselective-sp-mb1")
    d = dispatch_time(p, build_arch(p.model), t, layout_groups(t, 8))
    copies = K * SEQ / 2
    assert {(op, int(s[0])) for op, b, s in calls} == {
        ("all_to_all", 32), ("all_gather", 2), ("reduce_scatter", 2)}
    assert d.fwd[0] == copies * H * 2 + copies * H * 2 + copies * 4
    assert d.bwd[0] == 2 * copies * H * 2
    assert d.etp_fwd[0] == d.etp_bwd[0] == 2 * (2 * H * K * SEQ)
    assert 2 * H * K * SEQ == 469_762_048


def test_flex_dispatch_is_deduplicated_and_fp8(monkeypatch):
    """deepep with MXFP8 across 8 nodes: every all-to-all's bytes scale by 0.4499 (above), and
    the dispatch goes at 1 + 1/32 bytes per element (E8M0 scale per 32), combine in BF16."""
    calls = _record(monkeypatch)
    p = make_problem("deepseek-v3", "b200", 256, SEQ, 4096, precision="mxfp8",
                     moe_dispatcher="deepep")
    t = _table("dp64-tp1-pp4-vp1-cp1-ep64-z1-rnone-mb1", n=256)
    d = dispatch_time(p, build_arch(p.model), t, layout_groups(t, 8))
    rho = 4 * (1 - (3 / 4) ** 8) / 8
    copies = K * SEQ
    got = sorted(float(b[0]) for op, b, s in calls if op == "all_to_all")
    want = sorted([copies * H * (1 + 1 / 32) * rho, copies * H * 2 * rho, copies * 4 * rho])
    assert got == pytest.approx(want, rel=1e-12)
    assert d.bwd[0] == pytest.approx(2 * copies * H * 2 * rho, rel=1e-12)
    # etp = tp = 1: the expert-TP "group" is one rank, which collective_time prices at 0
    assert all(int(s[0]) == 1 for op, b, s in calls if op != "all_to_all")


def test_allgather_dispatcher_gathers_the_expert_tp_x_ep_block(monkeypatch):
    """allgather: every rank gathers the T_r tokens of all etp x ep ranks (here 1 x 8 = 8:
    8 x 4096 x 2h bytes) and reduce-scatters the outputs; k does not enter."""
    calls = _record(monkeypatch)
    p = make_problem("mixtral-8x7b", "h100", 8, SEQ, 64, moe_dispatcher="allgather")
    t = LayoutTable.from_layouts([Layout(dp=8, ep=8)], 8, 32)
    d = dispatch_time(p, build_arch(p.model), t, layout_groups(t, 8))
    assert d.fwd[0] == d.bwd[0] == 2 * 8 * SEQ * 4096 * 2.0
    assert [(op, float(b[0]), int(s[0])) for op, b, s in calls] == [
        ("all_gather", 8 * SEQ * 4096 * 2.0, 8), ("reduce_scatter", 8 * SEQ * 4096 * 2.0, 8)]


def test_expert_gemm_shapes_with_expert_tp():
    """tp = etp = 2, ep = 32: 8 local experts; each rank holds etp k T_r = k T = 32,768 routed
    tokens (balanced), 4,096 per expert; FC1 is 4096 x (2 x 2048 / 2) x 7168 and FC2
    4096 x 7168 x (2048 / 2), eight of each, plus the profile's per-expert tail
    (`grouped_gemm_expert_us`) per expert and projection."""
    p = _ds(moe_routing="balanced")
    t = _table("dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep32-z1-rselective-sp-mb1")
    got = expert_gemms(p, build_arch(p.model), t)
    want = (linear_time(p, 4096.0, 2 * 1024, H, 8) + linear_time(p, 4096.0, H, 1024, 8)
            + 2 * 8 * p.profile.grouped_gemm_expert_us * US)
    assert got[0] == pytest.approx(float(want[()] if np.ndim(want) == 0 else want[0]), rel=1e-12)


def test_routing_imbalance_scales_the_expert_tokens():
    assert imbalance(_ds(moe_routing="balanced")) == 1.0
    assert imbalance(_ds(moe_routing="capacity", moe_capacity_factor=1.25)) == 1.25
    assert imbalance(_ds()) == _ds().profile.moe_dropless_imbalance  # dropless, the default
    t = _table("dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep32-z1-rselective-sp-mb1")
    arch = build_arch(_ds().model)
    a = expert_gemms(_ds(moe_routing="balanced"), arch, t)
    b = expert_gemms(_ds(moe_routing="capacity", moe_capacity_factor=2.0), arch, t)
    assert b[0] > 1.8 * a[0]  # twice the tokens through the same weights
    with pytest.raises(SpecError, match="needs `--moe-routing` capacity"):
        _ds(moe_capacity_factor=1.5)


def test_router_runs_in_fp32_on_the_cuda_cores():
    """2 T_r E h FLOPs at the FP32 peak (67 TFLOP/s on H100) x the GEMM efficiency, plus the
    per-kernel floor; with tp 1, T_r = 4096: 2 x 4096 x 256 x 7168 = 15.03 GFLOP. The scores,
    fused, are read and written once: 2 x 4 x 4096 x 256 bytes."""
    p = _ds(moe_routing="balanced")
    t = _table("dp64-tp1-pp16[3,4x14,2]-vp1-cp1-ep64-z1-rselective-mb1")
    arch = build_arch(p.model)
    ffn = moe_ffn(p, arch, t, np.zeros(1))
    prof = p.profile
    router = 2 * 4096 * 256 * H / (prof.gemm_efficiency * 67e12) + prof.gemm_overhead_us * US
    assert ffn.gemm[0] - expert_gemms(p, arch, t)[0] - ffn.shared[0] == pytest.approx(router, rel=1e-9)
    assert ffn.elem[0] == pytest.approx(2 * 4 * 4096 * 256 / (prof.hbm_efficiency * 3.35e12), rel=1e-9)


def test_host_overhead_by_shapes_and_graphs():
    per = _ds().profile.moe_host_overhead_us * US
    assert host_overhead(_ds(), 1)[0] == per  # dropless: the token counts sync each layer
    assert host_overhead(_ds(cuda_graphs="scoped"), 1)[0] == 0.5 * per
    assert host_overhead(_ds(moe_routing="capacity"), 1)[0] == 0.0  # static shapes
    assert host_overhead(_ds(moe_dispatcher="hybridep", cuda_graphs="full"), 1)[0] == 0.0
    with pytest.raises(SpecError, match="dynamic shapes"):
        _ds(cuda_graphs="full")


def test_what_each_overlap_hides():
    """With nothing to hide behind, the dispatch is exposed whole; the 1F1B all-to-all overlap
    behind a window far larger than it leaves only the SM share (overlap_sm_fraction) of it;
    shared-expert overlap hides it behind the shared experts (forward 1x, backward 2x); the
    expert-TP gather is exposed in every case."""
    p = _ds()
    arch = build_arch(p.model)
    t = _table("dp32-tp2-pp16[3,4x14,2]-vp2-cp1-ep32-z1-rselective-sp-mb1")
    d = moe_dispatch.Dispatch(fwd=np.array([2.0]), bwd=np.array([3.0]), etp_fwd=np.array([0.5]),
                              etp_bwd=np.array([0.25]), nic_fwd=np.array([0.4]),
                              nic_bwd=np.array([0.6]))
    ffn = moe_ffn(p, arch, t, np.zeros(1))
    ep, etp = exposed_dispatch(p, arch, t, d, ffn, np.array([0.0]), 0.0)
    assert (ep[0], etp[0]) == (5.0, 0.75)
    q = _ds(moe_a2a_overlap=True)
    ep, _ = exposed_dispatch(q, arch, t, d, ffn, np.array([1e3]), 0.0)
    assert ep[0] == pytest.approx(q.profile.overlap_sm_fraction * 5.0)
    # behind a layer of 0.5 s: forward 1 of its 2 s hides (window 2 x 0.5), backward 0.5 of 3
    ep, _ = exposed_dispatch(q, arch, t, d, ffn, np.array([0.5]), 0.0)
    f = q.profile.overlap_sm_fraction
    assert ep[0] == pytest.approx((1.0 + f * 1.0) + (2.5 + f * 0.5))
    # a recomputed forward (again = 1) dispatches once more, hidden the same way: 2 x 2 + 3 s;
    # its expert-TP gather runs again too, exposed: 2 x 0.5 + 0.25
    ep, etp = exposed_dispatch(q, arch, t, d, ffn, np.array([1e3]), 1.0)
    assert ep[0] == pytest.approx(q.profile.overlap_sm_fraction * 7.0)
    assert etp[0] == pytest.approx(1.25)
    # Megatron runs the 1F1B overlap with a pipeline only on virtual stages: pp 16 with vp 1
    # hides nothing (5 s exposed), whatever compute there is
    t1 = _table("dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep32-z1-rselective-sp-mb1")
    ffn1 = moe_ffn(p, arch, t1, np.zeros(1))
    ep, _ = exposed_dispatch(q, arch, t1, d, ffn1, np.array([1e3]), 0.0)
    assert ep[0] == 5.0
    shared = ffn.__class__(**{**ffn.__dict__, "shared": np.array([1.0])})
    stack = p.stack.model_copy(update={"moe_shared_expert_overlap": True})
    s = p.model_copy(update={"stack": stack})
    ep, _ = exposed_dispatch(s, arch, t, d, shared, np.array([0.0]), 0.0)
    f = p.profile.overlap_sm_fraction
    # forward: 2 s against 1 s of shared experts -> 1 exposed + f x 1; backward: 3 against 2
    assert ep[0] == pytest.approx((1.0 + f * 1.0) + (1.0 + f * 2.0))


def test_hidden_dispatches_hold_the_nics_in_proportion():
    """The NIC time the DP reduction cannot use is the hidden dispatches' share of theirs:
    nothing hidden -> 0; all hidden (1F1B overlap behind 1000 s) -> forward 0.4 s, backward
    0.6 s, plus 0.4 s for a recomputed forward; shared-expert overlap hides 1 of the 2 forward
    seconds (0.2 of 0.4 NIC seconds) and 2 of the 3 backward ones (0.4 of 0.6)."""
    p = _ds()
    arch = build_arch(p.model)
    t = _table("dp32-tp2-pp16[3,4x14,2]-vp2-cp1-ep32-z1-rselective-sp-mb1")
    d = moe_dispatch.Dispatch(fwd=np.array([2.0]), bwd=np.array([3.0]), etp_fwd=np.array([0.5]),
                              etp_bwd=np.array([0.25]), nic_fwd=np.array([0.4]),
                              nic_bwd=np.array([0.6]))
    ffn = moe_ffn(p, arch, t, np.zeros(1))
    f, b = hidden_dispatch_nic(p, arch, t, d, ffn, np.array([0.0]), 0.0)
    assert (f[0], b[0]) == (0.0, 0.0)
    q = _ds(moe_a2a_overlap=True)
    f, b = hidden_dispatch_nic(q, arch, t, d, ffn, np.array([1e3]), 1.0)
    assert (f[0], b[0]) == pytest.approx((0.4, 0.6 + 0.4))
    shared = ffn.__class__(**{**ffn.__dict__, "shared": np.array([1.0])})
    s = p.model_copy(update={"stack": p.stack.model_copy(update={"moe_shared_expert_overlap": True})})
    f, b = hidden_dispatch_nic(s, arch, t, d, shared, np.array([0.0]), 0.0)
    assert (f[0], b[0]) == pytest.approx((0.4 * 1.0 / 2.0, 0.6 * 2.0 / 3.0))


def test_a2a_overlap_rule_follows_megatron_checks():
    p = _ds(moe_a2a_overlap=True)
    arch = build_arch(p.model)
    t = _table("dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep32-z1-rselective-sp-mb1",  # pp without vp
               "dp32-tp2-pp8-vp2-cp1-ep32-z1-rfull-sp-mb1",                 # full recompute
               "dp32-tp2-pp16[4x15,1]-vp1-cp1-ep1-z1-rnone-sp-mb1",         # ep 1
               "dp32-tp2-pp8-vp2-cp1-ep32-z1-rselective-sp-mb1")            # fine
    flags = check_rules(p, arch, t) & int(Reject.A2A_OVERLAP)
    assert (flags != 0).tolist() == [True, True, True, False]
    # DeepSeek-V3's one MTP layer needs a pipeline with the overlap; two MTP layers
    # (Nemotron-3 Ultra's) are refused outright (transformer_config.py asserts)
    assert arch.n_mtp == 1
    no_pp = _table("dp1024-tp1-pp1-vp1-cp1-ep64-z1-rnone-mb1")
    assert check_rules(p, arch, no_pp)[0] & int(Reject.A2A_OVERLAP)
    ultra = make_problem("nemotron-3-ultra", "gb300", 256, 8192, 256, stack="megatron-bridge",
                         moe_a2a_overlap=True)
    u_arch = build_arch(ultra.model)
    assert u_arch.n_mtp == 2
    u = LayoutTable.from_layouts([Layout.from_slug("dp32-tp1-pp8-vp1-cp1-ep64-z1-rnone-mb1")],
                                 256, ultra.model.n_layers)
    assert check_rules(ultra, u_arch, u)[0] & int(Reject.A2A_OVERLAP)
    with pytest.raises(SpecError, match="allgather"):
        _ds(moe_a2a_overlap=True, moe_dispatcher="allgather")
