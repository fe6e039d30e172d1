"""Collective communication time, alpha-beta, priced against the links a group really crosses.

Bandwidth terms (reference §5.1, nccl-tests PERFORMANCE.md): all-reduce moves 2(n-1)/n of the
buffer per rank, all-gather / reduce-scatter (n-1)/n, all-to-all (n-1)/n of what each rank sends.
A group spanning nodes is priced hierarchically (reference §5.4): the intra-node share over the
scale-up link, the inter-node share of each GPU's 1/g shard over its own NIC (rail-optimised,
all g NICs busy in parallel); all-to-all across nodes is limited to one NIC per GPU
(nccl-tests #267). Latency follows NCCL's tuning model (reference §5.2): a base plus a cost per
ring step, intra- or inter-node, or a tree's 2 log2 steps where that is cheaper.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from ..placement import Group
from ..specs.problem import Problem
from ..units import US


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    P2P = "p2p"


def _links(problem: Problem):
    c, prof = problem.cluster, problem.profile
    intra = c.intra_bytes_per_s * prof.scaleup_efficiency
    nvls = c.intra_bytes_per_s * prof.nvls_allreduce_factor if c.gpu.nvls else intra
    inter = c.inter_bytes_per_s * prof.nic_efficiency
    hop_i = (c.intra_latency_us if c.intra_latency_us is not None else prof.latency_intra_hop_us) * US
    hop_n = (c.inter_latency_us if c.inter_latency_us is not None else prof.latency_inter_hop_us) * US
    return intra, nvls, inter, prof.latency_base_us * US, hop_i, hop_n


def collective_time(problem: Problem, op: Collective, nbytes, grp: Group) -> np.ndarray:
    """Seconds for one collective of `nbytes` (the full buffer: all-reduce input, all-gather
    output, reduce-scatter input, all-to-all bytes each rank sends, p2p message) per row."""
    intra, nvls, inter, base, hop_i, hop_n = _links(problem)
    n, g, k = grp.size, grp.per_node, grp.nodes
    S = np.asarray(nbytes, dtype=np.float64)
    single_node = k <= 1
    with np.errstate(divide="ignore", invalid="ignore"):
        if op in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
            phases = 2.0 if op == Collective.ALL_REDUCE else 1.0
            # NVLink SHARP only helps all-reduce, and NCCL selects it above 4 GPUs (ref §6.2).
            bw_i = np.where((op == Collective.ALL_REDUCE) & (g > 4), nvls, intra)
            t_flat = phases * (n - 1) / n * S / bw_i
            t_hier = phases * ((g - 1) / g * S / intra + (k - 1) / k * S / (g * inter))
            bw_time = np.where(single_node, t_flat, t_hier)
            steps = phases * (n - 1)
            inter_steps = phases * (k - 1)
            ring = base + (steps - inter_steps) * hop_i + inter_steps * hop_n
            tree = base + phases * ((g - 1) * hop_i + np.log2(np.maximum(k, 1)) * hop_n)
            lat = np.minimum(ring, tree)
        elif op == Collective.ALL_TO_ALL:
            t_i = (g - 1) / n * S / intra
            t_n = (n - g) / n * S / inter
            bw_time = np.maximum(t_i, t_n)
            lat = base + (g - 1) * hop_i + (n - g) * hop_n
        else:  # P2P: one message to a neighbour, over NVLink inside a node, else the NIC
            bw_time = S / np.where(single_node, intra, inter)
            lat = base + np.where(single_node, hop_i, hop_n)
    return np.where(n > 1, bw_time + lat, 0.0)
