"""Every item of the time and memory ledgers against a derivation written out from its source
(`tests/ledger_hand.py`), each on a layout where its axis is > 1: CP, EP, PP x VP, ZeRO with
CP > 1, TP with and without SP, full recompute, tied embeddings. One 8-GPU H100 node, so that
every collective is a ring inside one NVLink domain; multi-node groups are tested for structure.
Tolerance: 1e-9 relative (the derivations are exact arithmetic of the same formulas)."""

import pytest

from autoparallel import Layout, LayoutTable, ModelSpec, estimate, make_problem
from ledger_hand import GiB, Dims, Hand, Lay

DENSE = Dims(L=8, h=2048, a=16, g=4, d=128, f=5632, V=32000)
TIED = Dims(L=8, h=2048, a=16, g=4, d=128, f=5632, V=32000, tied=True)
MOE = Dims(L=4, h=1024, a=8, g=8, d=128, f=2816, V=32000, E=8, k=2, fe=1408, n_shared=1,
           n_dense=1)
REL = 1e-9


def spec(m: Dims) -> ModelSpec:
    moe = None
    if m.E:
        moe = {"n_experts": m.E, "top_k": m.k, "expert_ffn_hidden_size": m.fe,
               "n_shared_experts": m.n_shared, "n_dense_layers": m.n_dense}
    return ModelSpec(name="toy", n_layers=m.L, hidden_size=m.h, n_heads=m.a, n_kv_heads=m.g,
                     head_dim=m.d, ffn_hidden_size=m.f, vocab_size=m.V,
                     activation="swiglu" if m.swiglu else "gelu", tied_embeddings=m.tied, moe=moe)


def run(m: Dims, x: Lay, seq=4096, gb=16, **job):
    """(estimate record, hand model) of layout `x` on one 8-GPU H100 node."""
    p = make_problem(spec(m), "h100", 8, seq_len=seq, global_batch=gb, **job)
    lay = Layout(dp=x.dp, tp=x.tp, pp=x.pp, vp=x.vp, cp=x.cp, ep=x.ep, zero=x.zero,
                 recompute={0: "none", 2: "full"}[x.rc], sp=x.sp, micro_batch=x.mb,
                 cp_comm=x.cc if x.cp > 1 else None,
                 cp_a2a=x.cu if x.cc == "a2a+ring" else None)
    return estimate(p, lay), Hand(p, m)


def stage_of(rec) -> str:
    pp = rec["layout"]["pp"]
    return "first" if pp == 1 else ("first", "middle", "last")[
        [e["stage"] for e in rec["memory_gib"]["by_stage"]].index(
            max(rec["memory_gib"]["by_stage"], key=lambda e: e["allocated"])["stage"])]


# ------------------------------------------------------------------------------ compute

@pytest.mark.parametrize("x", [
    Lay(dp=2, tp=2, cp=2, sp=True),   # CP > 1: tokens b s / c, attention / (t c)
    Lay(dp=8),                        # no model parallelism
    Lay(dp=2, tp=4, sp=True, mb=2),   # TP 4 > g / ... KV over min(t, g) = 4
])
def test_compute_is_every_kernel_of_every_micro_batch(x):
    rec, H = run(DENSE, x)
    fwd, bwd = H.stage_fwd_bwd(x, "first")
    m = H.micro_batches(x)
    assert rec["layout"]["grad_accum"] == m
    assert rec["time_s"]["compute"] == pytest.approx(m * (fwd + bwd), rel=REL)


def test_compute_of_the_pacing_stage_with_pp_and_vp():
    # pp 2 x vp 2: the last stage adds the logits GEMM and the loss and paces the step
    x = Lay(dp=2, tp=2, pp=2, vp=2, sp=True)
    rec, H = run(DENSE, x)
    fwd, bwd = H.stage_fwd_bwd(x, "last")
    first = H.stage_fwd_bwd(x, "first")
    assert fwd > first[0]
    assert rec["time_s"]["compute"] == pytest.approx(H.micro_batches(x) * (fwd + bwd), rel=REL)


def test_moe_compute_and_ep_all_to_alls():
    # ep 4 over dp 4, tp 2: fp32 router, grouped expert GEMMs over k T x imbalance / (E / ep)
    # tokens each, and per MoE layer the dispatcher's all-to-alls of the k T / t routed copies
    # inside the node: 2h-byte dispatch and combine plus 4-byte probabilities forward, the two
    # 2h-byte ones backward; host time per MoE layer and micro-batch (dropless, no CUDA graphs)
    x = Lay(dp=4, tp=2, ep=4, sp=True, zero=1)
    rec, H = run(MOE, x, tp_comm_overlap=False)
    m = H.micro_batches(x)
    fwd, bwd = H.stage_fwd_bwd(x, "first")
    assert rec["time_s"]["compute"] == pytest.approx(m * (fwd + bwd), rel=REL)
    nd, nm = H.stage_layers(x, "first")
    assert (nd, nm) == (1, 3)
    assert rec["time_s"]["ep_comm"] == pytest.approx(m * nm * H.ep_layer(x), rel=REL)
    assert rec["time_s"]["host"] == pytest.approx(m * nm * H.host_layer(), rel=REL)
    # by hand: 3 of 4 quarters leave over 0.82 x 450 GB/s, 3 NVLink steps per all-to-all;
    # k T / t = 2 x 4096 / 2 = 4096 copies of 2h = 2048 bytes (dispatch, combine) or 4 (probs)
    copies = 2 * 4096 / 2
    lat = (14 + 3 * 1.9) * 1e-6
    big = lat + 3 / 4 * copies * 2 * 1024 / (0.82 * 450e9)
    probs = lat + 3 / 4 * copies * 4 / (0.82 * 450e9)
    assert rec["time_s"]["ep_comm"] == pytest.approx(m * 3 * (2 * big + probs + 2 * big), rel=REL)


def test_recompute_is_one_more_forward_of_the_layers():
    # full recompute re-runs each layer's forward (not the logits), and its TP collectives
    x = Lay(dp=4, tp=2, rc=2, sp=True)
    rec, H = run(DENSE, x, tp_comm_overlap=False)
    m = H.micro_batches(x)
    assert rec["time_s"]["recompute"] == pytest.approx(m * DENSE.L * H.layer_forward(x), rel=REL)
    assert rec["time_s"]["tp_comm"] == pytest.approx(m * DENSE.L * 3 * H.tp_fwd_layer(x), rel=REL)


def test_selective_recompute_reruns_core_attention():
    x = Lay(dp=4, tp=2, sp=True)
    p = make_problem(spec(DENSE), "h100", 8, seq_len=4096, global_batch=16)
    rec = estimate(p, Layout(dp=4, tp=2, sp=True, recompute="selective"))
    H = Hand(p, DENSE)
    assert rec["time_s"]["recompute"] == pytest.approx(
        H.micro_batches(x) * DENSE.L * H.layer_attention(x), rel=REL)


# ------------------------------------------------------------------------------ TP

@pytest.mark.parametrize("x", [Lay(dp=4, tp=2, sp=True), Lay(dp=2, tp=4, sp=True),
                               Lay(dp=4, tp=2, sp=False), Lay(dp=2, tp=4, sp=False)])
def test_tp_collectives_exposed(x):
    rec, H = run(DENSE, x, tp_comm_overlap=False)
    m = H.micro_batches(x)
    # 2 layers' worth of (AG + RS) or AR forward, the same backward
    assert rec["time_s"]["tp_comm"] == pytest.approx(m * DENSE.L * 2 * H.tp_fwd_layer(x), rel=REL)
    # by hand for tp 2 with SP: AG and RS of S = 2 T h, 1 step and half of S each, 4 per layer
    if x.tp == 2 and x.sp:
        S = 2 * 4096 * 2048
        one = (14 + 1.9) * 1e-6 + 0.5 * S / (0.82 * 450e9)
        assert rec["time_s"]["tp_comm"] == pytest.approx(m * 8 * 2 * 4 * one, rel=REL)


def test_tp_overlap_hides_behind_the_layer_gemms():
    # Transformer Engine userbuffers: forward collectives behind the forward GEMMs, backward
    # behind 2x; a short sequence makes the collectives longer than some GEMM windows
    for seq in (4096, 512):
        x = Lay(dp=2, tp=4, sp=True)
        rec, H = run(DENSE, x, seq=seq, tp_comm_overlap=True)
        comm, gemm = H.tp_fwd_layer(x), H.layer_gemms(x)
        per_layer = H.hidden(comm, gemm) + H.hidden(comm, 2 * gemm)
        assert rec["time_s"]["tp_comm"] == pytest.approx(
            H.micro_batches(x) * DENSE.L * per_layer, rel=REL)


def test_moe_layer_tp_traffic_is_the_k_routed_copies():
    # Megatron-Core MoEAlltoAllTokenDispatcher (token_dispatcher.py): A2A(EP) -> AG(TP) before the
    # experts, RS(TP) -> A2A(EP) after: the MoE MLP's TP pair moves k T h, not T h; the shared
    # expert keeps a dense MLP's pair; the dense first layer two dense pairs
    x = Lay(dp=4, tp=2, ep=4, sp=True)
    rec, H = run(MOE, x, tp_comm_overlap=False)
    T, h, k = 4096, 1024, 2
    one = lambda S: 2 * ((14 + 1.9) * 1e-6 + 0.5 * S / (0.82 * 450e9))  # noqa: E731 AG + RS, tp 2
    S = 2 * T * h
    dense_layer, moe_layer = 2 * one(S), one(S) + one(k * S) + one(S)
    m = H.micro_batches(x)
    assert rec["time_s"]["tp_comm"] == pytest.approx(
        m * 2 * (dense_layer + 3 * moe_layer), rel=REL)


# ------------------------------------------------------------------------------ CP

@pytest.mark.parametrize("seq", [8192, 1024])
def test_cp_ring_hops(seq):
    # cp 2 and cp 4 inside the node; at 1024 tokens the hops outrun their attention blocks
    for x in (Lay(dp=2, tp=2, cp=2, sp=True), Lay(dp=1, tp=2, cp=4, sp=True)):
        rec, H = run(DENSE, x, seq=seq)
        assert rec["time_s"]["cp_comm"] == pytest.approx(
            H.micro_batches(x) * DENSE.L * H.cp_layer(x), rel=REL)
    # by hand, cp 4 at 1024 tokens: 3 hops of the K, V chunk (256 tokens x 4 k_v / min(t, g)
    # bytes)
    x = Lay(dp=1, tp=2, cp=4, sp=True)
    if seq == 1024:
        step = (14 + 1.9) * 1e-6 + 256 * 4 * 512 / 2 / (0.82 * 450e9)
        attn = H.layer_attention(x)
        assert step > attn / 4  # exposed: the excess counts
        assert H.cp_layer(x) == pytest.approx(
            3 * H.hidden(step, attn / 4) + 3 * H.hidden(2 * step, 2.5 * attn / 4), rel=REL)


# ------------------------------------------------------------------------------ CP forms

CP_FORMS = [
    Lay(dp=2, tp=2, cp=2, sp=True, cc="a2a"),            # heads 8 / 2, KV heads 2 / 2
    Lay(dp=2, tp=1, cp=4, cc="a2a"),                     # heads 16 / 4, KV heads 4 / 4
    Lay(dp=2, tp=2, cp=2, sp=True, cc="a2a", rc=2),      # the recomputed forward's a2a again
    Lay(dp=1, tp=2, cp=4, sp=True, cc="allgather"),
    Lay(dp=2, tp=1, cp=4, cc="allgather", rc=2),
    Lay(dp=1, tp=1, cp=8, cc="a2a+ring", cu=2),          # a2a over 2, ring over 4
    Lay(dp=1, tp=2, cp=4, sp=True, cc="a2a+ring", cu=2),  # a2a over 2, ring over 2
    Lay(dp=1, tp=1, cp=8, cc="ring"),                    # ring of 8: 8 forward buffers
]


@pytest.mark.parametrize("seq", [8192, 1024])
@pytest.mark.parametrize("x", CP_FORMS)
def test_cp_forms_time_and_buffers(x, seq):
    # every form inside the node, at a long and a short sequence (at 1024 the ring hops and
    # the torch-style all-gather outrun their blocks); buffers: the overhead item's CP term
    # beside the fixed GEMM workspaces (64 MiB, `test_overhead_transients_by_hand`)
    rec, H = run(DENSE, x, seq=seq)
    assert rec["layout"]["cp_comm"] == x.cc
    assert rec["layout"]["cp_a2a"] == (x.cu if x.cc == "a2a+ring" else None)
    assert rec["time_s"]["cp_comm"] == pytest.approx(
        H.micro_batches(x) * DENSE.L * H.cp_layer(x), rel=REL)
    if x.rc == 0:
        assert rec["memory_gib"]["overhead"] * GiB == pytest.approx(
            64 * 2 ** 20 + H.cp_buffers(x), rel=REL)


def test_cp_a2a_by_hand():
    # tp 2, cp 2, seq 4096: T = 2048 tokens per rank; per token of a TP rank Q 2 x 2048 / 2,
    # K and V 2 x 512 / 2 each, output 2 x 2048 / 2 bytes; four all-to-alls over 2 ranks (half
    # of each leaves, one NVLink step), forward and backward, exposed; 16 micro-batches of 8
    # layers
    x = Lay(dp=2, tp=2, cp=2, sp=True, cc="a2a")
    rec, H = run(DENSE, x)
    T = 2048
    one = sum((14 + 1.9) * 1e-6 + 0.5 * T * w / (0.82 * 450e9) for w in (2048, 512, 512, 2048))
    assert rec["time_s"]["cp_comm"] == pytest.approx(H.micro_batches(x) * 8 * 2 * one, rel=REL)
    # GQA: the ring would move only K, V (1024 bytes a token) once, the a2a 5120 bytes
    ring, _ = run(DENSE, Lay(dp=2, tp=2, cp=2, sp=True))
    assert ring["time_s"]["cp_comm"] < rec["time_s"]["cp_comm"]
    # buffers: twice the rank's Q, K, V: 2 x 2048 x (2048 + 512 + 512)
    assert H.cp_buffers(x) == 2 * T * 3072


def test_cp_allgather_by_hand():
    # tp 2, cp 4, seq 4096: T = 1024; K and V all-gathered (4 T x 512 bytes out each, 3 of 4
    # quarters arrive, 3 steps), again backward with the reduce-scatters of dK, dV; exposed
    x = Lay(dp=1, tp=2, cp=4, sp=True, cc="allgather")
    rec, H = run(DENSE, x)
    one = (14 + 3 * 1.9) * 1e-6 + 0.75 * 4 * 1024 * 512 / (0.82 * 450e9)
    assert rec["time_s"]["cp_comm"] == pytest.approx(
        H.micro_batches(x) * 8 * (2 * one + 4 * one), rel=REL)
    # the gathered K, V twice over: 2 x 4 x 1024 x (512 + 512)
    assert H.cp_buffers(x) == 2 * 4 * 1024 * 1024


def test_cp_allgather_hides_behind_the_first_block_where_the_stack_issues_it_there():
    # TorchTitan (PyTorch's _AllGatherRotater): the all-gather is issued with the local block
    x = Lay(dp=1, tp=2, cp=4, sp=True, cc="allgather", zero=1)
    for seq in (8192, 1024):
        rec, H = run(DENSE, x, seq=seq, stack="torchtitan")
        assert rec["time_s"]["cp_comm"] == pytest.approx(
            H.micro_batches(x) * 8 * H.cp_layer(x, allgather_overlap=True), rel=REL)
        assert H.cp_layer(x, allgather_overlap=True) < H.cp_layer(x)


def test_cp_a2a_heads_rule_and_kv_replication():
    # TE: the KV heads of a TP rank (4 / 2 = 2) must divide by the a2a group (4): refused with
    # the reason; a2a+ring with groups of 2 runs; DeepSpeed replicates KV heads up to the group
    from autoparallel.errors import SpecError

    with pytest.raises(SpecError, match="2 KV heads must divide by 4"):
        run(DENSE, Lay(dp=1, tp=2, cp=4, sp=True, cc="a2a"))
    rec, _ = run(DENSE, Lay(dp=1, tp=2, cp=4, sp=True, cc="a2a+ring", cu=2))
    assert rec["layout"]["cp_a2a"] == 2
    x = Lay(dp=1, tp=1, cp=8, cc="a2a", zero=1)
    with pytest.raises(SpecError, match="4 KV heads must divide by 8"):
        run(DENSE, x)
    rec, H = run(DENSE, x, stack="deepspeed")
    # K and V replicated from 4 to 8 heads before the all-to-all: 2 x 8 x 128 bytes a token
    T = 512
    b = H.cp_bytes(x)
    one = sum(H.all_to_all(T * w, 8) for w in (b["q"], 2 * b["k"], 2 * b["v"], b["o"]))
    assert b["k"] == 2 * 4 * 128 and b["q"] == 2 * 16 * 128
    assert rec["time_s"]["cp_comm"] == pytest.approx(H.micro_batches(x) * 8 * 2 * one, rel=REL)


def test_cp_a2a_needs_the_query_heads_too():
    # 12 query heads over 4 KV heads, DeepSpeed (KV heads replicated up to the group): cp 8 as
    # a2a keeps the KV rule (8 a multiple of 4) but 12 query heads do not split 8 ways; cp 4 does
    from autoparallel.errors import SpecError

    twelve = Dims(L=8, h=1536, a=12, g=4, d=128, f=4096, V=32000)
    with pytest.raises(SpecError, match="12 query heads and 4 KV heads must divide by 8"):
        run(twelve, Lay(dp=1, cp=8, cc="a2a"), stack="deepspeed")
    rec, H = run(twelve, Lay(dp=2, cp=4, cc="a2a", zero=1), stack="deepspeed")
    assert rec["time_s"]["cp_comm"] == pytest.approx(
        H.micro_batches(Lay(dp=2, cp=4)) * 8 * H.cp_layer(Lay(dp=2, cp=4, cc="a2a")), rel=REL)


def test_cp_sliding_windows_only_with_a2a_and_allgather():
    # Transformer Engine runs sliding-window attention under CP with a2a and all_gather only
    # (attn_forward_func_with_cp), so the ring forms are refused for a windowed model
    from autoparallel.errors import SpecError

    windowed = spec(DENSE).model_copy(update={"sliding_window": 1024})
    p = make_problem(windowed, "h100", 8, seq_len=4096, global_batch=16)
    for form, a2a in (("ring", None), ("a2a+ring", 2)):
        with pytest.raises(SpecError, match="sliding-window"):
            estimate(p, Layout(dp=2, cp=4, cp_comm=form, cp_a2a=a2a))
    for form in ("a2a", "allgather"):
        assert estimate(p, Layout(dp=2, cp=4, cp_comm=form))["layout"]["cp_comm"] == form
    # a window as long as the sequence is no window
    whole = make_problem(spec(DENSE).model_copy(update={"sliding_window": 4096}), "h100", 8,
                         seq_len=4096, global_batch=16)
    assert estimate(whole, Layout(dp=2, cp=4))["layout"]["cp_comm"] == "ring"


def test_cp_hierarchy_places_the_a2a_in_the_node_and_the_ring_across():
    # 16 GPUs, 8 per node, cp 16 as a2a 8 x ring 2: the all-to-all group is the 8 GPUs of a
    # node (stride tp = 1), the ring's 2 ranks are 8 apart, one per node
    import numpy as np

    from autoparallel.cost.context import cp_groups

    p = make_problem(spec(DENSE), "h100", 16, seq_len=32768, global_batch=16)
    t = LayoutTable.from_layouts([Layout(cp=16, cp_comm="a2a+ring", cp_a2a=8)], 16, 8)
    g = cp_groups(t, p.cluster.nvlink_domain)
    assert (g["a2a"].size[0], g["a2a"].nodes[0]) == (8, 1)
    assert (g["ring"].size[0], g["ring"].per_node[0], g["ring"].nodes[0]) == (2, 1, 2)
    assert np.all(g["all"].nodes == 2)


# ------------------------------------------------------------------------------ PP

@pytest.mark.parametrize("x", [Lay(dp=2, tp=2, pp=2, sp=True),
                               Lay(dp=2, tp=2, pp=2, vp=2, sp=True),
                               Lay(dp=1, tp=2, pp=4, sp=False)])
def test_pp_sends_on_the_fill_and_drain(x):
    rec, H = run(DENSE, x)
    assert rec["time_s"]["pp_comm"] == pytest.approx(H.pp_item(x), rel=REL)
    # by hand for pp 2 x vp 2 with SP: 2 (4 - 1) = 6 sends of 2 T h / t bytes
    if x.vp == 2:
        S = 2 * 4096 * 2048 / 2
        assert rec["time_s"]["pp_comm"] == pytest.approx(
            6 * ((14 + 1.9) * 1e-6 + S / (0.82 * 450e9)), rel=REL)


def test_tied_embeddings_all_reduce_between_first_and_last_stage():
    # Megatron-Core finalize_model_grads -> _allreduce_word_embedding_grads: after the DP sync
    # the first and last stage all-reduce the shared embedding's main_grad (fp32 here, V/t x h)
    # over their 2-rank embedding group, exposed; pp 1 or untied: nothing
    x = Lay(dp=2, tp=2, pp=2, sp=True)
    tied, H = run(TIED, x)
    untied, _ = run(DENSE, x)
    grad_bytes = 4  # Megatron-Core: fp32 main gradients
    S = grad_bytes * TIED.V * TIED.h / 2
    ar = (14 + 2 * 1.9) * 1e-6 + S / (0.82 * 450e9)  # 2 ranks: 2 steps, 2 (1/2) S
    assert H.all_reduce(S, 2) == pytest.approx(ar, rel=REL)
    assert tied["time_s"]["pp_comm"] == pytest.approx(H.pp_item(x) + ar, rel=REL)
    assert untied["time_s"]["pp_comm"] == pytest.approx(H.pp_item(x), rel=REL)
    flat, _ = run(TIED, Lay(dp=4, tp=2, sp=True))
    assert flat["time_s"]["pp_comm"] == 0.0


@pytest.mark.parametrize("x", [Lay(dp=2, tp=2, pp=2, sp=True),
                               Lay(dp=2, tp=2, pp=2, vp=2, sp=True),
                               Lay(dp=1, tp=2, pp=4, vp=2, sp=True)])
def test_bubble_is_p_minus_1_over_v_of_the_slowest_stage(x):
    # Narayanan et al. 2021: (p - 1)/v micro-batch times of the slowest stage (the last: logits)
    rec, H = run(DENSE, x, gb=32, tp_comm_overlap=False)
    tau = max(H.stage_tau(x, "first"), H.stage_tau(x, "last"))
    assert tau == H.stage_tau(x, "last")
    assert rec["time_s"]["bubble"] == pytest.approx((x.pp - 1) / x.vp * tau, rel=REL)


# ------------------------------------------------------------------------------ DP, optimizer

@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_dp_comm_each_zero_stage_with_cp(zero):
    # ZeRO over DP x CP (Megatron's distributed optimizer group): dp 2 x cp 2 = 4 ranks
    x = Lay(dp=2, tp=2, cp=2, zero=zero, sp=True)
    rec, H = run(DENSE, x)
    assert rec["time_s"]["dp_comm"] == pytest.approx(H.dp_item(x, "first"), rel=REL)


def test_dp_comm_exposed_when_it_outruns_the_backward():
    # a short sequence: the gradient all-reduce outlasts one micro-batch's backward
    x = Lay(dp=4, tp=2, zero=0, sp=True)
    rec, H = run(DENSE, x, seq=256, gb=16)
    fwd, bwd = H.stage_fwd_bwd(x, "first")
    psi = H.stage_params(x, "first")[0]
    assert H.all_reduce(4 * psi, 4) > bwd
    assert rec["time_s"]["dp_comm"] == pytest.approx(H.dp_item(x, "first"), rel=REL)


def test_dp_comm_of_experts_over_the_expert_data_parallel_group():
    # MoE, ep 2 of dp 4: dense weights over 4 ranks, experts over 4 / 2 = 2
    x = Lay(dp=4, tp=2, ep=2, zero=1, sp=True)
    rec, H = run(MOE, x)
    assert rec["time_s"]["dp_comm"] == pytest.approx(H.dp_item(x, "first"), rel=REL)


@pytest.mark.parametrize("x", [Lay(dp=2, tp=2, cp=2, zero=1, sp=True),
                               Lay(dp=2, tp=2, cp=2, zero=0, sp=True),
                               Lay(dp=4, tp=2, ep=2, zero=1, sp=True)])
def test_optimizer_streams_the_local_shard(x):
    model = MOE if x.ep > 1 else DENSE
    rec, H = run(model, x)
    assert rec["time_s"]["optimizer"] == pytest.approx(H.optimizer_item(x, "first"), rel=REL)
    # by hand for ZeRO-1 over dp 2 x cp 2: the shard is the rank's weights / 4
    if x.cp == 2 and x.zero == 1:
        dense, _ = H.stage_params(x, "first")
        expected = dense / 4 * (26 + 4) / (0.85 * 3.35e12) + H.prof.step_overhead_ms / 1e3
        assert rec["time_s"]["optimizer"] == pytest.approx(expected, rel=REL)


def test_bf16_moments_stream_half_the_optimizer_bytes():
    # --optimizer-dtype bf16 (bf16 weights stepped in place, bf16 m and v: 2 + 2 + 2 read and
    # written = 12 bytes, + the 4-byte fp32 gradient read) against the fp32 master's 26 + 4
    x = Lay(dp=2, tp=2, cp=2, zero=1, sp=True)
    rec, H = run(DENSE, x, optimizer_dtype="bf16")
    assert rec["time_s"]["optimizer"] == pytest.approx(H.optimizer_item(x, "first"), rel=REL)
    dense, _ = H.stage_params(x, "first")
    expected = dense / 4 * (12 + 4) / (0.85 * 3.35e12) + H.prof.step_overhead_ms / 1e3
    assert rec["time_s"]["optimizer"] == pytest.approx(expected, rel=REL)


def test_step_is_the_sum_of_the_items():
    rec, _ = run(DENSE, Lay(dp=2, tp=2, pp=2, vp=2, sp=True))
    ts = rec["time_s"]
    items = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm",
             "bubble", "optimizer", "offload")
    assert ts["step"] == pytest.approx(sum(ts[k] for k in items), rel=1e-12)


# ------------------------------------------------------------------------------ memory

@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_model_states_shard_over_dp_times_cp(zero):
    x = Lay(dp=2, tp=2, cp=2, zero=zero, sp=True)
    rec, H = run(DENSE, x)
    want = H.model_states(x, "first")
    for k in ("params", "grads", "optimizer"):
        assert rec["memory_gib"][k] * GiB == pytest.approx(want[k], rel=REL), k
    # by hand: the rank's weights psi, ZeRO-1 12 psi / 4, ZeRO-2 grads 4 psi / 4, ZeRO-3 2 psi / 4
    psi = H.stage_params(x, "first")[0]
    assert rec["memory_gib"]["optimizer"] * GiB == pytest.approx(
        12 * psi / (4 if zero >= 1 else 1), rel=REL)
    assert rec["memory_gib"]["grads"] * GiB == pytest.approx(
        4 * psi / (4 if zero >= 2 else 1), rel=REL)
    assert rec["memory_gib"]["params"] * GiB == pytest.approx(
        2 * psi / (4 if zero >= 3 else 1), rel=REL)


def test_weights_per_gpu_by_hand():
    # tp 2 of the toy: Q, O 2 h q / 2; K, V 2 h k_v / 2; MLP 3 h f / 2; norms 2h; embedding
    # V h / 2; output layer V h / 2 and the final norm h (pp 1: all on one GPU)
    x = Lay(dp=4, tp=2, zero=0, sp=True)
    rec, H = run(DENSE, x, grad_dtype="bf16")
    h, q, kv, f, V = 2048, 2048, 512, 5632, 32000
    layer = (2 * h * q + 2 * h * kv + 3 * h * f) / 2 + 2 * h
    psi = 8 * layer + V * h / 2 + V * h / 2 + h
    assert H.stage_params(x, "first")[0] == pytest.approx(psi, rel=1e-12)
    assert rec["memory_gib"]["model_states"] * GiB == pytest.approx(16 * psi, rel=REL)


def test_expert_states_shard_over_ep_and_expert_data_parallel():
    for zero in (0, 1, 2, 3):
        x = Lay(dp=4, tp=2, ep=2, zero=zero, sp=True)
        rec, H = run(MOE, x)
        want = H.model_states(x, "first")
        for k in ("params", "grads", "optimizer"):
            assert rec["memory_gib"][k] * GiB == pytest.approx(want[k], rel=REL), (zero, k)


@pytest.mark.parametrize("x", [
    Lay(dp=2, tp=2, cp=2, sp=True),
    Lay(dp=4, tp=2, sp=False),
    Lay(dp=2, tp=4, sp=True, mb=2),
    Lay(dp=4, tp=2, sp=True, rc=2),
])
def test_activations_per_layer_korthikanti(x):
    rec, H = run(DENSE, x)
    assert rec["memory_gib"]["activations"] * GiB == pytest.approx(
        H.activations(x, "first"), rel=REL)


def test_moe_activations_hold_the_gathered_expert_input_whole():
    # Mixtral-style MoE at tp 2 with SP: the expert FC1 input 2 h per routed copy is whole on
    # every TP rank (Megatron's dispatcher gathers over expert-TP), not / t
    x = Lay(dp=4, tp=2, ep=4, sp=True)
    rec, H = run(MOE, x)
    assert rec["memory_gib"]["activations"] * GiB == pytest.approx(
        H.activations(x, "first"), rel=REL)
    # against tp 1 (same tokens per GPU): every term halves but the gathered input and the
    # fp32 probability of the k T x imbalance copies of the 3 MoE layers, so tp 2 keeps half of
    # tp 1 plus half of 3 x (2h + 4) k T x imbalance
    one, _ = run(MOE, Lay(dp=8, ep=4))
    T, h, k, imb = 4096, 1024, 2, H.imbalance
    assert rec["memory_gib"]["activations"] * GiB == pytest.approx(
        one["memory_gib"]["activations"] * GiB / 2 + 3 * (2 * h + 4) * k * T * imb / 2, rel=REL)


def test_mixtral_tp8_moe_layer_activation_by_hand():
    # Mixtral 8x7B (h 4096, 32 heads, 8 KV heads of 128, f_e 14336, E 8, top-2, 32 MoE layers),
    # tp 8 with SP, s 4096, b 1, pp 1 (one micro-batch in flight), per MoE layer (reference
    # §3.4-3.5; Megatron's expert-TP gather; docs/moe.md): every term / 8 except, per routed
    # copy (k T x the dropless imbalance of them), the gathered expert FC1 input 2h and its fp32
    # probability: the FC1 input alone is 2 h k T = 64 MiB per layer at balance, of which 56 MiB
    # a / t accounting misses (issue 27 item 6)
    from autoparallel import load_model

    p = make_problem(load_model("mixtral-8x7b"), "h100", 64, seq_len=4096, global_batch=64)
    rec = estimate(p, Layout(dp=8, tp=8, sp=True, ep=1))
    T, h, q, kv, fe, E, k = 4096, 4096, 4096, 1024, 14336, 8, 2
    imb = p.profile.moe_dropless_imbalance
    attn = (4 * h + 4 * q) / 8 + 4 * kv / 8
    moe = (4 * h + 4 * E) / 8 + k * imb * (2 * h + 6 * fe / 8 + 4)
    assert p.stack.activation_factor == 1.0
    assert rec["memory_gib"]["activations"] * GiB == pytest.approx(32 * T * (attn + moe), rel=1e-12)
    assert T * k * 2 * h * (1 - 1 / 8) / 2 ** 20 == 56.0


@pytest.mark.parametrize("x", [Lay(dp=2, tp=2, pp=2, sp=True),
                               Lay(dp=2, tp=2, pp=2, vp=2, sp=True),
                               Lay(dp=1, tp=2, pp=4, vp=2, sp=True)])
def test_every_stage_by_hand(x):
    # per stage: weights (embedding first, output layer last), activations x in-flight
    # micro-batches of the schedule, embedding ids and logits
    rec, H = run(DENSE, x, gb=32)
    stages = {e["stage"]: e for e in rec["memory_gib"]["by_stage"]}
    for name in ("first", "last"):
        e = stages[name]
        states = H.model_states(x, name)
        for k in ("params", "grads", "optimizer"):
            assert e[k] * GiB == pytest.approx(states[k], rel=REL), (name, k)
        assert e["activations"] * GiB == pytest.approx(H.activations(x, name), rel=REL), name
        assert e["embedding_logits"] * GiB == pytest.approx(H.embedding_logits(x, name), rel=REL)
    # interleaved pp 2 vp 2: rank 0 holds 2(p - 1) + (v - 1) p + 1 = 5 chunks = 2.5 stages' worth
    if (x.pp, x.vp) == (2, 2):
        assert H.inflight(x, "first") == 2.5 and H.inflight(x, "last") == 1.5


def test_embedding_logits_by_hand():
    # pp 1, tp 2 with SP: int64 ids 8 T, final-norm output + output-layer input 4 h T / t, fp32
    # logits 4 V T / t
    x = Lay(dp=4, tp=2, sp=True)
    rec, _ = run(DENSE, x)
    T = 4096
    assert rec["memory_gib"]["embedding_logits"] * GiB == pytest.approx(
        8 * T + T * (4 * 2048 / 2 + 4 * 32000 / 2), rel=REL)


def test_overhead_transients_by_hand():
    # fixed: the GEMM workspaces of megatron-core on H100 (PyTorch's cuBLAS workspace, 32 MiB on
    # sm90: CUBLAS_WORKSPACE_CONFIG default ':4096:8', aten CublasHandlePool.cpp; Transformer
    # Engine's cuBLASLt workspace, 32 MiB on Hopper: TE get_cublas_workspace_size_bytes); CP
    # ring: the backward's two double buffers (K V, dK dV), 4 x T (4 k_v) / min(t, g) (cp 2 < 4:
    # more than the forward's c receive buffers); full recompute: one
    # layer re-materialised (its no-recompute activations); ZeRO-3: two gathered bf16 units
    # (largest of a layer, the embedding) less the rank's own 1/d, 2 x 2 x unit x (1 - 1/d)
    x = Lay(dp=2, tp=2, cp=2, sp=True, rc=2, zero=3)
    rec, H = run(DENSE, x)
    T = 4096 / 2
    kv_buffers = 4 * T * 4 * 512 / 2
    assert H.cp_buffers(x) == kv_buffers
    working = H.layer_activations(x, recompute=0)
    layer = H.layer_params(x)[0]
    embed = 32000 * 2048 / 2 * 2  # input embedding + output layer (pp 1: one unit each way)
    gathered = 2 * 2 * max(layer, embed) * (1 - 1 / 4)
    assert rec["memory_gib"]["overhead"] * GiB == pytest.approx(
        64 * 2 ** 20 + kv_buffers + working + gathered, rel=REL)


def test_allocated_is_the_sum_of_the_items():
    rec, _ = run(DENSE, Lay(dp=2, tp=2, cp=2, sp=True))
    mem = rec["memory_gib"]
    items = ("params", "grads", "optimizer", "activations", "embedding_logits", "overhead")
    assert mem["total"] == pytest.approx(sum(mem[k] for k in items), rel=1e-12)


# ------------------------------------------------------------------------------ n_params (seed)

def test_n_params_model_gets_exactly_6n_flops_per_token():
    # the seed's rule: "training on one token takes about 6N operations" (shared/seed, "The time
    # model"); the n_params already holds the output layer, so the logits are not added again
    m = ModelSpec(name="u", n_layers=32, hidden_size=4096, n_heads=32, n_kv_heads=8,
                  ffn_hidden_size=14336, vocab_size=128256, n_params=8.03e9)
    p = make_problem(m, "h100", 8, seq_len=4096, global_batch=64)
    rec = estimate(p, Layout(dp=8))
    assert rec["model_flops_per_step"] == pytest.approx(6 * 8.03e9 * 64 * 4096, rel=1e-12)
    # with attention_flops the causal term 3 s^2 L n_h (d_qk + d_v) per sequence is added
    m2 = m.model_copy(update={"attention_flops": True})
    rec2 = estimate(make_problem(m2, "h100", 8, seq_len=4096, global_batch=64), Layout(dp=8))
    attn = 3 * 4096 ** 2 * 32 * 32 * 256
    assert rec2["model_flops_per_step"] == pytest.approx(
        64 * (6 * 8.03e9 * 4096 + attn), rel=1e-12)


def test_n_params_model_times_6n_of_gemms():
    # the time model's GEMMs of an n_params model multiply through N weights per token: the
    # layers' N - hV (spread in the architecture's proportions) and the logits GEMM's hV
    N = 3.0e9
    dims = Dims(L=8, h=2048, a=16, g=4, d=128, f=5632, V=32000)
    m = spec(dims).model_copy(update={"n_params": N})
    p = make_problem(m, "h100", 8, seq_len=4096, global_batch=16)
    rec = estimate(p, Layout(dp=8, zero=1))
    H = Hand(p, dims)
    h, q, kv, f, V, T = 2048, 2048, 512, 5632, 32000, 4096
    arch_layer = 2 * h * q + 2 * h * kv + 3 * h * f
    share = (N - h * V) / (8 * arch_layer)  # every GEMM width scaled alike
    assert 8 * arch_layer * share + h * V == pytest.approx(N, rel=1e-12)
    gemm = H.gemm(T, share * (q + 2 * kv), h) + H.gemm(T, h, share * q) \
        + H.gemm(T, share * 2 * f, h) + H.gemm(T, h, share * f)
    layer_f = gemm + H.layer_attention(Lay()) + H.layer_elementwise(Lay())
    layer_b = 2 * gemm + 2.5 * H.layer_attention(Lay()) + 2 * H.layer_elementwise(Lay())
    logits = H.logits_forward(Lay())
    expected = 2 * (8 * (layer_f + layer_b) + 3 * logits)  # m = 16 / 8 = 2
    assert rec["time_s"]["compute"] == pytest.approx(expected, rel=REL)


def test_n_params_must_exceed_the_output_layer():
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="must exceed the output layer"):
        spec(DENSE).model_copy(update={"n_params": 1e6}).model_validate(
            spec(DENSE).model_dump() | {"n_params": 1e6})


# ------------------------------------------------------------------------------ KV heads < t

NARROW = Dims(L=8, h=2048, a=16, g=2, d=128, f=5632, V=32000)  # 2 KV heads


def test_kv_heads_replicate_beyond_g_in_weights_hops_and_buffers():
    # tp 4 > g 2: each rank keeps a whole KV head (reference §3.4 GQA caveat): K, V weights
    # 2 h k_v / 2, the CP hop and receive buffers T x 4 k_v / 2, not / 4
    x = Lay(tp=4, cp=2, sp=True, zero=0)
    rec, H = run(NARROW, x, gb=8)
    h, q, kv, f, V = 2048, 2048, 256, 5632, 32000
    layer = 2 * h * q / 4 + 2 * h * kv / 2 + 3 * h * f / 4 + 2 * h
    assert H.layer_params(x)[0] == pytest.approx(layer, rel=1e-12)
    assert rec["memory_gib"]["params"] * GiB == pytest.approx(
        2 * (8 * layer + 2 * V * h / 4 + h), rel=REL)
    assert rec["time_s"]["cp_comm"] == pytest.approx(
        H.micro_batches(x) * 8 * H.cp_layer(x), rel=REL)
    T = 4096 / 2
    assert H.p2p(T * 4 * kv / 2) == pytest.approx(
        (14 + 1.9) * 1e-6 + T * 4 * kv / 2 / (0.82 * 450e9))
    assert rec["memory_gib"]["activations"] * GiB == pytest.approx(
        H.activations(x, "first"), rel=REL)
    assert rec["time_s"]["compute"] == pytest.approx(
        H.micro_batches(x) * sum(H.stage_fwd_bwd(x, "first")), rel=REL)


def test_tied_last_stage_holds_a_copy_of_the_embedding():
    # tied weights with pp > 1: the last stage keeps its own copy of the V h / t output weights
    # (Megatron's `setup_embeddings_and_output_layer`), whose gradient the all-reduce syncs
    x = Lay(dp=2, tp=2, pp=2, sp=True, zero=0)
    rec, H = run(TIED, x, grad_dtype="bf16")
    last = {e["stage"]: e for e in rec["memory_gib"]["by_stage"]}["last"]
    h, q, kv, f, V = 2048, 2048, 512, 5632, 32000
    layer = (2 * h * q + 2 * h * kv + 3 * h * f) / 2 + 2 * h
    assert last["params"] * GiB == pytest.approx(2 * (4 * layer + V * h / 2 + h), rel=REL)
    one, _ = run(TIED, Lay(dp=4, tp=2, sp=True, zero=0), grad_dtype="bf16")
    assert one["memory_gib"]["params"] * GiB == pytest.approx(
        2 * (8 * layer + V * h / 2 + h), rel=REL)


# ------------------------------------------------------------------------------ across nodes

def test_pp_sends_between_nodes_ride_the_nic():
    # 2 nodes, tp 8 x pp 2: the stage neighbours sit on different nodes, so every boundary send
    # crosses the network: no faster than the NIC's line rate (DGX H100: 400 Gb/s per GPU), and
    # not slower than half of it plus 50 us of latency
    p = make_problem(spec(DENSE), "h100", 16, seq_len=4096, global_batch=16)
    rec = estimate(p, Layout(tp=8, pp=2, vp=2, sp=True))
    S = 2 * 4096 * 2048 / 8
    line = 400e9 / 8
    per_send = rec["time_s"]["pp_comm"] / (2 * (2 * 2 - 1))
    assert S / line < per_send < S / (0.5 * line) + 50e-6
    inside = estimate(make_problem(spec(DENSE), "h100", 8, seq_len=4096, global_batch=16),
                      Layout(tp=4, pp=2, vp=2, sp=True))["time_s"]["pp_comm"]
    # the same boundary (tp 4: twice the bytes) inside a node rides NVLink, 450 GB/s per GPU
    assert 2 * S / 450e9 < inside / 6 < 2 * S / (0.5 * 450e9) + 50e-6
    assert inside / 6 < per_send


def test_ep_across_nodes_is_bounded_by_the_nic():
    # ep 16 over 2 nodes of 8: half of what each GPU sends leaves the node; one NIC per GPU
    # carries it (nccl-tests #267), so one all-to-all takes at least (8/16) S / line rate
    moe = Dims(L=4, h=1024, a=8, g=8, d=128, f=2816, V=32000, E=16, k=2, fe=1408, n_dense=0)
    p = make_problem(spec(moe), "h100", 16, seq_len=4096, global_batch=16)
    rec = estimate(p, Layout(dp=16, ep=16))
    S = 2 * 2 * 4096 * 1024
    per_a2a = rec["time_s"]["ep_comm"] / (1 * 4 * 4)  # 1 micro-batch, 4 MoE layers, 4 each
    line = 400e9 / 8
    assert 0.5 * S / line < per_a2a < 0.5 * S / (0.5 * line) + 100e-6
