"""Stage times computed once per distinct row (`cost.distinct_rows`): the grouping is exact, the
columns it leaves out are ones the stage times do not read, and the time ledger is the same
number for number as costing every row."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import make_problem
from autoparallel.cost import distinct_rows as dr
from autoparallel.cost import time as time_mod
from autoparallel.cost.model_arch import build_arch
from autoparallel.cost.network import sizes
from autoparallel.layouts import COLUMNS, LayoutTable
from autoparallel.placement import layout_groups
from autoparallel.search.enumerate import enumerate_layouts
from autoparallel.search.space import SearchSpace

PROBLEMS = [
    ("llama3-8b", "h100", 64, 8192, 256, {}),          # dense, CP forms open
    ("mixtral-8x7b", "h100", 64, 4096, 512, {}),       # MoE: ep, etp
    ("nemotron-h-8b", "h100", 64, 8192, 256, {}),      # hybrid layer types
    ("llama3-8b", "h100", 16, 4096, 64,                # offload and named recompute opened
     {"offload_layers": [0, 2], "optimizer_offload": [0.0, 0.5]}),
]


def _table(args):
    *p, extra = args
    problem = make_problem(*p)
    space = SearchSpace(**extra) if extra else None
    return problem, enumerate_layouts(problem, space) if space else enumerate_layouts(problem)


def _tiny(**cols) -> LayoutTable:
    n = len(next(iter(cols.values())))
    base = {k: np.ones(n, dtype=np.int64) for k in COLUMNS}
    return LayoutTable(base | {k: np.asarray(v, dtype=np.int64) for k, v in cols.items()})


def _shuffled_outside(args, keep, seed):
    """(problem, arch, t, other): about 4,000 rows of the problem's table, and the same rows
    with every column outside `keep` shuffled (each within its own values)."""
    problem, t = _table(args)
    t = t.take(np.arange(0, len(t), max(1, len(t) // 4000)))
    rng = np.random.default_rng(seed)
    other = LayoutTable({k: (t[k] if k in keep else rng.permutation(t[k])) for k in COLUMNS},
                        t.n_layers)
    assert any(not np.array_equal(other[k], t[k]) for k in COLUMNS)
    return problem, build_arch(problem.model), t, other


def _other_form(t: LayoutTable) -> LayoutTable:
    """`t` with every row's CP form and all-to-all group size changed (to values it does not
    hold): what a cost that must not read them has to give the same numbers for."""
    return LayoutTable(dict(t.columns) | {"cc": (t["cc"] + 1) % 4, "cu": t["cu"] + 3}, t.n_layers)


def test_groups_of_a_hand_made_table():
    # rows 0, 2, 4 agree on everything but zero and oo; rows 1 and 3 agree; row 5 is alone
    t = _tiny(tp=[1, 2, 1, 2, 1, 4], zero=[0, 1, 2, 3, 3, 0], oo=[0, 0, 50, 0, 25, 0])
    first, inverse = dr.distinct_rows(t)
    assert len(first) == 3
    groups = {tuple(np.flatnonzero(inverse == g)) for g in range(3)}
    assert groups == {(0, 2, 4), (1, 3), (5,)}
    for c in dr.STAGE_TIME_COLUMNS:
        assert np.array_equal(t[c][first][inverse], t[c])


def test_the_hashed_path_groups_the_same(monkeypatch):
    t = _tiny(tp=[1, 2, 1, 2, 1, 4], zero=[0, 1, 2, 3, 3, 0], oo=[0, 0, 50, 0, 25, 0])
    packed = dr.distinct_rows(t)
    monkeypatch.setattr(dr, "packed_key", lambda *a: None)  # as if the columns needed > 64 bits
    hashed = dr.distinct_rows(t)

    def partition(found):
        first, inverse = found
        return {tuple(np.flatnonzero(inverse == g)) for g in range(len(first))}

    assert partition(hashed) == partition(packed) == {(0, 2, 4), (1, 3), (5,)}


def test_a_hash_collision_costs_every_row(monkeypatch):
    t = _tiny(tp=[1, 2, 1, 2], zero=[0, 1, 2, 3])
    monkeypatch.setattr(dr, "packed_key", lambda *a: None)
    monkeypatch.setattr(dr, "_hashed", lambda t, c: np.zeros(len(t), dtype=np.uint64))
    assert dr.distinct_rows(t) is None  # tp 1 and tp 2 share a hash: refused, not merged


def test_too_few_repeats_are_not_grouped():
    assert dr.distinct_rows(_tiny(tp=[1, 2, 4, 8], zero=[0, 0, 0, 1])) is None


@pytest.mark.parametrize("args", PROBLEMS, ids=lambda a: f"{a[0]}-{a[2]}")
def test_stage_times_do_not_read_the_columns_left_out(args):
    problem, t = _table(args)
    t = t.take(np.arange(0, len(t), max(1, len(t) // 4000)))
    arch = build_arch(problem.model)
    other = LayoutTable(dict(t.columns) | {"zero": (t["zero"] + 1) % 4, "oo": 100 - t["oo"]},
                        t.n_layers)
    g = layout_groups(t, sizes(problem))
    a = time_mod.stage_times(problem, arch, t, g)
    b = time_mod.stage_times(problem, arch, other, layout_groups(other, sizes(problem)))
    for name in a:
        for k, v in a[name].items():
            if k != "stage":
                assert np.array_equal(np.broadcast_to(v, len(t)), np.broadcast_to(b[name][k], len(t))), (name, k)


@pytest.mark.parametrize("args", PROBLEMS, ids=lambda a: f"{a[0]}-{a[2]}")
def test_the_time_ledger_is_the_same_as_costing_every_row(args, monkeypatch):
    problem, t = _table(args)
    arch = build_arch(problem.model)
    assert dr.distinct_rows(t) is not None  # the enumerator repeats rows over zero
    grouped = time_mod.time_ledger(problem, arch, t)
    monkeypatch.setattr(time_mod, "distinct_rows", lambda *a: None)
    every = time_mod.time_ledger(problem, arch, t)
    for k in every:
        assert np.array_equal(grouped[k], every[k]), k


@pytest.mark.parametrize("args", PROBLEMS, ids=lambda a: f"{a[0]}-{a[2]}")
def test_gradient_sync_collectives_read_only_their_columns(args):
    # every column outside DP_SYNC_COLUMNS changed (within its values): the same seconds
    problem, arch, t, other = _shuffled_outside(args, time_mod.DP_SYNC_COLUMNS, seed=5)

    def sync(tab):
        sts = time_mod.stages(arch, tab, problem.training.global_batch)
        g = layout_groups(tab, sizes(problem))
        return {name: time_mod.dp_sync_collectives(problem, tab, g,
                                                   *time_mod.stage_params(arch, tab, st))
                for name, st in sts.items()}

    a, b = sync(t), sync(other)
    for name in a:
        assert len(a[name]) == len(b[name]) > 0
        for ca, cb in zip(a[name], b[name]):
            for k in ca:
                assert np.array_equal(ca[k], cb[k]), (name, k)


# ---- the memory ledger: rows equal but for the CP form are costed once (`cost.memory`)

CP_PROBLEMS = [p for p in PROBLEMS if p[0] != "mixtral-8x7b"] + [
    ("llama3-8b", "h100", 64, 8192, 256, {"cp_comm": ["ring", "a2a", "a2a+ring"]}),
    ("mixtral-8x7b", "h100", 64, 16384, 64, {"cp": [4, 8]}),   # MoE with CP forms
]


@pytest.mark.parametrize("args", CP_PROBLEMS, ids=lambda a: f"{a[0]}-{a[2]}-{len(a[5])}")
def test_stage_memory_does_not_read_the_cp_form(args):
    # every CP form column changed (to values the rows do not hold): the same items
    from autoparallel.cost import memory as memory_mod
    problem, t = _table(args)
    t = t.take(np.arange(0, len(t), max(1, len(t) // 4000)))
    arch = build_arch(problem.model)
    other = _other_form(t)
    acts = lambda tab: None if arch.hybrid else memory_mod.layer_activations(problem, arch, tab)
    for name, st in memory_mod.stages(arch, t, problem.training.global_batch).items():
        a = memory_mod.stage_memory(problem, arch, t, st, acts(t))
        b = memory_mod.stage_memory(problem, arch, other, st, acts(other))
        for k in a:
            assert np.array_equal(np.broadcast_to(a[k], len(t)), np.broadcast_to(b[k], len(t))), (name, k)
    assert set(dr.CP_FORM_COLUMNS) | set(memory_mod.MEMORY_BASE_COLUMNS) == set(COLUMNS)


@pytest.mark.parametrize("args", CP_PROBLEMS, ids=lambda a: f"{a[0]}-{a[2]}-{len(a[5])}")
def test_the_memory_ledger_is_the_same_as_costing_every_row(args, monkeypatch):
    from autoparallel.cost import memory as memory_mod
    problem, t = _table(args)
    arch = build_arch(problem.model)
    # the enumerator crosses each cp > 1 row with the forms: those rows repeat
    assert dr.distinct_rows(t, memory_mod.MEMORY_BASE_COLUMNS) is not None
    with np.errstate(divide="ignore", invalid="ignore"):
        grouped = memory_mod.memory_ledger(problem, arch, t)
        monkeypatch.setattr(memory_mod, "distinct_rows", lambda *a: None)
        every = memory_mod.memory_ledger(problem, arch, t)
    assert set(grouped) == set(every)
    for k in every:
        assert np.array_equal(grouped[k], every[k]), k


def test_rows_of_another_cp_form_differ_by_their_buffers_alone():
    # one layout under ring and a2a: every item equal but the overhead, which differs by the
    # forms' buffers (cost.context.cp_buffer_bytes), on every stage
    from autoparallel.cost import memory as memory_mod
    from autoparallel.cost.context import cp_buffer_bytes
    from autoparallel.specs.layout import Layout
    problem = make_problem("llama3-8b", "h100", 64, 32768, 64)
    arch = build_arch(problem.model)
    lays = [Layout(tp=2, pp=2, cp=4, cp_comm=f).resolved(64) for f in ("ring", "a2a")]
    t = LayoutTable.from_layouts(lays, 64, problem.model.n_layers)
    mem = memory_mod.memory_ledger(problem, arch, t)
    kv = cp_buffer_bytes(problem, arch, t)
    assert kv[0] != kv[1]
    for stage in ("first", "middle", "last"):
        for k in ("params", "grads", "optimizer", "activations", "embedding_logits"):
            assert mem[f"{stage}.{k}"][0] == mem[f"{stage}.{k}"][1]
        d = mem[f"{stage}.overhead"] - kv
        assert d[0] == pytest.approx(d[1], rel=1e-12)


# ---- the CP form's collectives and buffers: once per distinct (tp, cp, form, group, mb)

@pytest.mark.parametrize("args", CP_PROBLEMS, ids=lambda a: f"{a[0]}-{a[2]}-{len(a[5])}")
def test_cp_form_costs_read_only_their_columns(args):
    # every column outside CP_FORM_INPUTS shuffled: the same seconds and bytes
    from autoparallel.cost import context
    problem, arch, t, other = _shuffled_outside(args, context.CP_FORM_INPUTS, seed=7)
    assert np.any(t["cp"] > 1)
    from autoparallel.search import dominated
    for f in (context._cp_collectives, context._cp_buffer_bytes, dominated._cp_split_costs):
        a, b = f(problem, arch, t), f(problem, arch, other)
        for k in (a if isinstance(a, dict) else {"": None}):
            x, y = (a, b) if k == "" else (a[k], b[k])
            assert np.array_equal(x, y), (f.__name__, k)


@pytest.mark.parametrize("args", CP_PROBLEMS, ids=lambda a: f"{a[0]}-{a[2]}-{len(a[5])}")
def test_cp_form_costs_grouped_are_every_rows(args):
    from autoparallel.cost import context
    problem, t = _table(args)
    arch = build_arch(problem.model)
    assert dr.distinct_rows(t, context.CP_FORM_INPUTS) is not None
    grouped = context.cp_collectives(problem, arch, t)
    every = context._cp_collectives(problem, arch, t)
    assert set(grouped) == set(every)
    for k in every:
        assert np.array_equal(grouped[k], every[k]), k
    assert np.array_equal(context.cp_buffer_bytes(problem, arch, t),
                          context._cp_buffer_bytes(problem, arch, t))
    from autoparallel.search import dominated
    assert np.array_equal(dominated.cp_split_costs(problem, arch, t),
                          dominated._cp_split_costs(problem, arch, t))


def test_on_distinct_spreads_arrays_and_dicts():
    t = _tiny(tp=[1, 2, 1, 2, 4], cp=[2, 2, 2, 2, 1], zero=[0, 1, 2, 3, 0])
    calls = []

    def cost(tab):
        calls.append(len(tab))
        return {"x": tab["tp"] * 10 + tab["cp"], "y": 0.5}

    got = dr.on_distinct(t, ("tp", "cp"), cost)
    assert calls == [3]  # (1, 2), (2, 2), (4, 1)
    assert got["x"].tolist() == [12, 22, 12, 22, 41] and got["y"] == 0.5  # a scalar stays one
    assert dr.on_distinct(t, ("tp", "cp"), lambda tab: tab["tp"] * 1.0).tolist() == [1, 2, 1, 2, 4]
    two = dr.on_distinct(t, ("tp", "cp"), lambda tab: np.stack([tab["tp"], tab["cp"]]))
    assert two.tolist() == [[1, 2, 1, 2, 4], [2, 2, 2, 2, 1]]


# ---- the stage times: all but the CP form's seconds once per row distinct on the rest

@pytest.mark.parametrize("args", CP_PROBLEMS, ids=lambda a: f"{a[0]}-{a[2]}-{len(a[5])}")
def test_stage_times_read_the_cp_form_only_in_its_seconds(args):
    problem, t = _table(args)
    t = t.take(np.arange(0, len(t), max(1, len(t) // 4000)))
    arch = build_arch(problem.model)
    assert set(time_mod.STAGE_BASE_COLUMNS) | set(dr.CP_FORM_COLUMNS) == set(time_mod.STAGE_TIME_COLUMNS)
    other = _other_form(t)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = time_mod.stage_times(problem, arch, t, layout_groups(t, sizes(problem)))
        b = time_mod.stage_times(problem, arch, other, layout_groups(other, sizes(problem)))
    changed = False
    for name in a:
        for k, v in a[name].items():
            if k == "stage":
                continue
            same = np.array_equal(np.broadcast_to(v, len(t)), np.broadcast_to(b[name][k], len(t)))
            if k == "cp":
                changed |= not same
            else:
                assert same, (name, k)
    assert changed or arch.hybrid is not None  # the form's seconds do read it


@pytest.mark.parametrize("args", CP_PROBLEMS, ids=lambda a: f"{a[0]}-{a[2]}-{len(a[5])}")
def test_the_time_ledger_grouped_by_form_is_every_rows(args, monkeypatch):
    problem, t = _table(args)
    arch = build_arch(problem.model)
    with np.errstate(divide="ignore", invalid="ignore"):
        grouped = time_mod.time_ledger(problem, arch, t)
        monkeypatch.setattr(time_mod, "_stage_times_by_form",
                            lambda p, a, tab, g: time_mod.stage_times(p, a, tab, g))
        every = time_mod.time_ledger(problem, arch, t)
    for k in every:
        assert np.array_equal(grouped[k], every[k]), k
