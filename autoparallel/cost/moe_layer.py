"""The feed-forward half of an MoE layer as Megatron-Core runs it (megatron/core/transformer/moe/:
router.py, token_dispatcher.py, experts.py, shared_experts.py), per micro-batch on one rank.

The attention half is the dense layer's (`cost.time`); this module only knows the MoE block, so a
layer of another mixer (a later hybrid Mamba-MoE model) reuses it unchanged. With T the tokens of
a micro-batch on one CP rank (b s / cp), T_r = T / tp the tokens one
rank routes, E experts of which E_l = E / ep are local, k per token, f_e the expert width:

- **router**: the T_r x h x E gating GEMM in fp32 (`--moe-router-dtype fp32`: PyTorch runs it on
  the CUDA cores, `GPUSpec.fp32_tflops`), then the score function, top-k and auxiliary loss over
  the fp32 T_r x E scores: read and written once fused (`--moe-router-fusion`), four times as
  separate kernels (score, top-k, normalisation, loss) [derived from router.py's steps];
- **experts** (`TEGroupedMLP`, one grouped GEMM per projection): each rank holds X = etp k T_r
  routed tokens times the routing's imbalance (`imbalance`), M_e = X / E_l per local expert;
  per projection E_l GEMMs of M_e x (mlp_up f_e / etp) x h and M_e x h x (f_e / etp), each a
  roofline (`compute.linear_time`), plus `Profile.grouped_gemm_expert_us` per expert (each
  group's GEMM ends in its own partial wave of tiles: fine-grained experts, few tokens each,
  run well below the dense efficiency);
- **shared experts** (`SharedExpertMLP`): a TP-sharded MLP over all T tokens, with the
  all-gather / reduce-scatter of a dense MLP under SP;
- **host**: `host_overhead`;
- the token dispatch is `cost.moe_dispatch`; how much of it hides is `exposed_dispatch`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layouts import LayoutTable
from ..specs.problem import Problem
from ..units import TFLOPS, US
from .arch import Arch
from .compute import gemm_time, linear_time, memory_bound_time
from .moe_dispatch import Dispatch, routed_tokens

SCOPED_GRAPH_SHARE = 0.5
"""Share of an MoE layer's host launches left eager with Transformer Engine scoped graphs of the
router and dispatcher preprocessing (`--cuda-graph-scope attn moe_router moe_preprocess`): the
captured router and routing-map kernels are about half of the layer's launches; the dispatch,
grouped MLP and combine stay eager (dynamic shapes) [derived from Megatron's graph scopes]."""
ROUTER_PASSES = {True: 2.0, False: 8.0}
"""Reads + writes of the fp32 T_r x E scores: fused router (one kernel reads the logits and
writes the probabilities) or four separate kernels (score function, top-k, normalisation,
auxiliary loss), each reading and writing them [derived from Megatron's router.py]."""


@dataclass(frozen=True)
class MoEFFN:
    """Forward seconds of the MoE feed-forward block of one layer, one micro-batch, one rank."""

    gemm: np.ndarray
    """Router, routed experts (with the routing's imbalance) and shared experts."""
    shared: np.ndarray
    """The shared experts alone (the window their overlap with the dispatch has)."""
    elem: np.ndarray
    """Router score kernels (memory-bound)."""
    tp: np.ndarray
    """Overlappable TP communication of the block: the shared experts' all-gather and
    reduce-scatter under SP (as a dense MLP's)."""
    host: np.ndarray
    """Exposed host time per micro-batch, forward and backward together (`host_overhead`)."""


def imbalance(problem: Problem) -> float:
    """Tokens of the busiest EP rank over the balanced share (it paces the layer): dropless
    routing with an auxiliary loss `Profile.moe_dropless_imbalance`; forced balance (Megatron
    `--moe-router-force-load-balancing`, the benchmarks' setting) 1; capacity routing the
    capacity factor, every expert padded to its capacity (`--moe-pad-expert-input-to-capacity`)."""
    tr = problem.training
    if tr.moe_routing == "capacity":
        return float(tr.moe_capacity_factor)
    if tr.moe_routing == "balanced":
        return 1.0
    return float(problem.profile.moe_dropless_imbalance)


def dynamic_shapes(problem: Problem) -> bool:
    """Whether the routed token counts reach the host each layer (a device-to-host sync): every
    dispatcher of a dropless model does (`_maybe_dtoh_and_synchronize`); capacity routing pads
    to fixed shapes, and HybridEP with full graphs uses fixed-size buffers (Megatron-Bridge's
    full-iteration DeepSeek-V3 recipes: `moe_expert_rank_capacity_factor`)."""
    tr = problem.training
    return tr.moe_routing != "capacity" and not (
        tr.moe_dispatcher == "hybridep" and tr.cuda_graphs == "full")


def host_overhead(problem: Problem, n: int) -> np.ndarray:
    """Exposed host seconds per MoE layer and micro-batch (forward + backward), `n` rows:
    `Profile.moe_host_overhead_us` with dynamic shapes (the sync keeps the CPU from running
    ahead), times `SCOPED_GRAPH_SHARE` under scoped CUDA graphs, 0 with full graphs (Megatron MoE
    README, "CPU Overhead Bottleneck": CUDA graphs, larger micro-batches); 0 with static shapes,
    where the host runs ahead of the GPU."""
    graphs = problem.training.cuda_graphs
    share = {"none": 1.0, "scoped": SCOPED_GRAPH_SHARE, "full": 0.0}[graphs]
    per = problem.profile.moe_host_overhead_us * US * share if dynamic_shapes(problem) else 0.0
    return np.full(n, per)


def _fp32_gemm(problem: Problem, M, N, K) -> np.ndarray:
    """An fp32 GEMM on the CUDA cores at `GPUSpec.fp32_tflops` x the GEMM efficiency (the BF16
    GEMM where the GPU spec gives no fp32 peak), plus the fixed per-kernel cost."""
    gpu, prof = problem.cluster.gpu, problem.profile
    if gpu.fp32_tflops is None or not problem.stack.moe_router_fp32:
        return gemm_time(problem, M, N, K)
    flops = 2.0 * np.asarray(M, dtype=np.float64) * N * K
    return flops / (prof.gemm_efficiency * gpu.fp32_tflops * TFLOPS) + prof.gemm_overhead_us * US


def routed_rows(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """X = etp k T_r x imbalance: the routed token copies the busiest rank's experts hold, after
    the expert-TP all-gather (module docstring)."""
    return t["etp"].astype(np.float64) * arch.top_k * routed_tokens(problem, t) * imbalance(problem)


def expert_gemms(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Forward seconds of the routed experts' grouped GEMMs on one rank (module docstring)."""
    ep, etp = t["ep"].astype(np.float64), t["etp"].astype(np.float64)
    local = arch.n_experts / ep
    X = routed_rows(problem, arch, t)
    M_e = X / local
    f = arch.expert_ffn / etp
    per_expert = 2.0 * problem.profile.grouped_gemm_expert_us * US * local
    return (linear_time(problem, M_e, arch.mlp_up * f, arch.hidden, local)
            + linear_time(problem, M_e, arch.hidden, f, local) + per_expert)


def moe_ffn(problem: Problem, arch: Arch, t: LayoutTable, tp_fwd_collectives) -> MoEFFN:
    """The MoE block's forward pieces; `tp_fwd_collectives` is one all-gather + reduce-scatter of
    the b s h / cp activation over the TP group (the dense MLP's TP communication, seconds)."""
    h, E = float(arch.hidden), float(arch.n_experts)
    tp = t["tp"].astype(np.float64)
    T = t["mb"].astype(np.float64) * problem.training.seq_len / t["cp"]
    T_r = routed_tokens(problem, t)
    router = _fp32_gemm(problem, T_r, E, h)
    scores = memory_bound_time(problem, ROUTER_PASSES[problem.stack.moe_fused_router] * 4.0 * T_r * E)
    gemm = router + expert_gemms(problem, arch, t)
    shared = np.zeros(len(t))
    tp_comm = np.zeros(len(t))
    if arch.shared_ffn:
        f_s = arch.shared_ffn
        shared = linear_time(problem, T, arch.mlp_up * f_s / tp, h) + linear_time(problem, T, h, f_s / tp)
        tp_comm = np.where(tp > 1, tp_fwd_collectives, 0.0)
    return MoEFFN(gemm=gemm + shared, shared=shared, elem=scores, tp=tp_comm,
                  host=host_overhead(problem, len(t)))


def a2a_overlap_allowed(problem: Problem, t: LayoutTable) -> np.ndarray:
    """Rows where Megatron-Core runs `--overlap-moe-expert-parallel-comm` (TransformerConfig
    checks): EP > 1, the alltoall or flex dispatcher, no full recompute, and with a pipeline an
    interleaved schedule (virtual stages)."""
    tr = problem.training
    if not tr.moe_a2a_overlap or tr.moe_dispatcher == "allgather":
        return np.zeros(len(t), dtype=bool)
    return (t["ep"] > 1) & (t["rc"] != 2) & ((t["pp"] == 1) | (t["vp"] > 1))


def hidden_dispatch(problem: Problem, arch: Arch, t: LayoutTable, d: Dispatch, ffn: MoEFFN,
                    layer_fwd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of one forward (`d.fwd`) and one backward (`d.bwd`) dispatch per MoE layer and
    micro-batch that hide behind compute, by how the stack hides it:

    - DualPipe(V) (schedule codes 4, 5): one micro-batch's all-to-all under another's compute
      (DeepSeek-V3 report §3.2.1), all of it;
    - 1F1B all-to-all overlap (`a2a_overlap_allowed`): Megatron merges the forward of one
      micro-batch with the backward of another and hides each dispatch behind the other's
      layer compute (forward behind 2x `layer_fwd`, backward behind `layer_fwd`); measured:
      Qwen3-30B-A3B on 16 H100, EP 16, 41.25 -> 31.31 s per step with alltoall, 24.71 -> 20.99 s
      with HybridEP (Megatron-Bridge skill `nemo-mbridge-perf-expert-parallel-overlap`);
    - shared-expert overlap (`StackSpec.moe_shared_expert_overlap`, Megatron
      `--moe-shared-expert-overlap`): behind the shared experts (forward 1x, backward 2x);
    - otherwise `Profile.ep_overlap` of it (0 unless a profile says so)."""
    prof = problem.profile
    hid_f, hid_b = prof.ep_overlap * d.fwd, prof.ep_overlap * d.bwd
    if problem.stack.moe_shared_expert_overlap and arch.shared_ffn and \
            problem.training.moe_dispatcher != "allgather":
        hid_f, hid_b = np.minimum(d.fwd, ffn.shared), np.minimum(d.bwd, 2.0 * ffn.shared)
    allowed = a2a_overlap_allowed(problem, t)
    if np.any(allowed):
        hid_f = np.where(allowed, np.minimum(d.fwd, 2.0 * layer_fwd), hid_f)
        hid_b = np.where(allowed, np.minimum(d.bwd, layer_fwd), hid_b)
    if np.any(t["sch"] >= 4):
        hid_f = np.where(t["sch"] >= 4, d.fwd, hid_f)
        hid_b = np.where(t["sch"] >= 4, d.bwd, hid_b)
    return hid_f, hid_b


def exposed_dispatch(problem: Problem, arch: Arch, t: LayoutTable, d: Dispatch, ffn: MoEFFN,
                     layer_fwd: np.ndarray, again) -> tuple[np.ndarray, np.ndarray]:
    """(EP, expert-TP) dispatcher seconds per MoE layer and micro-batch (forward, backward and
    `again` times one more forward for recompute): what does not hide (`hidden_dispatch`) is
    exposed, what hides still slows compute by the SMs it takes (`Profile.overlap_sm_fraction`;
    `cost.overlap`). The expert-TP all-gather / reduce-scatter is exposed in every case (the
    dispatcher runs it on the compute stream before the grouped GEMMs)."""
    sm = problem.profile.overlap_sm_fraction
    hid_f, hid_b = hidden_dispatch(problem, arch, t, d, ffn, layer_fwd)
    fwd = (d.fwd - hid_f) + sm * hid_f
    bwd = (d.bwd - hid_b) + sm * hid_b
    return fwd * (1.0 + again) + bwd, d.etp_fwd * (1.0 + again) + d.etp_bwd


def hidden_dispatch_nic(problem: Problem, arch: Arch, t: LayoutTable, d: Dispatch, ffn: MoEFFN,
                        layer_fwd: np.ndarray, again) -> tuple[np.ndarray, np.ndarray]:
    """NIC seconds of the hidden dispatches per MoE layer and micro-batch, (forward, backward
    with `again` recomputed forwards): exposed dispatches run between compute kernels, hidden
    ones share the NICs with the data-parallel reduction (`cost.time._dp_by_zero`; reference
    §5.6), each in proportion to its hidden share (`hidden_dispatch`)."""
    hid_f, hid_b = hidden_dispatch(problem, arch, t, d, ffn, layer_fwd)
    with np.errstate(divide="ignore", invalid="ignore"):
        share_f = np.where(d.fwd > 0, hid_f / d.fwd, 0.0)
        share_b = np.where(d.bwd > 0, hid_b / d.bwd, 0.0)
    return d.nic_fwd * share_f, d.nic_bwd * share_b + again * d.nic_fwd * share_f
