"""Network tiers as data (`--network`): specs, presets, collectives priced on the tiers a group
crosses, contention, and the default that reproduces the two-level model.

Derivations use the H100 preset (NVLink ring 0.82 x 450 = 369 GB/s, NVLS 1.06 x 450 = 477,
NIC 0.94 x 50 = 47 GB/s, NCCL LL128 latencies 14 + 1.9 / 4 us per step; reference §5.2, §6.2)
and the rules of `cost/comm.py`: a ring crossing a tier runs at (ranks per unit below) x NIC /
oversubscription; an all-to-all sends (n - ranks in the unit below)/n of its bytes across at
NIC / oversubscription; a point-to-point hop whose ranks all send at once gets NIC /
oversubscription.
"""

import subprocess
import sys

import numpy as np
import pytest

from autoparallel import Layout, estimate, make_problem
from autoparallel.cost.comm import Collective, bus_bandwidth, collective_time
from autoparallel.cost.network import crossings, sizes, tiers
from autoparallel.errors import SpecError
from autoparallel.layouts import LayoutTable
from autoparallel.placement import group
from autoparallel.presets import list_networks, load_network

GIB = 2**30
NIC = 0.94 * 50e9


def _net(tmp_path, text, name="net.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "autoparallel", *args], capture_output=True,
                          text=True, timeout=300)


# --- specs and presets -------------------------------------------------------------------------

def test_presets_cover_the_common_builds():
    names = set(list_networks())
    assert {"two-level", "dgx-h100-superpod", "gb200-nvl72", "gb300-nvl72", "roce-2to1",
            "llama3-roce-24k", "aws-efa"} <= names
    for name in names:
        net = load_network(name)
        assert net.tiers[-1].size is None and net.sources, name
    meta = load_network("llama3-roce-24k")  # Llama 3 paper §3.3.1: 16-GPU racks, 3,072-GPU pods, 1:7
    assert [(t.size, t.oversubscription) for t in meta.tiers[1:]] == [(16, 1), (3072, 1), (None, 7)]


def test_presets_and_schema_commands():
    out = _cli("presets", "networks")
    assert out.returncode == 0, out.stderr
    for name in ("dgx-h100-superpod", "roce-2to1", "gb200-nvl72", "aws-efa"):
        assert name in out.stdout
    schema = _cli("schema", "network")
    assert schema.returncode == 0 and '"oversubscription"' in schema.stdout and '"tiers"' in schema.stdout


@pytest.mark.parametrize("text,match", [
    ('name="x"\n[[tiers]]\nname="a"\n[[tiers]]\nname="b"\nsize=64\n', "last tier holds the whole job"),
    ('name="x"\n[[tiers]]\nname="a"\n[[tiers]]\nname="b"\n[[tiers]]\nname="c"\n', r"tiers\[1\]\.size. is missing"),
    ('name="x"\n[[tiers]]\nname="a"\n[[tiers]]\nname="b"\nreduction="nvls"\n', "NVLink SHARP lives in the scale-up tier"),
    ('name="x"\n[[tiers]]\nname="a"\nreduction="sharp"\n[[tiers]]\nname="b"\n', "reduces in network switches"),
    ('name="x"\n[[tiers]]\nname="a"\n[[tiers]]\nname="b"\nplacement="spread"\n', "applies from tier 2"),
    ('name="x"\n[[tiers]]\nname="a"\n[[tiers]]\nname="b"\nsize=256\n[[tiers]]\nname="c"\nsize=384\n[[tiers]]\nname="d"\n',
     "whole units of the tier below"),
    ('name="x"\n[[tiers]]\nname="a"\n[[tiers]]\nname="b"\noversubscription=0.5\n', "oversubscription"),
    ('name="x"\n[[tiers]]\nname="a"\n', "tiers"),
])
def test_bad_network_files_name_the_field(tmp_path, text, match):
    with pytest.raises(SpecError, match=match):
        make_problem("llama3-8b", "h100", 64, 4096, 64, network=_net(tmp_path, text))


def test_network_that_does_not_fit_the_gpu(tmp_path):
    # a 256-GPU leaf unit holds no whole number of 72-GPU NVL72 domains
    with pytest.raises(SpecError, match="not a whole number of the 72-GPU units"):
        make_problem("llama3-8b", "gb200", 1152, 4096, 1152, gpus_per_node=4,
                     network="dgx-h100-superpod")
    wide = _net(tmp_path, 'name="x"\n[[tiers]]\nname="nvl"\nsize=16\n[[tiers]]\nname="net"\n')
    with pytest.raises(SpecError, match="cannot widen NVLink"):
        make_problem("llama3-8b", "h100", 64, 4096, 64, network=wide)
    with pytest.raises(SpecError, match="no such preset"):
        make_problem("llama3-8b", "h100", 64, 4096, 64, network="dgx-superpod-h100")


# --- the default reproduces the two-level model ----------------------------------------------

@pytest.mark.parametrize("lay", [Layout(tp=8, pp=4, dp=8), Layout(tp=4, dp=64, zero=3),
                                 Layout(tp=8, pp=2, dp=8, cp=2)])
def test_default_and_full_bisection_presets_reproduce_two_levels(lay):
    # a non-blocking fat tree prices like one flat network: every tier carries the NIC's rate
    base = make_problem("llama3-70b", "h100", 256, 8192, 512)
    want = estimate(base, lay)["time_s"]
    for net in ("two-level", "dgx-h100-superpod"):
        got = estimate(make_problem("llama3-70b", "h100", 256, 8192, 512, network=net), lay)["time_s"]
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-15), (net, k)


# --- collectives on the tiers ------------------------------------------------------------------

def _dp_group(p, n):
    """A DP group of n ranks at stride 8 (TP8 inside each node: one rank per node)."""
    return group(np.array([float(n)]), np.array([8.0]), sizes(p))


def test_ring_crosses_a_blocked_spine_once_per_leaf_group():
    # 2048 nodes, one DP rank each, in 64 leaf groups of 32 nodes: the ring enters and leaves
    # each leaf group once per channel, so the spine carries 32 ranks' worth per leaf group at
    # half rate (32 x 47 / 2 = 752 GB/s), far above one NIC: the 2:1 spine costs the ring nothing
    p = make_problem("llama3-8b", "h100", 16384, 4096, 16384, network="roce-2to1")
    g = _dp_group(p, 2048)
    assert (g.ranks_in(0)[0], g.ranks_in(1)[0]) == (1, 32)
    S = 16 * GIB
    lat = (14 + 2047 * 4) * 1e-6  # 2047 ring steps, all between nodes (LL128, reference §5.2)
    rs = collective_time(p, Collective.REDUCE_SCATTER, S, g)[0]
    assert rs == pytest.approx(lat + 2047 / 2048 * S / NIC, rel=1e-9)
    # spread over the spine (no topology-aware placement) every hop crosses it: NIC / 2
    q = make_problem("llama3-8b", "h100", 16384, 4096, 16384, network="roce-2to1-spread")
    h = _dp_group(q, 2048)
    assert h.ranks_in(1)[0] == 1
    assert collective_time(q, Collective.REDUCE_SCATTER, S, h)[0] == pytest.approx(
        lat + 2047 / 2048 * S / (NIC / 2), rel=1e-9)


def test_alltoall_limited_by_the_slowest_tier_it_crosses():
    # EP512 at TP1 spans 64 nodes in 2 leaf groups: each rank sends 504/512 of its bytes off the
    # node (NIC, 47 GB/s) and 256/512 off its leaf group (spine, 47/2): the spine binds,
    # t = 256/512 x S / 23.5 GB/s vs 504/512 x S / 47 GB/s on full bisection
    S = 1e9
    half = make_problem("llama3-8b", "h100", 16384, 4096, 16384, network="roce-2to1")
    full = make_problem("llama3-8b", "h100", 16384, 4096, 16384, network="dgx-h100-superpod")
    g = group(np.array([512.0]), np.array([1.0]), sizes(half))
    lat = (14 + 7 * 1.9 + 504 * 4) * 1e-6
    assert collective_time(half, Collective.ALL_TO_ALL, S, g)[0] == pytest.approx(
        lat + 256 / 512 * S / (NIC / 2), rel=1e-6)
    assert collective_time(full, Collective.ALL_TO_ALL, S, group(
        np.array([512.0]), np.array([1.0]), sizes(full)))[0] == pytest.approx(
        lat + 504 / 512 * S / NIC, rel=1e-6)


def test_pipeline_hop_across_the_spine_shares_its_uplinks():
    # PP at stride 1024 (TP8 x DP128): every stage boundary is 4 leaf groups away and every rank
    # sends at once, so each hop gets NIC / 2 on the 2:1 spine
    p = make_problem("llama3-8b", "h100", 16384, 4096, 16384, network="roce-2to1")
    g = group(np.array([16.0]), np.array([1024.0]), sizes(p))
    S = 1e8
    assert collective_time(p, Collective.P2P, S, g)[0] == pytest.approx(
        (14 + 4) * 1e-6 + S / (NIC / 2), rel=1e-6)


def test_infiniband_sharp_reduces_in_the_switches(tmp_path):
    # with SHARP on the network tier each node sends the buffer once (the switches reduce), so an
    # all-reduce over 4 nodes x 8 A100 runs at min(NVLink ring 231, 2 x 31/32 x 8 x 24) = 231
    # GB/s instead of the ring's min(231, 8 x 24) = 192
    net = _net(tmp_path, 'name="sharp"\n[[tiers]]\nname="nvlink"\n[[tiers]]\nname="ib"\nreduction="sharp"\n')
    p = make_problem("llama3-8b", "a100-80gb", 32, 4096, 64, network=net)
    g = group(np.array([32.0]), np.array([1.0]), sizes(p))
    assert bus_bandwidth(p, Collective.ALL_REDUCE, 16 * GIB, g)[0] == pytest.approx(0.77 * 300e9, rel=0.01)
    assert bus_bandwidth(p, Collective.ALL_REDUCE, 16 * GIB, g, "ring")[0] == pytest.approx(
        8 * 0.96 * 25e9, rel=0.01)
    # SHARP does not reduce an all-gather
    assert bus_bandwidth(p, Collective.ALL_GATHER, 16 * GIB, g)[0] == pytest.approx(8 * 0.96 * 25e9, rel=0.01)


def test_tier_latency_and_bandwidth_overrides(tmp_path):
    # a tier's own numbers replace the GPU's: 100 GB/s at 90 % and 10 us per step
    net = _net(tmp_path, 'name="x"\n[[tiers]]\nname="nvlink"\n[[tiers]]\nname="net"\n'
                         'gb_per_s=100\nefficiency=0.9\nlatency_us=10\n')
    p = make_problem("llama3-8b", "h100", 64, 4096, 64, network=net)
    t = tiers(p)[1]
    assert (t.bw, t.hop) == (pytest.approx(90e9), pytest.approx(10e-6))
    g = group(np.array([16.0]), np.array([8.0]), sizes(p))  # 16 nodes, 1 rank each
    assert collective_time(p, Collective.ALL_GATHER, 8.0, g)[0] == pytest.approx((14 + 15 * 10) * 1e-6, rel=1e-3)


# --- contention of concurrent groups on one tier --------------------------------------------

def test_hidden_alltoalls_take_nic_time_from_the_dp_reduction():
    # Mixtral, EP8 x TP1 on 4-GPU nodes: the all-to-alls leave each node. With them overlapped
    # with compute (ep_overlap = 1) they occupy the NICs while the gradient reduction hides in
    # the backward, so it hides only in the NIC time they leave (reference §5.6): the backward
    # window shrinks by the all-to-alls' NIC time, (n - 4)/n x bytes / 47 GB/s each: forward the
    # dispatch and combine of the k T copies (2h bytes each) and their fp32 probabilities
    # (4 bytes each), backward the two 2h-byte ones, per MoE layer. Exposed all-to-alls
    # (ep_overlap = 0) run between kernels and leave the NICs to the DP traffic.
    from autoparallel.cost.model_arch import build_arch
    from autoparallel.cost.time import stage_times
    from autoparallel.placement import layout_groups

    lay = Layout(tp=1, ep=8, dp=32, pp=1, zero=1)
    base = make_problem("mixtral-8x7b", "h100", 32, 4096, 64, gpus_per_node=4)
    over = base.model_copy(update={"profile": base.profile.model_copy(update={"ep_overlap": 1.0})})
    t = LayoutTable.from_layouts([lay], 32, base.model.n_layers)
    arch = build_arch(base.model)
    st = next(iter(stage_times(over, arch, t, layout_groups(t, sizes(over))).values()))
    a2a_bytes = 2.0 * arch.top_k * 4096 * arch.hidden  # dispatch or combine of one micro-batch
    per_a2a = (8 - 4) / 8 * a2a_bytes / NIC
    probs = (8 - 4) / 8 * 4.0 * arch.top_k * 4096 / NIC
    assert st["nic_bwd"][0] == pytest.approx(base.model.n_layers * 2 * per_a2a, rel=1e-9)
    assert st["nic_fwd"][0] == pytest.approx(base.model.n_layers * (2 * per_a2a + probs), rel=1e-9)
    exposed = next(iter(stage_times(base, arch, t, layout_groups(t, sizes(base))).values()))
    assert exposed["nic_bwd"][0] == 0.0
    # the DP item grows with the NIC time taken (ZeRO-1: reduce-scatter in the backward window)
    a = estimate(base, lay)["time_s"]["dp_comm"]
    b = estimate(over, lay)["time_s"]["dp_comm"]
    assert b > a
    # EP8 inside one 8-GPU node uses no NIC
    inside = make_problem("mixtral-8x7b", "h100", 32, 4096, 64)
    inside = inside.model_copy(update={"profile": inside.profile.model_copy(update={"ep_overlap": 1.0})})
    st_in = next(iter(stage_times(inside, arch, t, layout_groups(t, sizes(inside))).values()))
    assert st_in["nic_bwd"][0] == 0.0


# --- the 16,384-H100 case of issue 21 ---------------------------------------------------------

def test_crossings_name_the_tier_each_group_uses():
    p = make_problem("llama3-70b", "h100", 16384, 8192, 4096, network="roce-2to1")
    t = LayoutTable.from_layouts([Layout(tp=8, pp=16, dp=128), Layout(tp=8, dp=2048)], 16384, 80)
    c = crossings(p, t)
    assert list(c["tp"]) == ["nvlink", "nvlink"]
    assert list(c["dpcp"]) == ["spine", "spine"]  # 128 nodes = 4 leaf groups
    assert list(c["pp"]) == ["spine", ""]


def test_oversubscribed_spine_on_16384_h100():
    # issue 21's case: Llama-3-70B, 8K sequences, 4,096 per step on 16,384 H100 (2,048 nodes in
    # 64 leaf groups of 256 GPUs), with a full-bisection fat tree, a 2:1 spine with the job in
    # whole leaf groups (topology-aware scheduling) and the same spine with the nodes spread
    from autoparallel.search.plan import plan
    from autoparallel.search.space import SearchSpace

    space = SearchSpace().narrowed(tp=[2, 4, 8], cp=[1, 2, 4], pp=[1, 2, 4, 8], ep=[1], zero=[1],
                                   recompute=["none"], micro_batch=[1])
    probs = {net: make_problem("llama3-70b", "h100", 16384, 8192, 4096, network=net)
             for net in ("dgx-h100-superpod", "roce-2to1", "roce-2to1-spread")}
    keys = ("dp", "tp", "pp", "vp", "cp", "ep", "zero", "recompute", "sp", "micro_batch",
            "stage_layers", "schedule")

    def first(net):
        rec = plan(probs[net], space, top=1, keep=0).records()[0]
        return Layout(**{k: rec["layout"][k] for k in keys})

    full_1 = first("dgx-h100-superpod")
    assert full_1.dp >= 512  # the fastest layout on full bisection is data-parallel heavy
    on = {net: estimate(p, full_1)["time_s"] for net, p in probs.items()}
    # whole leaf groups: the DP ring crosses the spine once per leaf group (32 x 47/2 GB/s > one
    # NIC) and is unchanged; only the pipeline hop, which every rank sends across at once, runs
    # at 47/2 GB/s
    assert on["roce-2to1"]["dp_comm"] == pytest.approx(on["dgx-h100-superpod"]["dp_comm"], rel=1e-9)
    assert on["roce-2to1"]["pp_comm"] > 1.5 * on["dgx-h100-superpod"]["pp_comm"]
    assert on["roce-2to1"]["step"] > on["dgx-h100-superpod"]["step"]
    # spread: every DP hop crosses the spine; the ring's r ranks per node share r x 47/2 GB/s, so
    # with 2 DP ranks per node (tp4) its bus bandwidth falls from min(369, 2 x 47) = 94 to 47
    t = LayoutTable.from_layouts([full_1], 16384, 80)
    g_full = {n: group(t["dp"] * t["cp"], t["tp"], sizes(p)) for n, p in probs.items()}
    r0 = g_full["roce-2to1-spread"].ranks_in(0)[0]
    S = 1e11  # large: the 1,024-rank ring's ~4 ms of latency is under 1 %
    bus = {n: bus_bandwidth(p, Collective.REDUCE_SCATTER, S, g_full[n])[0] for n, p in probs.items()}
    assert bus["dgx-h100-superpod"] == pytest.approx(min(369e9, r0 * NIC), rel=0.02)
    assert bus["roce-2to1-spread"] == pytest.approx(r0 * NIC / 2, rel=0.02)
    slower = on["roce-2to1-spread"]["step"] / on["dgx-h100-superpod"]["step"] - 1
    assert slower > 0.10
    # the plan's #1 on the spread fabric shifts traffic off the spine: more DP ranks per node
    # (each GPU's share of the DP ring through its NIC is 1/r of it) and a smaller DP degree
    spread_1 = first("roce-2to1-spread")
    assert spread_1 != full_1
    t2 = LayoutTable.from_layouts([spread_1], 16384, 80)
    g2 = group(t2["dp"] * t2["cp"], t2["tp"], sizes(probs["roce-2to1-spread"]))
    assert g2.ranks_in(0)[0] > r0 and spread_1.dp < full_1.dp
    assert estimate(probs["roce-2to1-spread"], spread_1)["time_s"]["step"] < on["roce-2to1-spread"]["step"]


def test_network_is_a_job_field_in_cli_csv_and_json():
    import csv
    import io
    import json

    args = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "64", "--seq-len", "4096",
            "--global-batch", "256", "--network", "roce-2to1"]
    table = _cli("plan", *args, "--top", "3", "--keep", "0")
    assert table.returncode == 0, table.stderr
    # 64 GPUs = 8 nodes inside one 256-GPU leaf group: DP crosses the leaf, TP stays on NVLink
    line = next(x for x in table.stdout.splitlines() if x.startswith("#1 groups by the outermost"))
    assert "leaf" in line and "spine" not in line
    rows = list(csv.DictReader(io.StringIO(_cli("plan", *args, "--top", "2", "--keep", "0",
                                                "--format", "csv").stdout)))
    assert rows and all(r["network"] == "roce-2to1" for r in rows)
    est = _cli("estimate", *args, "--tp", "8", "--pp", "1", "--format", "json")
    assert est.returncode == 0, est.stderr
    assert json.loads(est.stdout)["job"]["network"] == "roce-2to1"
    bad = _cli("estimate", *args[:-1], "nosuchnet", "--tp", "8")
    assert bad.returncode == 2 and "no such preset" in bad.stderr and "Traceback" not in bad.stderr


def test_robustness_slows_every_network_tier():
    # the network perturbation of `--rank-by robust` (20 % slower) applies to each tier's own
    # bandwidth: GB300 NVL72's 100 GB/s leaf becomes 80, not the GPU NIC's 40
    from autoparallel.search.robust import NET_DROP, _slower_network

    p = make_problem("llama3-8b", "gb200", 1152, 4096, 1152, gpus_per_node=4, network="gb300-nvl72")
    slow = p.model_copy(update={"cluster": _slower_network(p.cluster)})
    for a, b in zip(tiers(p)[1:], tiers(slow)[1:]):
        assert b.bw == pytest.approx(a.bw * (1 - NET_DROP), rel=1e-12)
    assert tiers(slow)[1].bw == pytest.approx(100e9 * 0.94 * 0.8, rel=1e-12)
    assert tiers(slow)[0].bw == tiers(p)[0].bw


def test_ep64_alltoall_inside_an_nvl72_domain_costs_under_a_third_of_b200_nodes():
    # issue 21: EP64 at TP1. Inside one NVL72 domain every byte moves over NVLink:
    # 63/64 x S / (0.76 x 900 GB/s); on 8-GPU B200 nodes 56/64 of it leaves the node at one NIC
    # per GPU (nccl-tests #267): 56/64 x S / (0.94 x 50 GB/s), about 13x longer
    S = 1e9
    nvl = make_problem("deepseek-v3", "gb200", 72, 4096, 72, gpus_per_node=4)
    hgx = make_problem("deepseek-v3", "b200", 64, 4096, 64)
    g_nvl = group(np.array([64.0]), np.array([1.0]), sizes(nvl))
    g_hgx = group(np.array([64.0]), np.array([1.0]), sizes(hgx))
    t_nvl = collective_time(nvl, Collective.ALL_TO_ALL, S, g_nvl)[0]
    t_hgx = collective_time(hgx, Collective.ALL_TO_ALL, S, g_hgx)[0]
    assert t_nvl == pytest.approx((14 + 63 * 1.9) * 1e-6 + 63 / 64 * S / (0.76 * 900e9), rel=1e-6)
    assert t_hgx == pytest.approx((14 + 7 * 1.9 + 56 * 4) * 1e-6 + 56 / 64 * S / NIC, rel=1e-6)
    assert t_nvl < t_hgx / 3


def test_cp_groups_are_priced_on_the_tiers_they_cross():
    """Each context-parallel collective runs on its own group (`cost.context.cp_groups`), placed
    on the tiers like every other: 64 H100 in 8 nodes, TP 1 (CP ranks adjacent), cp 16 as a2a 8 x
    ring 2 and as a plain ring of 16. On roce-2to1 the 64 GPUs sit in one 256-GPU leaf group (full
    bisection); on roce-2to1-spread each node is in its own leaf group and every hop between nodes
    crosses the 2:1 spine. The a2a group of 8 adjacent ranks is one NVLink domain on both: no
    network term. The ring hop between the two a2a groups (stride 8: the next node) sends one
    rank's K, V chunk while every rank sends: NIC on the leaf, NIC / 2 across the spine, plus
    base 14 us + one network step 4 us (module docstring)."""
    from autoparallel.cost.context import cp_groups

    lay = LayoutTable.from_layouts(
        [Layout(dp=4, tp=1, cp=16, cp_comm="a2a+ring", cp_a2a=8), Layout(dp=4, tp=1, cp=16)],
        64, 32)
    S = 64 * 2**20
    hops = {}
    for net in ("roce-2to1", "roce-2to1-spread"):
        p = make_problem("llama3-8b", "h100", 64, 131072, 64, network=net)
        g = cp_groups(lay, sizes(p))
        assert list(g["a2a"].size) == [8.0, 1.0] and list(g["ring"].size) == [2.0, 16.0]
        assert g["a2a"].units(0)[0] == 1  # inside one NVLink domain
        hops[net] = collective_time(p, Collective.P2P, S, g["ring"])
    assert hops["roce-2to1"][0] == pytest.approx(18e-6 + S / NIC, rel=1e-6)
    assert hops["roce-2to1-spread"][0] == pytest.approx(18e-6 + S / (NIC / 2), rel=1e-6)
    # the plain ring of 16 (stride 1) leaves each node from one of its 8 ranks only: one sender
    # per node shares the 2:1 uplinks of 8 GPUs, so it keeps the whole NIC, NIC / max(1, 2 / 8)
    assert hops["roce-2to1-spread"][1] == pytest.approx(18e-6 + S / NIC, rel=1e-6)
    # end to end: the CP item grows on the spread spine, and a CP group inside one node does not
    # notice the network at all
    def cp_s(layout, net):
        p = make_problem("llama3-8b", "h100", 64, 131072, 64, network=net)
        return estimate(p, layout)["time_s"]["cp_comm"]

    across = Layout(dp=4, tp=1, cp=16, cp_comm="a2a+ring", cp_a2a=8, recompute="full")
    inside = Layout(dp=8, tp=1, cp=8, cp_comm="a2a", recompute="full")
    assert cp_s(across, "roce-2to1-spread") > cp_s(across, "roce-2to1")
    assert cp_s(inside, "roce-2to1-spread") == cp_s(inside, "roce-2to1") > 0
