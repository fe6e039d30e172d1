"""`ranked_top`: the first `top` layouts of `plan`'s ranking by time, without costing the memory
of every layout.

`plan` costs every rule-passing layout's memory (to know which fit), then the time of those that
fit, then ranks them all: a sweep, which writes three rows a problem, needs the ranking's head
only. Here every rule-passing layout's step time is costed, and memory only for the fastest,
in growing batches, until `top` fitting layouts are found and every layout not yet looked at is
strictly slower (after `rank_order`'s rounding) than the last of them. The ranking's tie-breaks
(memory, then simpler layouts, then table order) only order layouts of equal rounded time, all
of which are then looked at, so the result is `plan(...).ranked`'s rows, in the same order, with
the same numbers (a ledger costs each row on its own: `evaluate.in_blocks`). On DeepSeek-V3 /
16,384 H100 it costs the memory of a few thousand of 1.0 M layouts.
"""

from __future__ import annotations

import numpy as np

from ..cost.memory import memory_ledger
from ..cost.model_arch import build_arch
from ..cost.time import time_ledger
from ..evaluate import RANKED_MEMORY, Evaluation, evaluate, in_blocks
from ..errors import SpecError
from ..rules import active_rules
from ..specs.problem import Problem
from .enumerate import enumerate_valid
from .space import SearchSpace

FIRST_BATCH = 4096
"""Layouts whose memory is costed first (the fastest); each further batch is 4x larger."""


def ranked_top(problem: Problem, space: SearchSpace | None = None, *, top: int = 3,
               rules=None, target: str | None = None) -> Evaluation | None:
    """The first `top` layouts of `plan(problem, space, top=top, rules=rules, target=target)`'s
    ranking (`rank_by="time"`), as an `Evaluation`; None when no layout fits, or none that
    `target` can express (the caller then runs `plan`, which says why)."""
    from .plan import narrowed_for, simplicity, time_key

    if top < 1:
        raise SpecError(f"`top` = {top}: give 1 or more (how many ranked layouts to return)")
    space = narrowed_for(space or SearchSpace(), target)
    rules = active_rules() if rules is None else rules
    arch = build_arch(problem.model)
    valid = enumerate_valid(problem, space, rules, drop_dominated=target is None).table
    n = len(valid)
    if n == 0:
        return None
    step = in_blocks(time_ledger, problem, arch, valid, keep=("step",))["step"]
    looked = np.zeros(n, dtype=bool)
    fit_rows: list[np.ndarray] = []  # rule-passing rows that fit (and the target can express)
    fit_total: list[np.ndarray] = []  # their total memory (a tie-break)
    fastest = None  # the fastest fitting layout's step time (`rank_order`'s reference)
    batch = FIRST_BATCH
    while True:
        if batch < n:
            rows = np.argpartition(step, batch - 1)[:batch]  # the `batch` fastest, any order
            rows = rows[~looked[rows]]
        else:
            rows = np.flatnonzero(~looked)
        rows = np.sort(rows)
        looked[rows] = True
        mem = in_blocks(memory_ledger, problem, arch, valid.take(rows), keep=RANKED_MEMORY)
        ok = mem["fit_peak"] <= mem["usable"]
        fits, total = rows[ok], mem["total"][ok]
        if len(fits):
            if fastest is None:  # every later batch is at least as slow as this one
                fastest = float(np.min(step[fits]))
            if target is not None:
                keep = _expressible(problem, valid, fits, target)
                fits, total = fits[keep], total[keep]
            fit_rows.append(fits)
            fit_total.append(total)
        if looked.all():
            break
        found = np.concatenate(fit_rows) if fit_rows else np.zeros(0, dtype=np.intp)
        if fastest is not None and len(found) >= top:
            last = np.sort(time_key(step[found], fastest))[top - 1]
            rest = float(np.min(step[~looked]))  # every unlooked layout is at least this slow
            if np.isfinite(last) and time_key(np.array([rest]), fastest)[0] > last:
                break
        batch *= 4
    if fastest is None:
        return None
    found, total = np.concatenate(fit_rows), np.concatenate(fit_total)
    if len(found) == 0:  # layouts fit, but not one the target can express
        return None
    by_row = np.argsort(found, kind="stable")  # table order: the last tie-break
    found, total = found[by_row], total[by_row]
    # `rank_order` restricted to these rows: by time key, memory, simplicity, table order
    order = np.lexsort((simplicity(valid, found), total, time_key(step[found], fastest)))
    head = found[order[:top]]
    return evaluate(problem, valid.take(head), rules, arch=arch,
                    reject=np.zeros(len(head), dtype=np.int64))


def _expressible(problem: Problem, valid, rows: np.ndarray, target: str) -> np.ndarray:
    """Per row at `rows`: whether `target`'s launcher can express it (`exporters.check`)."""
    from ..exporters import check

    return np.array([not check(target, problem, valid.row(int(i))) for i in rows], dtype=bool)


__all__ = ["ranked_top", "FIRST_BATCH"]
