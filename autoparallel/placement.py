"""Where each parallel group's ranks land. Ranks are ordered TP innermost, then CP, DP, PP
(Megatron's default `tp-cp-ep-dp-pp`, reference §0 and launchers.md §1.1; EP is carved out of
CP x DP starting innermost). A group of `size` ranks spaced `stride` apart puts
min(size, domain // stride) ranks in each scale-up domain (NVLink node)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Group:
    """One kind of communication group, per layout row: size, ranks per node, nodes spanned."""

    size: np.ndarray
    per_node: np.ndarray
    nodes: np.ndarray


def group(size: np.ndarray, stride: np.ndarray, domain: int) -> Group:
    """Placement of a group of `size` ranks with rank spacing `stride` in domains of `domain` GPUs."""
    size = np.asarray(size, dtype=np.float64)
    stride = np.asarray(stride, dtype=np.float64)
    per_node = np.minimum(size, np.maximum(1.0, np.floor(domain / stride)))
    nodes = np.ceil(size / per_node)
    return Group(size=size, per_node=per_node, nodes=nodes)


def layout_groups(t, domain: int) -> dict[str, Group]:
    """Groups of every axis for a `LayoutTable` `t`:

    - `tp`: TP ranks (stride 1); `cp`: CP ring (stride tp);
    - `dpcp`: dense-gradient group DP x CP (stride tp); `ep`: expert group (stride tp);
    - `edp`: expert data-parallel group DP x CP / EP (stride tp*ep); `pp`: stage neighbours.
    """
    tp, cp, dp, ep, pp = (t[k].astype(np.float64) for k in ("tp", "cp", "dp", "ep", "pp"))
    return {
        "tp": group(tp, np.ones_like(tp), domain),
        "cp": group(cp, tp, domain),
        "dpcp": group(dp * cp, tp, domain),
        "ep": group(ep, tp, domain),
        "edp": group(dp * cp / ep, tp * ep, domain),
        "pp": group(pp, tp * cp * dp, domain),
    }
