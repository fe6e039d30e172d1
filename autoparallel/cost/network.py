"""The network as the collective model sees it: a nest of tiers, inside out, each with the
effective bandwidth and per-step latency one GPU has on it.

Tier 0 is the GPU's scale-up domain (NVLink / xGMI; `ClusterSpec.nvlink_domain` GPUs, switched
or a point-to-point mesh, with NVLink SHARP where the GPU has it); the tiers above join units of
the tier below through the GPUs' NICs. Without a network spec there are two tiers: the domain
and one flat network of the GPU's NIC bandwidth (no oversubscription), the model's two levels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..specs.problem import Problem
from ..units import US


@dataclass(frozen=True)
class Tier:
    """One tier of the network, as priced (bandwidths effective, bytes/s per GPU, one direction)."""

    name: str
    size: float
    """GPUs in one unit of this tier (the last tier: the whole job, `inf`)."""
    bw: float
    """Effective bandwidth per GPU on this tier's links: the spec times the ring efficiency
    (`Profile.scaleup_efficiency` on the scale-up domain, `Profile.nic_efficiency` on the
    network). On a mesh the sum over the GPU's links."""
    hop: float
    """Latency of one ring step over this tier's links, seconds."""
    oversubscription: float = 1.0
    """Down:up ratio of the switches that join this tier's units from the tier below (1 = full
    bisection): when every GPU of a unit sends across at once, each gets bw / oversubscription."""
    reduction: Literal["none", "nvls", "sharp"] = "none"
    """In-network reduction: NVLink SHARP (NVLS) on the scale-up tier, InfiniBand SHARP (NCCL
    CollNet) on a network tier."""
    mesh_links: int = 0
    """On a point-to-point scale-up mesh, the links per GPU (domain - 1); 0 on a switch."""
    nvls_bw: float = 0.0
    """All-reduce bus bandwidth inside the domain with NVLink SHARP (0 where there is none)."""


def tiers(problem: Problem) -> tuple[Tier, ...]:
    """The tiers of `problem`'s cluster, inside out: the scale-up domain, then the network."""
    c, prof, gpu = problem.cluster, problem.profile, problem.cluster.gpu
    mesh = gpu.scaleup_fabric == "mesh"
    nvls = gpu.nvls and not mesh
    hop_i = (c.intra_latency_us if c.intra_latency_us is not None else prof.latency_intra_hop_us) * US
    hop_n = (c.inter_latency_us if c.inter_latency_us is not None else prof.latency_inter_hop_us) * US
    scaleup = Tier(
        name="scale-up", size=float(c.nvlink_domain), bw=c.intra_bytes_per_s * prof.scaleup_efficiency,
        hop=hop_i, reduction="nvls" if nvls else "none",
        mesh_links=max(gpu.scaleup_domain - 1, 1) if mesh else 0,
        nvls_bw=c.intra_bytes_per_s * prof.nvls_allreduce_factor if nvls else 0.0)
    network = Tier(name="network", size=float("inf"), bw=c.inter_bytes_per_s * prof.nic_efficiency,
                   hop=hop_n)
    return scaleup, network


def sizes(problem: Problem) -> tuple[float, ...]:
    """Unit sizes of every tier but the last (which holds the whole job), for placement."""
    return tuple(t.size for t in tiers(problem)[:-1])
