"""Where each parallel group's ranks land. Ranks are ordered TP innermost, then CP, DP, PP
(Megatron's default `tp-cp-ep-dp-pp`, reference §0 and launchers.md §1.1). Expert layers number
the same ranks of a pipeline stage ETP innermost, then EP, then EDP (Megatron-Core
parallel_state: the expert RankGenerator(tp=etp, ep=ep, dp=edp, cp=1) in the same order;
MoE Parallel Folding, arXiv 2504.14960); with ETP = TP this is EP carved out of CP x DP.
The network is a nest of tiers (`cost.network`): units of
`sizes[0]` GPUs (the scale-up domain) inside units of `sizes[1]` GPUs (e.g. a leaf switch), and
so on. A group of `size` ranks spaced `stride` apart puts min(size, sizes[i] // stride) ranks
(at least one) in each unit of tier i: ranks are placed in order, units are whole blocks of
consecutive ranks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Group:
    """One kind of communication group, per layout row.

    `size`: ranks in the group; `per_tier[i]`: its ranks inside one unit of tier i (tier 0 = the
    scale-up domain). A group built for fewer tiers than the network has is taken to lie inside
    one unit of every tier beyond (the whole job)."""

    size: np.ndarray
    per_tier: tuple[np.ndarray, ...]
    runs: tuple[Group, np.ndarray] | None = None
    """The same group over its distinct consecutive rows (rows in a run share size and
    stride), and each row's run: what depends only on the group is computed once per run
    (`cost.comm`). None: every row its own run."""

    def distinct(self) -> tuple[Group, np.ndarray | None]:
        """(group over the distinct runs, each row's run index); the group itself and None
        where it has no runs."""
        return self.runs if self.runs is not None else (self, None)

    @property
    def per_node(self) -> np.ndarray:
        """Ranks inside one scale-up domain (tier 0)."""
        return self.per_tier[0]

    @property
    def nodes(self) -> np.ndarray:
        """Scale-up domains the group spans."""
        return np.ceil(self.size / self.per_tier[0])

    def ranks_in(self, tier: int) -> np.ndarray:
        """Ranks inside one unit of `tier` (the whole group past the tiers it was built for)."""
        return self.per_tier[tier] if tier < len(self.per_tier) else self.size

    def units(self, tier: int) -> np.ndarray:
        """Units of `tier` the group spans (1 where it fits inside one)."""
        return np.ceil(self.size / self.ranks_in(tier))


def group(size, stride, sizes: int | Sequence[int]) -> Group:
    """Placement of a group of `size` ranks with rank spacing `stride` in units of `sizes[i]`
    GPUs at each tier (an int: the scale-up domain only)."""
    size, stride = np.broadcast_arrays(np.asarray(size, dtype=np.float64),
                                       np.asarray(stride, dtype=np.float64))
    sizes = (sizes,) if np.isscalar(sizes) else tuple(sizes)
    if size.ndim != 1 or len(size) < 2:
        return _placed(size, stride, sizes)
    # rows come in runs of equal (size, stride) (the enumerator varies the degrees slowest):
    # place each run once, then give every row its run's placement
    start = np.empty(len(size), dtype=bool)
    start[0] = True
    np.not_equal(size[1:], size[:-1], out=start[1:])
    start[1:] |= stride[1:] != stride[:-1]
    run = np.cumsum(start) - 1
    key = _placed(size[start], stride[start], sizes)
    return Group(size=size, per_tier=tuple(p[run] for p in key.per_tier), runs=(key, run))


def _placed(size, stride, sizes) -> Group:
    """min(size, sizes[i] // stride) ranks (at least one) in each unit of tier i."""
    per_tier = tuple(np.minimum(size, np.maximum(1.0, np.floor(float(g) / stride))) for g in sizes)
    return Group(size=size, per_tier=per_tier)


def layout_groups(t, sizes: int | Sequence[int]) -> dict[str, Group]:
    """Groups of every axis for a `LayoutTable` `t`, placed in units of `sizes` GPUs per tier
    (an int: the scale-up domain only):

    - `tp`: TP ranks (stride 1); `cp`: CP ring (stride tp);
    - `dpcp`: dense-gradient group DP x CP (stride tp);
    - `etp`: expert-TP group (stride 1); `ep`: expert group (stride etp);
    - `edp`: expert data-parallel group TP x CP x DP / (ETP x EP) (stride etp*ep);
    - `pp`: stage neighbours.
    """
    tp, cp, dp, ep, pp = (t[k].astype(np.float64) for k in ("tp", "cp", "dp", "ep", "pp"))
    etp = t["etp"].astype(np.float64)
    return {
        "tp": group(tp, np.ones_like(tp), sizes),
        "cp": group(cp, tp, sizes),
        "dpcp": group(dp * cp, tp, sizes),
        "etp": group(etp, np.ones_like(etp), sizes),
        "ep": group(ep, etp, sizes),
        "edp": group(tp * cp * dp / (etp * ep), etp * ep, sizes),
        "pp": group(pp, tp * cp * dp, sizes),
    }
