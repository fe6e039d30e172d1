"""`NetworkSpec`: the network as it is built, a list of tiers from the inside out.

Tier 0 is the scale-up domain (NVLink / xGMI); each further tier joins units of the tier below
through the GPUs' NICs: a rail-optimised leaf layer (one scalable unit), a spine, a core, a
second building. Every number a tier leaves out is the GPU's (scale-up domain and bandwidth for
tier 0, NIC bandwidth above) and the efficiency profile's (ring efficiencies and per-step
latencies), so a network preset describes the fabric, not the GPU it carries. Presets:
`autoparallel presets networks`; schema: `autoparallel schema network`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from ..limits import MAX_GPUS
from ._base import Spec


class TierSpec(Spec):
    """One tier: units of `size` GPUs, joined at `gb_per_s` per GPU."""

    name: str
    """What the tier is (nvlink, leaf, spine, core, ...)."""
    size: PositiveInt | None = Field(None, le=MAX_GPUS)
    """GPUs in one unit of this tier, e.g. 256 for a DGX SuperPOD scalable unit under its leaf
    switches. Tier 0: the scale-up domain (default: the GPU's, `ClusterSpec.nvlink_domain`; a
    smaller size partitions it). The last tier holds the whole job and leaves it out."""
    gb_per_s: PositiveFloat | None = None
    """Bandwidth per GPU on this tier's links, GB/s one direction, before efficiency. Default:
    the GPU's scale-up bandwidth (tier 0) or NIC bandwidth (`GPUSpec.nic_gbit_per_s` / 8)."""
    efficiency: float | None = Field(None, gt=0, le=1)
    """Share of `gb_per_s` a ring reaches. Default: the profile's `scaleup_efficiency` (tier 0)
    or `nic_efficiency`."""
    latency_us: NonNegativeFloat | None = None
    """Latency of one collective step over this tier, microseconds. Default: the profile's
    `latency_intra_hop_us` (tier 0) or `latency_inter_hop_us`."""
    oversubscription: float = Field(1.0, ge=1, le=1e6)
    """Down:up bandwidth ratio of the switches that join this tier's units from the tier below
    (1 = full bisection, 2 = a 2:1 oversubscribed spine): when every GPU of a unit sends across
    at once, each gets `gb_per_s` / oversubscription. Tier 0 has none."""
    placement: Literal["blocks", "spread"] = "blocks"
    """How a job's nodes fill the units below this tier. `blocks` (topology-aware scheduling, e.g.
    Slurm's topology plugin): whole units in rank order, so a ring crosses this tier once per
    unit. `spread` (a shared or cloud fabric): the nodes land anywhere, so every hop between
    nodes crosses this tier. From tier 2 (units below tier 1 are whole NVLink domains)."""
    reduction: Literal["none", "nvls", "sharp"] | None = None
    """In-network reduction: `nvls` (NVLink SHARP, tier 0 only), `sharp` (InfiniBand SHARP, the
    switches reduce: NCCL CollNet), `none`. Default: tier 0 takes the GPU's NVLS, the others none."""


class NetworkSpec(Spec):
    """The tiers a job's GPUs talk over, inside out (at least two: a scale-up domain and a
    network)."""

    name: str
    """Preset name or a label."""
    description: str = ""
    """What the fabric is and where its numbers come from."""
    tiers: list[TierSpec] = Field(min_length=2, max_length=8)
    """Tier 0 = the scale-up domain, then each network layer; the last one has no size."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Where each number comes from (tier or field -> citation)."""

    @model_validator(mode="after")
    def _check(self) -> NetworkSpec:
        first, last = self.tiers[0], self.tiers[-1]
        if last.size is not None:
            raise ValueError(f"`tiers[{len(self.tiers) - 1}].size` = {last.size}: the last tier "
                             "holds the whole job; leave its size out")
        for i, t in enumerate(self.tiers[1:-1], start=1):
            if t.size is None:
                raise ValueError(f"`tiers[{i}].size` is missing: every tier but the last needs "
                                 "its unit size in GPUs")
        if first.oversubscription != 1:
            raise ValueError(f"`tiers[0].oversubscription` = {first.oversubscription:g}: the "
                             "scale-up domain has no oversubscription (leave it at 1)")
        if first.reduction == "sharp":
            raise ValueError("`tiers[0].reduction` = 'sharp': InfiniBand SHARP reduces in network "
                             "switches; the scale-up tier takes `nvls` or `none`")
        for i, t in enumerate(self.tiers[:2]):
            if t.placement == "spread":
                raise ValueError(f"`tiers[{i}].placement` = 'spread': the units below tier {i} are "
                                 "whole NVLink domains; spread placement applies from tier 2")
        for i, t in enumerate(self.tiers[1:], start=1):
            if t.reduction == "nvls":
                raise ValueError(f"`tiers[{i}].reduction` = 'nvls': NVLink SHARP lives in the "
                                 "scale-up tier (tier 0); a network tier takes `sharp` or `none`")
        for i in range(1, len(self.tiers) - 1):
            below, here = self.tiers[i - 1].size, self.tiers[i].size
            if below is not None and (here <= below or here % below):
                raise ValueError(f"`tiers[{i}].size` = {here}: each unit must hold whole units of "
                                 f"the tier below ({below} GPUs), more than one")
        return self
