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

import numpy as np

from ..specs.network import TierSpec
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
    spread: bool = False
    """A job's nodes are spread over this tier's units (`TierSpec.placement`)."""


TWO_LEVELS = (TierSpec(name="nvlink"), TierSpec(name="network"))
"""The default network: the GPU's scale-up domain and one flat network of its NICs."""


def _given(value, default):
    return default if value is None else value


_LAST_TIERS: list = [(None, ())]
"""(problem, its tiers) of the last call: a ledger asks for the same problem's tiers once per
collective it prices (hundreds of times per block of rows); specs are frozen, so the same object
has the same tiers."""


def tiers(problem: Problem) -> tuple[Tier, ...]:
    """The tiers of `problem`'s cluster, inside out: the scale-up domain, then the network's
    layers (`ClusterSpec.network`; None: `TWO_LEVELS`). What a tier leaves out is the GPU's and
    the profile's; `--intra-gbps` / `--inter-gbps` and the latency overrides replace the
    scale-up tier's and every network tier's value."""
    seen, out = _LAST_TIERS[0]  # one read: (problem, tiers) stay a pair across threads
    if seen is problem:
        return out
    out = _tiers(problem)
    _LAST_TIERS[0] = (problem, out)
    return out


def _tiers(problem: Problem) -> tuple[Tier, ...]:
    c, prof, gpu = problem.cluster, problem.profile, problem.cluster.gpu
    first, *rest = c.network.tiers if c.network is not None else TWO_LEVELS
    mesh = gpu.scaleup_fabric == "mesh"
    reduction = _given(first.reduction, "nvls" if gpu.nvls and not mesh else "none")
    intra = c.intra_bytes_per_s if c.intra_gb_per_s is not None or first.gb_per_s is None \
        else first.gb_per_s * 1e9
    out = [Tier(
        name=first.name, size=float(c.nvlink_domain),
        bw=intra * _given(first.efficiency, prof.scaleup_efficiency),
        hop=_hop(c.intra_latency_us, first.latency_us, prof.latency_intra_hop_us),
        reduction=reduction, mesh_links=max(gpu.scaleup_domain - 1, 1) if mesh else 0,
        nvls_bw=intra * prof.nvls_allreduce_factor if reduction == "nvls" else 0.0)]
    for t in rest:
        bw = c.inter_bytes_per_s if c.inter_gb_per_s is not None or t.gb_per_s is None \
            else t.gb_per_s * 1e9
        out.append(Tier(
            name=t.name, size=float(_given(t.size, float("inf"))),
            bw=bw * _given(t.efficiency, prof.nic_efficiency),
            hop=_hop(c.inter_latency_us, t.latency_us, prof.latency_inter_hop_us),
            oversubscription=t.oversubscription, reduction=_given(t.reduction, "none"),
            spread=t.placement == "spread"))
    return tuple(out)


def _hop(override, tier_value, default) -> float:
    """Per-step latency in seconds: the job's override, else the tier's, else the profile's."""
    for v in (override, tier_value, default):
        if v is not None:
            return float(v) * US
    return 0.0


def sizes(problem: Problem) -> tuple[float, ...]:
    """Unit sizes for placement (`placement.group`) of every tier but the last (which holds the
    whole job). Where a job's nodes are spread over a tier's units, the units below it hold one
    unit of the tier below them each, as far as the job is concerned: every hop crosses."""
    tl = tiers(problem)
    eff = [t.size for t in tl[:-1]]
    for i in range(2, len(tl)):
        if tl[i].spread:
            eff[i - 1] = eff[i - 2]
    return tuple(eff)


TIER_GROUPS = {"tp": "TP", "cp": "CP", "dpcp": "DP", "etp": "expert TP", "ep": "EP",
               "edp": "expert DP", "pp": "PP"}
"""Group kinds of `placement.layout_groups` and how outputs name them."""


def outermost_tier(grp) -> np.ndarray:
    """Index of the outermost tier each row's group crosses (0: inside one scale-up domain)."""
    out = np.zeros_like(np.asarray(grp.size, dtype=np.float64), dtype=np.int64)
    for i in range(1, len(grp.per_tier) + 1):
        out = np.where(grp.units(i - 1) > 1, i, out)
    return out


def crossings(problem: Problem, t) -> dict[str, np.ndarray]:
    """For a `LayoutTable` `t`: per group kind (`TIER_GROUPS`), the name of the outermost tier
    its ranks cross, per row ('' where the group has one rank)."""
    from ..placement import layout_groups

    names = np.array([x.name for x in tiers(problem)], dtype=object)
    out = {}
    for kind, grp in layout_groups(t, sizes(problem)).items():
        idx = outermost_tier(grp)
        out[kind] = np.where(np.asarray(grp.size) > 1, names[idx], "")
    return out
