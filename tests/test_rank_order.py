"""`plan.rank_order` is `np.lexsort((tp*pp*vp*cp, memory total, rounded step))`: fastest
first, ties (1e-9 relative) by lower memory, then simpler layouts, then table order; computed by
an unstable sort on time and re-sorting only the tied runs (row number last), which must give
the same permutation."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel.search.plan import rank_order


def _ev(step, total, tp, cp):
    n = len(step)
    ones = np.ones(n, dtype=np.int64)
    return SimpleNamespace(time={"step": np.asarray(step, dtype=float)},
                           memory={"total": np.asarray(total, dtype=float)},
                           table={"tp": np.asarray(tp, dtype=np.int64), "pp": ones, "vp": ones,
                                  "cp": np.asarray(cp, dtype=np.int64)})


def _reference(ev):
    step = ev.time["step"]
    key = np.round(step / max(float(step.min()), 1e-30), 9)
    simple = ev.table["tp"] * ev.table["pp"] * ev.table["vp"] * ev.table["cp"]
    return np.lexsort((simple, ev.memory["total"], key))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1.0, 1.0 + 1e-12, 1.5, 2.0, 3.0, np.inf, np.nan]),
                          st.sampled_from([10.0, 20.0, 30.0]), st.sampled_from([1, 2, 4]),
                          st.sampled_from([1, 2])), min_size=1, max_size=60))
def test_rank_order_is_the_three_key_lexsort(rows):
    step, total, tp, cp = (list(x) for x in zip(*rows))
    ev = _ev(step, total, tp, cp)
    assert np.array_equal(rank_order(ev), _reference(ev))


def test_ties_are_broken_by_memory_then_simplicity_then_table_order():
    # rows 0-3 take the same time (1e-12 apart); row 4 is faster; row 5 slower
    ev = _ev([2.0, 2.0 + 1e-12, 2.0, 2.0, 1.0, 3.0], [30, 20, 20, 20, 50, 10], [4, 4, 1, 4, 8, 1],
             [1, 1, 1, 1, 1, 1])
    assert rank_order(ev).tolist() == [4, 2, 1, 3, 0, 5]


def test_long_tied_runs_keep_table_order():
    # 20,000 rows in 40 runs of equal time, memory and simplicity: the time sort is not stable
    # (numpy's default introsort reorders equal keys once arrays pass its insertion-sort size),
    # so table order within a run comes from the row number, the last key of the re-sort
    rng = np.random.default_rng(7)
    n = 20_000
    step = rng.integers(0, 40, n) * 0.25 + 1.0
    total = rng.choice([10.0, 20.0], n)
    tp = rng.choice([1, 2], n)
    ev = _ev(step, total, tp, np.ones(n, dtype=np.int64))
    assert np.array_equal(rank_order(ev), _reference(ev))
