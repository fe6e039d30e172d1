"""`Evaluation.take` reorders the ledger arrays lazily (`evaluate.Taken`): every array read is
the eager `array[index]`, through nested takes and any index kind, and a pickled Evaluation
carries plain arrays."""

from __future__ import annotations

import pickle

import numpy as np

from autoparallel import evaluate, make_problem
from autoparallel.evaluate import Taken
from autoparallel.search.enumerate import enumerate_layouts


def _ev():
    p = make_problem("llama3-8b", "h100", 16, 4096, 64)
    return evaluate(p, enumerate_layouts(p))


def test_nested_takes_read_what_eager_indexing_gives():
    ev = _ev()
    n = len(ev)
    rng = np.random.default_rng(0)
    order = rng.permutation(n)
    mask = rng.random(n // 2) < 0.5
    once = ev.take(order)
    twice = once.take(slice(0, n // 2)).take(mask)
    want = order[: n // 2][mask]
    for source, got in ((ev.memory, twice.memory), (ev.time, twice.time)):
        assert isinstance(got, Taken) and list(got) == list(source)
        for k in source:
            assert np.array_equal(got[k], source[k][want]), k
    assert np.array_equal(twice.table["tp"], ev.table["tp"][want])
    assert np.array_equal(twice.mfu, ev.mfu[want])


def test_a_pickled_take_holds_plain_arrays():
    ev = _ev().take(np.arange(5))
    back = pickle.loads(pickle.dumps(ev))
    assert isinstance(back.memory, dict) and isinstance(back.time, dict)
    for k in ev.memory:
        assert np.array_equal(back.memory[k], ev.memory[k])
