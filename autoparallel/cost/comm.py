"""Collective communication time, alpha-beta, priced on the network tiers a group spans.

Bandwidth (reference §5.1, nccl-tests PERFORMANCE.md): time = bus factor x bytes / bus
bandwidth + latency, the bus factor 2(n-1)/n for all-reduce and (n-1)/n for all-gather,
reduce-scatter and all-to-all. The algorithm is NCCL's choice, the one its tuning model predicts
fastest (NCCL `src/graph/tuning.cc`), among those NCCL has for the collective:

- **Ring** (every collective). NCCL's multi-node ring pipelines the NVLink and NIC phases over its
  channels, so the slower link sets the pace (reference §5.4; NVIDIA, NVIDIA/nccl #812): bus
  bandwidth = min(the scale-up ring's, r x per-GPU NIC bandwidth) with r the group's ranks per
  domain, because each channel's ring leaves the domain through a different GPU's NIC (DGX A100
  8 x HDR: 192 GB/s = 8 x 24; 4 x 8 B200: 381.8 GB/s, ml-engineering). On further tiers the
  crossings of a unit are spread over the group's ranks in it, and all groups of the kind run at
  once: r_unit x bandwidth / oversubscription.
- **Tree** (all-reduce only: NCCL has no tree for reduce-scatter or all-gather, tuning.cc). A
  double binary tree over the domains: the busiest domain sends min(2, k/2) x the buffer across
  the network for k domains (1 on 2 domains, 1.5 on 3, 2 from 4: NCCL `src/graph/trees.cc`),
  against a ring's 2(n-1)/n, so it beats the network limit on 2 and 3 domains (NVIDIA/nccl-tests
  #196; GB200 NVL8 x 3: tree 485.7 vs ring 393.7 GB/s, NVIDIA/nccl #1801); its NVLink part runs
  no faster than the ring's (tuning.cc caps the tree's bus bandwidth by the ring's intra-node
  channels), or at NVLink SHARP's rate where the domain has it (NVLSTree).
- **NVLS** (all-reduce inside a domain of more than 4 GPUs with NVLink SHARP; reference §6.2) at
  the measured SHARP bus bandwidth; **CollNet** (all-reduce over a network tier with InfiniBand
  SHARP): the switches reduce, each domain sends the buffer once.
- **All-to-all** moves (n-1)/n of each rank's bytes pairwise: the share bound outside each unit
  crosses that tier at the per-GPU rate (every rank sends at once: bandwidth / oversubscription);
  the slowest tier sets the time (one NIC per GPU across nodes, nccl-tests #267).
- **Point-to-point** (PP, CP ring): one message over the outermost tier the hop crosses.

A point-to-point scale-up mesh (MI300X xGMI: one ~64 GB/s link per peer) gives a group of g
GPUs inside the domain g - 1 links, not the full mesh (2 GPUs 47.7 GB/s vs 8 GPUs 312.9 GB/s
all-reduce, ml-engineering network README; ~48 GB/s usable per link, AMD ROCm blog "Understanding
RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X").

Latency follows NCCL's tuning model (reference §5.2): ring = base + steps inside the domain x
the NVLink step + steps across x the network step (2(n-1) steps for all-reduce, n-1 otherwise,
2(k-1) / k-1 of them across); tree = base + 2[(g-1) NVLink steps + log2(k) network steps].
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from ..placement import Group
from ..specs.problem import Problem
from ..units import US
from .network import Tier, tiers


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    P2P = "p2p"


NVLS_MIN_GPUS = 4
"""NVLink SHARP all-reduce is used above this many GPUs of a domain: NCCL selects NVLS from 5
GPUs on H100/H200 (NVIDIA/nccl #1455; ml-engineering network README sweep), and partitions of
at most four GPUs do not benefit from multicast (NVIDIA GB200 NVL Partition User Guide)."""


def _domain_ring(t0: Tier, r0: np.ndarray) -> np.ndarray:
    """Ring bus bandwidth of r0 ranks inside one scale-up domain: the GPU's whole scale-up
    bandwidth on a switch, r0 - 1 of its links on a point-to-point mesh."""
    if t0.mesh_links:
        return t0.bw * np.maximum(r0 - 1.0, 1.0) / t0.mesh_links
    return np.full_like(r0, t0.bw)


def _domain_p2p(t0: Tier) -> float:
    """One message between two GPUs of a domain: the whole scale-up bandwidth on a switch, one
    link on a mesh."""
    return t0.bw / t0.mesh_links if t0.mesh_links else t0.bw


def _crossings(tl: tuple[Tier, ...], grp: Group):
    """Per network tier i >= 1: (crossed, units of tier i-1 spanned, ranks per unit of tier i-1,
    ranks per unit of tier i)."""
    out = []
    for i in range(1, len(tl)):
        below = grp.ranks_in(i - 1)
        k_below = np.ceil(grp.size / below)
        out.append((k_below > 1, k_below, below, grp.ranks_in(i)))
    return out


def _ring_bus(tl, r0, cross, ring0):
    """Ring bus bandwidth: the slowest of the domain's ring and each crossed tier's share."""
    bus = np.where(r0 > 1, ring0, np.inf)
    for t, (crossed, _, below, _) in zip(tl[1:], cross):
        share = np.minimum(r0 * t.bw, below * t.bw / t.oversubscription)
        bus = np.where(crossed, np.minimum(bus, share), bus)
    return bus


def _ring_latency(tl, grp, cross, phases):
    """base + steps x per-step latency of the tier each step crosses (NCCL tuning.cc)."""
    n = grp.size
    k0 = grp.units(0)
    lat = (n - k0) * tl[0].hop
    for t, (_, k_below, _, r_here) in zip(tl[1:], cross):
        lat = lat + (k_below - np.ceil(n / r_here)) * t.hop
    return phases * lat


def _tree_bus(tl, r0, cross, intra, n):
    """Double-binary-tree bus bandwidth (all-reduce): min(NVLink part, each crossed tier's rate
    x 2(n-1)/n / the tree's bytes per unit), the tree over the units of the tier below; from a
    tier with InfiniBand SHARP outwards the switches reduce and each unit sends the buffer once
    (NCCL CollNet)."""
    bus = np.where(r0 > 1, intra, np.inf)
    factor = 2.0 * (n - 1.0) / n
    sharp = np.zeros_like(n, dtype=bool)
    for t, (crossed, k_below, below, _) in zip(tl[1:], cross):
        sharp = sharp | (t.reduction == "sharp")
        rate = np.minimum(r0 * t.bw, below * t.bw / t.oversubscription)
        tree_bytes = np.where(sharp, 1.0, np.minimum(2.0, k_below / 2.0))
        bus = np.where(crossed, np.minimum(bus, factor * rate / tree_bytes), bus)
    return bus


def _tree_latency(tl, grp, r0, cross):
    """base + 2[(ranks per domain - 1) NVLink steps + log2(units) steps per tier] (tuning.cc)."""
    lat = (r0 - 1.0) * tl[0].hop
    for t, (_, k_below, _, r_here) in zip(tl[1:], cross):
        lat = lat + np.log2(np.maximum(k_below / np.ceil(grp.size / r_here), 1.0)) * t.hop
    return 2.0 * lat


def collective_time(problem: Problem, op: Collective, nbytes, grp: Group) -> np.ndarray:
    """Seconds for one collective of `nbytes` (the full buffer: all-reduce input, all-gather
    output, reduce-scatter input, all-to-all bytes each rank sends, p2p message) per row, on the
    group `grp` (from `placement.group` / `layout_groups`), NCCL's algorithm choice applied."""
    return algorithm_times(problem, op, nbytes, grp)["chosen"]


def algorithm_times(problem: Problem, op: Collective, nbytes, grp: Group) -> dict[str, np.ndarray]:
    """Seconds per row of each algorithm NCCL has for `op` (`ring`, and for all-reduce `tree`,
    the double binary tree, NVLSTree or CollNet where the tiers allow), and `chosen`: the
    fastest, NCCL's tuner choice. All-to-all and p2p have one algorithm (`ring` holds it).

    What depends only on the group (latency, bus bandwidth, bus factor) is computed once per
    distinct group (`Group.distinct`); each row then adds its bytes: fixed + factor x S / bus."""
    tl = tiers(problem)
    base = problem.profile.latency_base_us * US
    key, run = grp.distinct()
    n = np.asarray(key.size, dtype=np.float64)
    S = np.asarray(nbytes, dtype=np.float64)
    r0 = key.ranks_in(0)
    t0 = tl[0]
    cross = _crossings(tl, key)
    multi = key.units(0) > 1
    ring0 = _domain_ring(t0, r0)
    live = n > 1
    rows = (lambda x: x) if run is None else (lambda x: x[run])  # noqa: E731
    out: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        if op in (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
            ar = op == Collective.ALL_REDUCE
            phases = 2.0 if ar else 1.0
            factor = phases * (n - 1.0) / n
            nvls = ar and t0.reduction == "nvls"
            nvls_ok = (r0 > NVLS_MIN_GPUS) if nvls else np.zeros_like(r0, dtype=bool)
            # inside one domain an all-reduce of more than 4 GPUs runs NVLS at its measured rate
            ring_bus = np.where(multi | ~nvls_ok, _ring_bus(tl, r0, cross, ring0), t0.nvls_bw)
            ring_fixed = base + _ring_latency(tl, key, cross, phases)
            # a one-rank group costs nothing: fixed 0, factor 0 over bus 1
            factor_row = rows(np.where(live, factor, 0.0))
            ring = (rows(np.where(live, ring_fixed, 0.0)) + factor_row * S
                    / rows(np.where(live, ring_bus, 1.0)))
            out["ring"] = ring
            chosen = ring
            if ar:
                intra = np.where(nvls_ok, t0.nvls_bw, ring0)  # NVLSTree where NVLS applies
                tree_fixed = np.where(multi, base + _tree_latency(tl, key, r0, cross), np.inf)
                tree_bus = _tree_bus(tl, r0, cross, intra, n)
                tree = (rows(np.where(live, tree_fixed, 0.0)) + factor_row * S
                        / rows(np.where(live, tree_bus, 1.0)))
                out["tree"] = tree
                chosen = np.minimum(ring, tree)
        elif op == Collective.ALL_TO_ALL:
            share0 = np.where(r0 > 1, (r0 - 1.0) / n, 0.0)
            bw_time = rows(share0) * S / rows(ring0)
            lat = (r0 - 1.0) * t0.hop
            for t, (crossed, _, below, r_here) in zip(tl[1:], cross):
                share = np.where(crossed, (n - below) / n, 0.0)
                t_i = rows(share) * S / (t.bw / t.oversubscription)
                bw_time = np.maximum(bw_time, t_i)
                lat = lat + (np.minimum(r_here, n) - below) * t.hop
            chosen = out["ring"] = rows(np.where(live, base + lat, 0.0)) + bw_time
        else:  # P2P: one message to a neighbour over the outermost tier the hop crosses
            net = np.full_like(n, np.inf)
            hop = np.full_like(n, t0.hop)
            for t, (crossed, _, below, _) in zip(tl[1:], cross):
                # all ranks send at once (pipeline stages, CP ring): a unit whose ranks all send
                # across shares the tier's uplinks, bw / oversubscription each
                share = t.bw / np.maximum(1.0, t.oversubscription / below)
                net = np.where(crossed, np.minimum(net, share), net)
                hop = np.where(crossed, t.hop, hop)
            fixed = base + hop
            link = np.where(multi, net, _domain_p2p(t0))
            chosen = out["ring"] = rows(np.where(live, fixed, 0.0)) + S / rows(
                np.where(live, link, np.inf))
    return out | {"chosen": chosen}


def bus_bandwidth(problem: Problem, op: Collective, nbytes, grp: Group, algorithm: str = "chosen"):
    """nccl-tests bus bandwidth (bytes/s) of one collective: bus factor x bytes / time
    (PERFORMANCE.md), for `algorithm` (`chosen`, `ring` or `tree`)."""
    n = np.asarray(grp.size, dtype=np.float64)
    factor = {Collective.ALL_REDUCE: 2.0 * (n - 1.0) / n, Collective.P2P: np.ones_like(n)}.get(
        op, (n - 1.0) / n)
    t = algorithm_times(problem, op, nbytes, grp)[algorithm]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(t > 0, factor * np.asarray(nbytes, dtype=np.float64) / t, 0.0)


def nic_seconds(problem: Problem, op: Collective, nbytes, grp: Group) -> np.ndarray:
    """Seconds one collective keeps each GPU's NIC (the first network tier) busy: the bytes a
    rank sends out of its scale-up domain over the NIC's effective rate; 0 where the group stays
    inside one domain. Other traffic on the same NICs waits for this (`cost.time`: the DP
    reduction hides only in the NIC time the EP all-to-alls leave; reference §5.6)."""
    tl = tiers(problem)
    n = np.asarray(grp.size, dtype=np.float64)
    S = np.asarray(nbytes, dtype=np.float64)
    r0 = grp.ranks_in(0)
    if op == Collective.ALL_TO_ALL:
        out_bytes = (n - r0) / n * S
    elif op == Collective.P2P:
        out_bytes = S
    else:  # ring: each rank's share of 2(n-1)/n or (n-1)/n of the buffer leaves over r0 NICs
        phases = 2.0 if op == Collective.ALL_REDUCE else 1.0
        out_bytes = phases * (n - 1.0) / n * S / r0
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((grp.units(0) > 1) & (n > 1), out_bytes / tl[1].bw, 0.0)
