"""Vectorised enumeration of every candidate layout of a problem (struct of arrays).

The product of the axes is built with numpy: the (tp, pp, cp) factorisations of the GPU count
with dp derived, crossed with the other axes' candidate universes, then masked to the
combinations the issue defines as candidates (vp only where layers divide by pp x vp, ep only
where it divides the experts and dp x cp, sp only with tp > 1, micro-batches dividing the
per-replica batch). Rules that reject candidates (heads, sequence, placement, ...) run later.
"""

from __future__ import annotations

import numpy as np

from ..layouts import COLUMNS, LayoutTable
from ..specs.layout import RECOMPUTE_CODES
from ..specs.problem import Problem
from .space import SearchSpace


def divisors(n: int) -> np.ndarray:
    """Sorted positive divisors of n."""
    small = np.arange(1, int(np.sqrt(n)) + 1)
    small = small[n % small == 0]
    return np.unique(np.concatenate([small, n // small]))


def _cross(base: dict[str, np.ndarray], name: str, values) -> dict[str, np.ndarray]:
    """Cartesian product of the rows of `base` with `values` as a new column."""
    values = np.asarray(values, dtype=np.int64)
    n = len(next(iter(base.values())))
    out = {k: np.repeat(v, len(values)) for k, v in base.items()}
    out[name] = np.tile(values, n)
    return out


def _keep(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in cols.items()}


def enumerate_layouts(problem: Problem, space: SearchSpace | None = None) -> LayoutTable:
    """Every candidate layout of `problem` allowed by `space`, as a `LayoutTable`."""
    space = space or SearchSpace()
    n = problem.cluster.n_gpus
    model = problem.model
    L = model.n_layers
    B = problem.training.global_batch
    n_experts = model.moe.n_experts if model.moe else 0
    div_n = divisors(n)

    def pick(axis, auto):
        given = getattr(space, axis)
        return np.asarray(auto if given is None else given, dtype=np.int64)

    # (tp, pp, cp) with tp * pp * cp dividing n; dp derived
    cols = {"tp": pick("tp", div_n)}
    cols = _cross(cols, "pp", pick("pp", div_n))
    cols = _cross(cols, "cp", pick("cp", div_n))
    mp = cols["tp"] * cols["pp"] * cols["cp"]
    cols = _keep(cols, n % mp == 0)
    cols["dp"] = n // (cols["tp"] * cols["pp"] * cols["cp"])

    # vp: layers divisible by pp * vp, vp > 1 only with pp > 1
    vp_auto = divisors(L)
    vp_auto = vp_auto[vp_auto <= space.max_vp]
    cols = _cross(cols, "vp", pick("vp", vp_auto))
    pp_ok = L % cols["pp"] == 0
    vp_ok = np.where(cols["vp"] == 1, True, pp_ok & (cols["pp"] > 1) & (L % (cols["pp"] * cols["vp"]) == 0))
    cols = _keep(cols, vp_ok)

    # ep: divides the experts and dp * cp; 1 for dense models
    ep_auto = divisors(n_experts) if n_experts else np.array([1])
    cols = _cross(cols, "ep", pick("ep", ep_auto))
    if n_experts:
        ep_ok = (n_experts % cols["ep"] == 0) & ((cols["dp"] * cols["cp"]) % cols["ep"] == 0)
    else:
        ep_ok = cols["ep"] == 1
    cols = _keep(cols, ep_ok)

    cols = _cross(cols, "zero", pick("zero", [0, 1, 2, 3]))
    rc_values = [RECOMPUTE_CODES[r] for r in (space.recompute or RECOMPUTE_CODES)]
    cols = _cross(cols, "rc", rc_values)
    sp_values = [int(v) for v in (space.sp if space.sp is not None else [True, False])]
    cols = _cross(cols, "sp", sp_values)
    # SP exists only with tp > 1: keep one tp = 1 row per combination, with sp off
    cols = _keep(cols, (cols["tp"] > 1) | (cols["sp"] == min(sp_values)))
    cols["sp"] = np.where(cols["tp"] > 1, cols["sp"], 0)

    # micro-batch: divisors of the per-replica batch (B / dp) up to the bound
    mb_auto = divisors(B)
    mb_auto = mb_auto[mb_auto <= space.max_micro_batch]
    cols = _cross(cols, "mb", pick("micro_batch", mb_auto))
    replica_ok = B % cols["dp"] == 0
    mb_ok = np.where(replica_ok, (B // cols["dp"]) % cols["mb"] == 0, cols["mb"] == cols["mb"].min())
    cols = _keep(cols, mb_ok)
    return LayoutTable({k: np.ascontiguousarray(cols[k]) for k in COLUMNS})
