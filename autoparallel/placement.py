"""Where each parallel group's ranks land. Ranks are ordered TP innermost, then CP, DP, PP
(Megatron's default `tp-cp-ep-dp-pp`, reference §0 and launchers.md §1.1). Expert layers number
the same ranks of a pipeline stage ETP innermost, then EP, then EDP (Megatron-Core
parallel_state: the expert RankGenerator(tp=etp, ep=ep, dp=edp, cp=1) in the same order;
MoE Parallel Folding, arXiv 2504.14960); with ETP = TP this is EP carved out of CP x DP. A group of `size` ranks spaced `stride` apart puts
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
    - `dpcp`: dense-gradient group DP x CP (stride tp);
    - `etp`: expert-TP group (stride 1); `ep`: expert group (stride etp);
    - `edp`: expert data-parallel group TP x CP x DP / (ETP x EP) (stride etp*ep);
    - `pp`: stage neighbours.
    """
    tp, cp, dp, ep, pp = (t[k].astype(np.float64) for k in ("tp", "cp", "dp", "ep", "pp"))
    etp = t["etp"].astype(np.float64)
    return {
        "tp": group(tp, np.ones_like(tp), domain),
        "cp": group(cp, tp, domain),
        "dpcp": group(dp * cp, tp, domain),
        "etp": group(etp, np.ones_like(etp), domain),
        "ep": group(ep, etp, domain),
        "edp": group(tp * cp * dp / (etp * ep), etp * ep, domain),
        "pp": group(pp, tp * cp * dp, domain),
    }
