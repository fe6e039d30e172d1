"""A search keeps only the ledger keys it ranks on for every row (`evaluate.Ledger`) and takes
table columns as they are read (`LayoutTable.take` -> `taken.Taken`); every other figure is
costed for the rows that read it. The figures must be exactly those of the eager path: costed
rows, through blocks, takes of takes, a pickled copy and a plan's shown rows."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

from autoparallel import evaluate, make_problem
from autoparallel.evaluate import RANKED_MEMORY, RANKED_TIME, Ledger
from autoparallel.search.enumerate import enumerate_layouts
from autoparallel.search.plan import plan
from autoparallel.taken import Taken


@pytest.fixture()
def small_blocks(monkeypatch):
    monkeypatch.setattr(sys.modules["autoparallel.evaluate"], "BLOCK_ROWS", 97)  # many blocks, one ragged


def _problem():
    return make_problem("llama3-8b", "h100", 16, 4096, 64)


def test_lazy_evaluation_reads_what_the_eager_one_gives(small_blocks):
    p = _problem()
    table = enumerate_layouts(p)
    eager = evaluate(p, table)
    lazy = evaluate(p, table, lazy=True)
    assert isinstance(lazy.memory, Ledger) and isinstance(lazy.time, Ledger)
    assert all(lazy.memory.holds(k) for k in RANKED_MEMORY)
    assert not lazy.memory.holds("params") and not lazy.time.holds("compute")
    rng = np.random.default_rng(1)
    order = rng.permutation(len(table))
    few = order[:40]
    shown = lazy.take(order).take(slice(0, 40))  # reordered, then the first 40 (a plan's top)
    for name in ("memory", "time"):
        got, want = getattr(shown, name), getattr(eager, name)
        assert list(got) == list(want)
        for k in want:  # kept keys taken; the others costed for these 40 rows alone
            assert np.array_equal(got[k], want[k][few]), (name, k)
    assert not lazy.memory.holds("params")  # costing 40 rows stored nothing for all of them
    for k in eager.memory:  # the whole table read directly: costed once for every row
        assert np.array_equal(lazy.memory[k], eager.memory[k]), k
    assert lazy.memory.holds("params")
    with pytest.raises(KeyError):
        lazy.time["no_such_item"]


def test_a_pickled_lazy_evaluation_holds_every_key():
    p = _problem()
    table = enumerate_layouts(p)
    lazy = evaluate(p, table, lazy=True).take(np.arange(7))
    back = pickle.loads(pickle.dumps(lazy))
    assert isinstance(back.time, dict) and set(back.time) >= set(RANKED_TIME) | {"compute"}
    assert np.array_equal(back.time["compute"], evaluate(p, table.take(np.arange(7))).time["compute"])


def test_table_takes_are_lazy_and_exact():
    table = enumerate_layouts(_problem())
    n = len(table)
    rng = np.random.default_rng(2)
    order = rng.permutation(n)
    mask = rng.random(n // 3) < 0.5
    got = table.take(order).take(slice(0, n // 3)).take(mask)
    want = order[: n // 3][mask]
    assert isinstance(got.columns, Taken) and len(got) == len(want)
    for i in (0, len(want) // 2, len(want) - 1, -1):
        assert got.row(i) == table.row(int(want[i]))
    for k in table.columns:
        assert np.array_equal(got[k], table[k][want]), k
    view = table.take(slice(3, 9))  # a slice of a built table: views, not a lazy take
    assert not isinstance(view.columns, Taken) and np.shares_memory(view["tp"], table["tp"])


def test_plan_shows_the_eager_figures_of_its_rows(small_blocks):
    p = _problem()
    res = plan(p, top=5)
    rows = np.array([0, 1, 4])
    eager = evaluate(p, res.ranked.table.take(rows))
    for name in ("memory", "time"):
        for k, v in getattr(eager, name).items():
            assert np.array_equal(getattr(res.ranked, name)[k][rows], v), (name, k)
    assert np.array_equal(res.ranked.reject, np.zeros(5, dtype=np.int64))
