"""`search.top.ranked_top` (what a sweep writes) is the head of `plan`'s ranking: the same
layouts, in the same order, with the same numbers, although it costs the memory of only the
fastest layouts. The reference is `plan` itself, which costs every layout's memory and ranks all
that fit (`rank_order`); the cases cover dense and MoE models, a launcher target, several
batches of memory costing, heavy ties and nothing fitting."""

from __future__ import annotations

import functools
import importlib

import numpy as np
import pytest

from autoparallel.cost import time as time_module
from autoparallel.output.frames import ranked_frame, rows_frame
from autoparallel.problem import make_problem
from autoparallel.search import top as top_module
from autoparallel.search.plan import plan
from autoparallel.search.space import SearchSpace
from autoparallel.search.top import ranked_top


def _head_csv(problem, space=None, top=3, target=None):
    ev = ranked_top(problem, space, top=top, target=target)
    return None if ev is None else rows_frame(problem, ev).to_csv(index=False)


def _plan_csv(problem, space=None, top=3, target=None):
    return ranked_frame(plan(problem, space, top=top, target=target)).to_csv(index=False)


@functools.cache
def _plan_csv_of_case(model, gpus, seq, batch, target):
    return _plan_csv(make_problem(model, "h100", gpus, seq, batch), top=5, target=target)


CASES = [
    ("llama3-8b", 8, 4096, 64, None),
    ("llama3-70b", 256, 8192, 512, "megatron"),
    ("mixtral-8x7b", 1024, 8192, 2048, None),
    ("deepseek-v3", 1024, 4096, 2048, None),
]


@pytest.mark.parametrize("first_batch", [1, 37, top_module.FIRST_BATCH])
@pytest.mark.parametrize("model,gpus,seq,batch,target", CASES)
def test_head_is_plans_ranking(monkeypatch, model, gpus, seq, batch, target, first_batch):
    monkeypatch.setattr(top_module, "FIRST_BATCH", first_batch)
    p = make_problem(model, "h100", gpus, seq, batch)
    assert _head_csv(p, top=5, target=target) == _plan_csv_of_case(model, gpus, seq, batch, target)


def _coarse(ledger):
    """A time ledger whose step times are rounded to 2 significant digits: most layouts tie."""

    def coarse(problem, arch, table):
        out = dict(ledger(problem, arch, table))
        step = out["step"]
        scale = 10.0 ** np.floor(np.log10(step))
        out["step"] = np.round(step / scale, 1) * scale
        return out

    return coarse


@pytest.mark.parametrize("first_batch", [1, 5, 64])
def test_ties_are_broken_as_plan_breaks_them(monkeypatch, first_batch):
    # with step times tied in runs of hundreds, the head is decided by the tie-breaks (memory,
    # then GPUs per replica, then table order) across the batches' boundaries
    coarse = _coarse(time_module.time_ledger)
    monkeypatch.setattr(top_module, "time_ledger", coarse)
    monkeypatch.setattr(importlib.import_module("autoparallel.evaluate"), "time_ledger", coarse)
    monkeypatch.setattr(top_module, "FIRST_BATCH", first_batch)
    p = make_problem("llama3-70b", "h100", 64, 4096, 512)
    steps = plan(p, top=10).survivors.time["step"]
    assert np.count_nonzero(steps[:10] == steps[0]) == 10  # the head is one tied run
    assert _head_csv(p, top=10) == _plan_csv(p, top=10)


def test_only_the_fastest_layouts_memory_is_costed(monkeypatch):
    # the point of it: DeepSeek-V3 on 1,024 H100 costs the memory of the first batch only
    calls = []
    real = top_module.memory_ledger

    def counting(problem, arch, table):
        calls.append(len(table))
        return real(problem, arch, table)

    monkeypatch.setattr(top_module, "memory_ledger", counting)
    p = make_problem("deepseek-v3", "h100", 1024, 4096, 2048)
    assert ranked_top(p, top=3) is not None
    n_valid = plan(p, top=1).n_valid
    assert sum(calls) <= top_module.FIRST_BATCH < n_valid / 10


def test_top_must_be_positive():
    from autoparallel.errors import SpecError

    with pytest.raises(SpecError, match="`top` = 0"):
        ranked_top(make_problem("llama3-8b", "h100", 8, 4096, 64), top=0)


def test_nothing_fits_is_none_and_the_sweep_explains_it():
    from autoparallel.search.sweep import _Block

    p = make_problem("llama3-405b", "h100", 8, 4096, 64)
    assert ranked_top(p) is None
    block = _Block(SearchSpace(), 3, None, None)(p).decode()
    assert block == _plan_csv(p).split("\n", 1)[1]  # the plan's one row, its header off
    assert "overflows by" in block and ",False," in block


def test_a_narrowed_space_and_top_beyond_the_fitting_count():
    # fewer layouts fit than asked for: every one is looked at, and all are returned in order
    p = make_problem("llama3-8b", "h100", 8, 4096, 64)
    space = SearchSpace(tp=[8], pp=[1], cp=[1])
    n_fit = plan(p, space, top=1).n_fit
    assert 0 < n_fit < 200
    assert _head_csv(p, space, top=200) == _plan_csv(p, space, top=200)
