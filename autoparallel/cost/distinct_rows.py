"""Rows of a layout table that agree on a set of columns, found once so that a cost which reads
only those columns is computed once per distinct row and copied to the others.

The stage times (`cost.time.stage_times`: compute, recompute, TP, CP, EP and host time per
micro-batch), and with them the whole time ledger but the gradient sync and the optimizer step
(`cost.time.time_ledger`), do not read the ZeRO stage or the optimizer offload, which the
enumerator crosses every other axis with (`search.enumerate`: zero in 0..3), so most tables hold
each stage-time row several times. The memory ledger (`cost.memory.memory_ledger`) likewise
reads the context-parallel form (`cc`, `cu`) only through the form's buffers, and the enumerator
crosses every cp > 1 row with the forms and all-to-all group sizes it searches. Exact: rows are grouped by their columns packed into one 64-bit key (each
column in as many bits as its range needs), or, where they need more bits, by a hash whose
grouping is then checked column by column; a collision (or too few repeats to pay) gives None
and the caller costs every row.
"""

from __future__ import annotations

import numpy as np

from ..layouts import COLUMNS, LayoutTable

CP_FORM_COLUMNS = ("cc", "cu")
"""The context-parallel form and its all-to-all group size: the memory ledger reads them only
through the form's buffers, the stage times only in the form's seconds (`cost.memory`,
`cost.time`; tests/test_distinct_rows.py checks both)."""
NOT_IN_STAGE_TIMES = ("zero", "oo")
"""Columns `cost.time.stage_times` does not read (tests/test_distinct_rows.py checks it)."""
STAGE_TIME_COLUMNS = tuple(c for c in COLUMNS if c not in NOT_IN_STAGE_TIMES)
"""The columns the stage times depend on."""
MIN_REPEAT = 1.25
"""Rows per distinct row below which the grouping is not worth its sort."""
_MULT = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, odd: a bijective multiply mod 2^64


def packed_key(t: LayoutTable, columns) -> np.ndarray | None:
    """Each row's `columns` as one uint64 (each column offset by its minimum in its own bits),
    exact; None when they need more than 64 bits."""
    key = np.zeros(len(t), dtype=np.uint64)
    shift = 0
    for c in columns:
        v = t[c]
        lo, hi = int(v.min()), int(v.max())
        if hi == lo:
            continue  # the same in every row: no bits
        bits = (hi - lo).bit_length()
        if shift + bits > 64:
            return None
        key |= (v - lo).astype(np.uint64) << np.uint64(shift)
        shift += bits
    return key


def _hashed(t: LayoutTable, columns) -> np.ndarray:
    """A 64-bit hash of each row's `columns` (equal rows, equal hashes; the converse is checked
    by the caller)."""
    h = np.zeros(len(t), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for c in columns:
            h = (h ^ t[c].astype(np.uint64)) * _MULT
            h ^= h >> np.uint64(29)
    return h


def distinct_rows(t: LayoutTable, columns=STAGE_TIME_COLUMNS) -> tuple[np.ndarray, np.ndarray] | None:
    """(first, inverse): `first` the index of one row of each group of rows equal on `columns`,
    `inverse` per row its group (`t[c][first][inverse] == t[c]` for every c); None when the
    rows are nearly all distinct or two groups share a hash."""
    n = len(t)
    if n < 2:
        return None
    key = packed_key(t, columns)
    exact = key is not None
    if not exact:
        key = _hashed(t, columns)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    if len(first) * MIN_REPEAT > n:
        return None
    inverse = inverse.reshape(-1)
    if not exact:
        for c in columns:
            if not np.array_equal(t[c][first][inverse], t[c]):
                return None  # a hash collision: cost every row
    return first, inverse


def spread(v, inverse):
    """A distinct row's value (`distinct_rows`' `first` rows) to each of its rows, along the
    last axis; a scalar stays one, and `inverse` None (nothing grouped) leaves `v` as it is."""
    return v if inverse is None or np.ndim(v) == 0 else np.asarray(v)[..., inverse]


def on_distinct(t: LayoutTable, columns, cost):
    """`cost(t)` (an array whose last axis is the rows, or a dict of them; a scalar stands for
    every row) for a `cost` that reads only `columns` of the table: computed once per distinct
    row of those columns and copied to the others, the same numbers (every row of a group is the
    same input); every row where the rows barely repeat (`distinct_rows` None)."""
    found = distinct_rows(t, columns)
    if found is None:
        return cost(t)
    first, inverse = found
    got = cost(t.take(first))
    if isinstance(got, dict):
        return {k: spread(v, inverse) for k, v in got.items()}
    return spread(got, inverse)
