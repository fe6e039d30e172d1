"""Hierarchical context-parallel splits that can never win: drop them before the ZeRO and
recompute crosses multiply them.

The a2a+ring form runs once per all-to-all group size u (`cu`; Megatron-Core
`--hierarchical-context-parallel-sizes u r`), and rows that differ only in u cost the same in
everything but two terms (`cost.context`): the CP seconds one layer adds per micro-batch,
`cp_layer_time` = F (1 + full) + B (F, B >= 0 the form's forward and backward exposure; `full`
in [0, 1] the share of layers fully recomputed), and the transient buffers of a layer's attention,
`cp_buffer_bytes`, the same on every pipeline stage. So where one split has neither more CP
seconds at full = 0 nor at full = 1 nor more buffer bytes than another, and less of one, it is
no faster and no smaller under every ZeRO stage and recompute choice: step time is a maximum of
per-stage sums plus a bubble that grows with the slowest stage (1F1B and interleaved
schedules: (p - 1)/v x tau), and each memory figure is a monotone function of the most loaded
stage, which a constant per-stage shift does not change. The dominated split is counted (under
`cp_split_dominated`) and not built.

Only where that argument holds: transformer layers (a hybrid pattern prices its mixers' CP
apart), 1F1B and interleaved schedules (the zero-bubble and DualPipe bubbles read the slowest
stage's weight-gradient time, which a smaller CP term can swap for another stage's), and a
search ranked by step time with no launcher filter (`plan`: a dominated split may be the one a
target can write, or be ranked otherwise by robustness). Splits of other forms are never
compared: each form keeps its best layout for `plan`'s per-form line. On DeepSeek-V3 (4,096
H100, seq 4096) 41 % of the fitting layouts are such splits.
"""

from __future__ import annotations

import numpy as np

from ..cost.arch import Arch
from ..cost.context import (A2A_RING, CP_FORM_INPUTS, cp_buffer_bytes, cp_collectives,
                             cp_layer_time)
from ..cost.distinct_rows import on_distinct, packed_key
from ..cost.time import attention_forward_time
from ..layouts import LayoutTable
from ..specs.problem import Problem

GROUP_COLUMNS = ("dp", "tp", "pp", "vp", "cp", "ep", "etp", "sp", "mb", "lf", "ll", "sch", "cc")
"""Columns the compared rows share (every one the enumerator has built by then, but `cu`)."""
PRUNED_SCHEDULES = (0, 1)
"""Schedule codes whose rows are compared (1F1B, interleaved: `SCHEDULE_CODES`)."""


def cp_split_costs(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Per row: (CP seconds of one layer at full = 0, at full = 1, CP buffer bytes), shape (3, n);
    they read only `CP_FORM_INPUTS` (the attention time: tp, cp, micro-batch), so each distinct
    combination is costed once (`cost.distinct_rows.on_distinct`)."""
    return on_distinct(t, CP_FORM_INPUTS, lambda d: _cp_split_costs(problem, arch, d))


def _cp_split_costs(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    coll = cp_collectives(problem, arch, t)
    attn = attention_forward_time(problem, arch, t)
    return np.stack([cp_layer_time(problem, t, coll, attn, 0.0),
                     cp_layer_time(problem, t, coll, attn, 1.0),
                     cp_buffer_bytes(problem, arch, t)])


def dominated_splits(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Mask of the a2a+ring rows of `t` (ZeRO and recompute not yet crossed in) that another
    row equal on `GROUP_COLUMNS` beats: no more of each `cp_split_costs` figure, less of one.
    Rows tied on all three are both kept."""
    out = np.zeros(len(t), dtype=bool)
    if arch.hybrid is not None:
        return out
    rows = np.flatnonzero((t["cc"] == A2A_RING) & (t["cp"] > 1)
                          & np.isin(t["sch"], PRUNED_SCHEDULES))
    if len(rows) < 2:
        return out
    sub = t.take(rows)
    costs = cp_split_costs(problem, arch, sub)
    packed = packed_key(sub, GROUP_COLUMNS)  # one exact 64-bit key per row, when the columns fit
    if packed is not None:
        order = np.argsort(packed, kind="stable")
        keys = packed[order][None, :]
    else:
        keys = np.stack([sub[c] for c in GROUP_COLUMNS])
        order = np.lexsort(keys[::-1])
        keys = keys[:, order]
    costs = costs[:, order]
    same_from = np.r_[True, np.any(keys[:, 1:] != keys[:, :-1], axis=0)]
    group = np.cumsum(same_from) - 1  # group number of each sorted row
    size = np.bincount(group)
    beaten = np.zeros(len(order), dtype=bool)
    for d in range(1, int(size.max())):  # compare each row with the row d after it, both ways
        a = np.flatnonzero(group[:-d] == group[d:])  # pairs within one group
        b = a + d
        ca, cb = costs[:, a], costs[:, b]
        le, ge = np.all(ca <= cb, axis=0), np.all(ca >= cb, axis=0)
        beaten[b[le & ~ge]] = True  # a no worse anywhere, better somewhere
        beaten[a[ge & ~le]] = True
    out[rows[order[beaten]]] = True
    return out


__all__ = ["GROUP_COLUMNS", "PRUNED_SCHEDULES", "cp_split_costs", "dominated_splits"]
