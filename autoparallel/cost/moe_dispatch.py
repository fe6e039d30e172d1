"""The MoE token dispatcher: the bytes one rank sends per MoE layer and micro-batch, priced on
the groups they cross (`cost.comm.collective_time` on the placement `Group`s).

Megatron-Core's dispatchers (megatron/core/transformer/moe/token_dispatcher.py; MoE README
"Token Dispatching"), with T_r = b s / (cp tp) the tokens one rank routes (`routed_tokens`), k the
experts per token, h the width:

- `alltoall` (`MoEAlltoAllTokenDispatcher`): an all-to-all of the k T_r routed copies over the EP
  group (dispatch), another one back (combine), plus the fp32 routing probabilities; the
  backward runs both again on the gradients. With expert TP, the copies a rank receives are then
  all-gathered over the expert-TP group (`gather_from_sequence_parallel_region` in
  `dispatch_postprocess`) and reduce-scattered after the experts: each expert-TP rank holds
  etp x k T_r tokens, the whole routed input of its expert-TP group.
- `allgather` (`MoEAllGatherTokenDispatcher`): the T_r tokens of every rank of the expert-TP x
  EP group are all-gathered (and the output reduce-scattered); each rank computes the tokens
  routed to its experts. No per-copy traffic: k does not enter the bytes.
- `deepep` / `hybridep` (`MoEFlexTokenDispatcher`, DeepEP's and HybridEP's fused kernels): a
  token bound for several experts of one node crosses the network once and is forwarded over
  NVLink there (DeepEP README, V1 "asymmetric-domain bandwidth forwarding"), so the network share
  of the dispatch falls to the expected number of distinct remote nodes per token over k
  (`node_dedup`; group-limited routing, DeepSeek-V3's 4 of 8 node groups, caps it); the dispatch
  goes in FP8 with a low-precision recipe (DeepEP README: "FP8 dispatching and BF16 combining";
  Megatron MoE README: "50% EP dispatch volume"). Achieved bandwidths match the links' (DeepEP
  README: 153-158 of ~160 GB/s NVLink on H800 intranode, 43-58 GB/s RDMA per 400 Gb/s NIC at
  EP 16-64), which `collective_time` already prices at the link efficiencies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layouts import LayoutTable
from ..placement import Group, group
from ..specs.precision import recipe
from ..specs.problem import Problem
from .arch import Arch
from .comm import Collective, collective_time, nic_seconds
from .network import sizes as tier_sizes

FLEX = ("deepep", "hybridep")
"""Dispatchers that deduplicate the cross-node copies of a token (Megatron's flex dispatcher)."""
PROBS_BYTES = 4.0
"""fp32 routing probability sent with each routed copy (Megatron's `permuted_probs` all-to-all)."""


@dataclass(frozen=True)
class Dispatch:
    """Seconds per MoE layer and micro-batch on one rank."""

    fwd: np.ndarray
    """Forward dispatch and combine over the EP (or expert-TP x EP) group."""
    bwd: np.ndarray
    """Their backward (the gradients go the other way)."""
    etp_fwd: np.ndarray
    """Forward expert-TP all-gather of the received tokens and reduce-scatter of the outputs."""
    etp_bwd: np.ndarray
    """Their backward."""
    nic_fwd: np.ndarray
    """NIC seconds of the forward dispatch and combine (`cost.comm.nic_seconds`; 0 inside one
    scale-up domain): the data-parallel reduction cannot use them while they run."""
    nic_bwd: np.ndarray
    """NIC seconds of their backward."""


def routed_tokens(problem: Problem, t: LayoutTable) -> np.ndarray:
    """Tokens one rank routes per micro-batch: b s / (cp tp). With SP each TP rank holds its
    1/tp of the sequence already; without SP the TP ranks' copies are split before the dispatch
    and gathered after it (DeepSpeed-MoE's tensor slicing, Rajbhandari et al. 2022, arXiv
    2201.05596 §5; Megatron-Core refuses MoE with TP and no SP in training, moe_layer.py), so
    each routes 1/tp of the tokens either way."""
    return t["mb"].astype(np.float64) * problem.training.seq_len / (t["cp"] * t["tp"])


def node_dedup(arch: Arch, grp: Group) -> np.ndarray:
    """Expected network copies of a token with node deduplication over those without: a token's
    k experts, spread uniformly over the N nodes the EP group spans, hit (N - 1)(1 - (1 - 1/N)^k)
    remote nodes on average where plain all-to-all sends k (N - 1)/N remote copies, so the ratio
    is N (1 - (1 - 1/N)^k) / k. Group-limited routing (`MoESpec.n_groups`, `topk_groups`, e.g.
    DeepSeek-V3's 8 groups of which 4, aligned with nodes when N divides them) confines a token to
    M = ceil(topk_groups N / n_groups) nodes: M (1 - (1 - 1/M)^k) / k. 1 inside one node."""
    k = float(arch.top_k)
    nodes = np.maximum(np.asarray(grp.nodes, dtype=np.float64), 1.0)
    reach = nodes
    if arch.n_groups and arch.topk_groups and arch.topk_groups < arch.n_groups:
        aligned = (arch.n_groups % nodes == 0) | (nodes % arch.n_groups == 0)
        limited = np.ceil(arch.topk_groups * nodes / arch.n_groups)
        reach = np.where(aligned, np.minimum(nodes, limited), nodes)
    hit = reach * (1.0 - (1.0 - 1.0 / reach) ** k)
    return np.where(nodes > 1, np.minimum(hit / k, 1.0), 1.0)


def dispatch_time(problem: Problem, arch: Arch, t: LayoutTable, groups: dict) -> Dispatch:
    """The dispatcher's collectives of one MoE layer and micro-batch (module docstring)."""
    tr = problem.training
    h, k = float(arch.hidden), float(arch.top_k)
    T_r = routed_tokens(problem, t)
    etp = t["etp"].astype(np.float64)
    rec = recipe(tr.precision)
    which = tr.moe_dispatcher
    zero = np.zeros(len(t))
    if which == "allgather":
        # every token of the expert-TP x EP block (ranks 0 .. etp x ep - 1 of the expert grid)
        block = group(t["etp"] * t["ep"], np.ones(len(t)), tier_sizes(problem))
        gathered = block.size * T_r * h * 2.0
        one = collective_time(problem, Collective.ALL_GATHER, gathered, block) \
            + collective_time(problem, Collective.REDUCE_SCATTER, gathered, block)
        nic = nic_seconds(problem, Collective.ALL_GATHER, gathered, block) \
            + nic_seconds(problem, Collective.REDUCE_SCATTER, gathered, block)
        return Dispatch(fwd=one, bwd=one, etp_fwd=zero, etp_bwd=zero, nic_fwd=nic, nic_bwd=nic)
    ep = groups["ep"]
    copies = k * T_r
    q_dispatch = rec.element_bytes if (which in FLEX and rec.low) else 2.0
    scale = node_dedup(arch, ep) if which in FLEX else 1.0
    a2a = lambda nbytes: collective_time(problem, Collective.ALL_TO_ALL, nbytes * scale, ep)  # noqa: E731
    nic = lambda nbytes: nic_seconds(problem, Collective.ALL_TO_ALL, nbytes * scale, ep)  # noqa: E731
    combine = a2a(copies * h * 2.0)
    fwd = a2a(copies * h * q_dispatch) + combine + a2a(copies * PROBS_BYTES)
    bwd = 2.0 * combine
    nic_fwd = nic(copies * h * q_dispatch) + nic(copies * h * 2.0) + nic(copies * PROBS_BYTES)
    nic_bwd = 2.0 * nic(copies * h * 2.0)
    received = etp * copies * h * 2.0  # what each expert-TP rank holds after the all-gather
    etp_one = collective_time(problem, Collective.ALL_GATHER, received, groups["etp"]) \
        + collective_time(problem, Collective.REDUCE_SCATTER, received, groups["etp"])
    return Dispatch(fwd=fwd, bwd=bwd, etp_fwd=etp_one, etp_bwd=etp_one, nic_fwd=nic_fwd,
                    nic_bwd=nic_bwd)
