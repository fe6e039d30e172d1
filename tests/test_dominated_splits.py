"""Hierarchical CP splits dropped by the search (`search.dominated`) are ones another split of
the same layout beats under every ZeRO stage and recompute choice: checked by costing every
row without the drop, and by the plan being the undropped plan less those rows."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import evaluate, make_problem
from autoparallel.layouts import COLUMNS
import autoparallel.search.dominated as dom
from autoparallel.search.plan import plan
from autoparallel.search.dominated import dominated_splits
from autoparallel.search.enumerate import enumerate_valid
from autoparallel.search.space import SearchSpace

PROBLEMS = [  # (model, gpu, n, seq, batch, space): cp up to 16 with several a2a group sizes
    ("llama3-70b", "h100", 128, 65536, 16, SearchSpace(cp=[8, 16], micro_batch=[1])),
    ("mixtral-8x7b", "h100", 64, 32768, 64, SearchSpace(cp=[8], tp=[1, 2, 4])),
]


def _keys(t):
    return [tuple(int(t[c][i]) for c in COLUMNS) for i in range(len(t))]


@pytest.mark.parametrize("args", PROBLEMS, ids=lambda a: f"{a[0]}-{a[2]}")
def test_every_dropped_split_is_beaten_by_a_kept_one(args):
    *p, space = args
    problem = make_problem(*p)
    every = enumerate_valid(problem, space)
    kept = enumerate_valid(problem, space, drop_dominated=True)
    dropped_n = len(every.table) - len(kept.table)
    assert dropped_n > 0
    assert kept.pruned_counts["cp_split_dominated"] == dropped_n
    assert kept.n_pruned == every.n_pruned + dropped_n  # still counted among the candidates
    ev = evaluate(problem, every.table)
    kept_keys = set(_keys(kept.table))
    keys = _keys(every.table)
    cu = COLUMNS.index("cu")
    by_rest = {}
    for i, k in enumerate(keys):
        by_rest.setdefault(k[:cu] + k[cu + 1:], []).append(i)
    figures = [ev.time["step"], ev.memory["total"], ev.memory["fit_peak"], ev.memory["reserved"]]
    for i, k in enumerate(keys):
        if k in kept_keys:
            continue
        assert every.table["cc"][i] == 3 and every.table["sch"][i] in (0, 1)
        siblings = [j for j in by_rest[k[:cu] + k[cu + 1:]] if keys[j] in kept_keys]
        assert any(all(f[j] <= f[i] * (1 + 1e-12) for f in figures) for j in siblings), k


def test_plan_is_the_undropped_plan_less_the_dropped_rows(monkeypatch):
    problem = make_problem("llama3-70b", "h100", 128, 65536, 16)
    space = SearchSpace(cp=[8, 16], micro_batch=[1])
    dropped = plan(problem, space, top=20)
    monkeypatch.setattr(dom, "dominated_splits",
                        lambda problem, arch, t: np.zeros(len(t), dtype=bool))
    whole = plan(problem, space, top=20)
    assert whole.n_layouts == dropped.n_layouts
    assert dropped.reject_counts.get("cp_split_dominated", 0) > 0
    keep = set(_keys(dropped.survivors.table))
    rest = [k for k in _keys(whole.survivors.table) if k in keep]
    assert rest == _keys(dropped.survivors.table)  # the same order, less the dropped rows
    assert len(rest) < len(whole.survivors)


def test_nothing_is_dropped_where_the_argument_does_not_hold():
    # a hybrid pattern, and a search asked for a launcher or ranked by robustness
    p = make_problem("nemotron-h-8b", "h100", 64, 32768, 64)
    t = enumerate_valid(p, SearchSpace(cp=[8])).table
    from autoparallel.cost.model_arch import build_arch
    assert not dominated_splits(p, build_arch(p.model), t).any()
    problem = make_problem("llama3-70b", "h100", 128, 65536, 16)
    space = SearchSpace(cp=[8, 16], micro_batch=[1])
    for kw in ({"target": "megatron"}, {"rank_by": "robust"}):
        res = plan(problem, space, top=3, **kw)
        assert "cp_split_dominated" not in res.reject_counts


def test_the_comparison_on_hand_made_costs(monkeypatch):
    # one group of five a2a+ring splits, one of two, a 1F1B row of another schedule (zb-h1)
    from autoparallel.layouts import LayoutTable

    n = 9
    cols = {c: np.ones(n, dtype=np.int64) for c in COLUMNS}
    cols |= {"cp": np.full(n, 16), "cc": np.full(n, 3),
             "cu": np.array([2, 4, 8, 2, 4, 2, 4, 2, 4]),
             "tp": np.array([1, 1, 1, 1, 1, 2, 2, 4, 4]),
             "sch": np.array([0, 0, 0, 0, 0, 0, 0, 2, 2])}
    cols["mb"][3:5] = 2  # rows 3, 4: their own group
    costs = np.array([  # (CP s at full 0, at full 1, buffer bytes) per row
        [1, 1, 1], [2, 2, 2], [1, 2, 1],   # row 1 beaten by row 0; row 2 beaten by row 0
        [1, 2, 3], [2, 1, 3],              # neither beats the other (full 0 vs full 1)
        [1, 1, 1], [1, 1, 1],              # tied: both kept
        [1, 1, 1], [9, 9, 9],              # zb-h1 rows: never compared
    ], dtype=float).T
    t = LayoutTable(cols, 80)
    lookup = {int(i): costs[:, i] for i in range(n)}
    order = {tuple(int(t[c][i]) for c in COLUMNS): i for i in range(n)}

    def fake(problem, arch, sub):
        idx = [order[tuple(int(sub[c][j]) for c in COLUMNS)] for j in range(len(sub))]
        return np.stack([lookup[i] for i in idx], axis=1)

    monkeypatch.setattr(dom, "cp_split_costs", fake)
    from autoparallel.cost.model_arch import build_arch
    p = make_problem("llama3-70b", "h100", 128, 65536, 16)
    got = dom.dominated_splits(p, build_arch(p.model), t)
    assert np.flatnonzero(got).tolist() == [1, 2]
    costs[1, 3] = 1.0  # row 3 now no worse than row 4 anywhere (and better at full 0)
    lookup[3] = costs[:, 3]
    assert np.flatnonzero(dom.dominated_splits(p, build_arch(p.model), t)).tolist() == [1, 2, 4]
    costs[:, 3], costs[:, 4] = [1, 2, 3], [1, 2, 2]  # equal seconds: the smaller buffers win
    lookup[3], lookup[4] = costs[:, 3], costs[:, 4]
    assert np.flatnonzero(dom.dominated_splits(p, build_arch(p.model), t)).tolist() == [1, 2, 3]


def test_the_plan_table_says_what_it_did_not_cost():
    from conftest import run_cli

    r = run_cli("plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "128", "--seq-len",
                "65536", "--global-batch", "16", "--cp", "8,16", "--micro-batch", "1", "--top", "3")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("not costed:"))
    n = int(line.split()[2].replace(",", ""))
    assert n > 0 and "cp_split_dominated" not in r.stdout


def test_the_packed_key_and_the_lexsort_group_alike(monkeypatch):
    # the grouping by one 64-bit key, and by all the columns where they need more bits
    problem = make_problem("llama3-70b", "h100", 128, 65536, 16)
    from autoparallel.cost.model_arch import build_arch
    arch = build_arch(problem.model)
    t = enumerate_valid(problem, SearchSpace(cp=[8, 16], micro_batch=[1], zero=[1],
                                             recompute=["none"])).table
    packed = dom.dominated_splits(problem, arch, t)
    monkeypatch.setattr(dom, "packed_key", lambda *a: None)
    assert packed.any() and np.array_equal(dom.dominated_splits(problem, arch, t), packed)
