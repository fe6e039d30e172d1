"""Sampler-driven search for spaces too large to enumerate (e.g. a free GPU count): Optuna's
TPE (one objective, with a constraints function for memory and rules) or NSGA-II (several
objectives) propose layouts; the same vectorised cost model scores each batch of proposals.

Constraints follow Optuna's contract (`Trial.set_constraint`: values > 0 mean violated):
[GiB over the usable memory, number of rules broken].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import optuna

from ..cost.model_arch import build_arch
from ..evaluate import evaluate
from ..layouts import LayoutTable
from ..rules import Reject, active_rules
from ..specs.layout import CP_COMM_CODES, RECOMPUTE_CODES, CpComm
from ..specs.problem import Problem
from ..units import GiB
from .enumerate import cp_forms, divisors
from .space import SearchSpace

OBJECTIVES = ("time", "memory", "gpus")
INFEASIBLE_VALUE = 1e9  # objective given to layouts that cannot be costed (e.g. dp not whole)


@dataclass
class SampledResult:
    study: optuna.Study
    n_trials: int
    best: dict | None
    """Best feasible trial's params and values (first objective), or None."""
    trials_to_within: dict[float, int | None]
    """Trials needed to come within each tolerance of `reference` (when one was given)."""


def axis_candidates(problem: Problem, space: SearchSpace, max_gpus: int, rules) -> dict[str, list]:
    """Per-axis choices, pre-filtered by the rules that concern one axis alone (heads and
    placement for tp, layers for pp, sequence for cp), as in the design's "rule-filtered per-axis
    candidates"; the sampler's space is their product, a superset of the valid layouts."""
    m, tr, c = problem.model, problem.training, problem.cluster
    names = {r.name for r in rules}
    div = [int(d) for d in divisors(max_gpus)]
    kv = m.kv_heads
    tp = [t for t in (space.tp or div) if m.n_heads % t == 0 and (kv % t == 0 or t % kv == 0)]
    if "tp_in_node" in names:
        tp = [t for t in tp if t <= c.nvlink_domain and c.nvlink_domain % t == 0]
    pp = [p for p in (space.pp or div) if m.n_layers % p == 0]
    cp = [x for x in (space.cp or div) if x == 1 or tr.seq_len % (2 * x) == 0]
    if not cp_forms(problem, space):  # a stack without context parallelism keeps cp = 1
        cp = [1]
    ep = [int(d) for d in divisors(m.moe.n_experts)] if m.moe else [1]
    mb = [int(d) for d in divisors(tr.global_batch) if d <= space.max_micro_batch]
    return {
        "tp": tp or [1], "pp": pp or [1], "cp": cp or [1], "ep": space.ep or ep,
        "zero": space.zero or [0, 1, 2, 3],
        "recompute": [r.value for r in (space.recompute or RECOMPUTE_CODES)],
        "sp": space.sp if space.sp is not None else [True, False],
        "micro_batch": space.micro_batch or mb,
    }


def vp_choices(problem: Problem, space: SearchSpace, pp: int) -> list[int]:
    """Virtual stages valid for a pipeline degree (layers divisible by pp x vp)."""
    if pp == 1:
        return [1]
    per = problem.model.n_layers // pp
    auto = [int(d) for d in divisors(per) if d <= space.max_vp]
    return [v for v in (space.vp or auto) if per % v == 0] or [1]


def sample_search(
    make_problem_for: Callable[[int], Problem],
    gpu_counts: Sequence[int],
    space: SearchSpace | None = None,
    *,
    objectives: Sequence[str] = ("time",),
    n_trials: int = 500,
    batch: int = 16,
    seed: int | None = 0,
    rules=None,
    storage: str | None = None,
    study_name: str | None = None,
    reference: float | None = None,
) -> SampledResult:
    """Search layouts (and GPU counts) with an Optuna sampler driving the vectorised model.

    Args:
        make_problem_for: builds the `Problem` for a GPU count.
        gpu_counts: GPU counts to choose from (one value: a fixed count).
        objectives: "time" alone (TPE) or "time" with "memory"/"gpus" (NSGA-II).
        n_trials, batch: total trials; proposals scored together per batch.
        reference: a known optimum step time, to report trials needed to come within 1/2/5%.
    """
    space = space or SearchSpace()
    rules = active_rules() if rules is None else rules
    for o in objectives:
        if o not in OBJECTIVES:
            raise ValueError(f"unknown objective {o!r}; choose from {OBJECTIVES}")
    problems = {n: make_problem_for(n) for n in gpu_counts}
    base = problems[max(gpu_counts)]
    arch = build_arch(base.model)
    cands = axis_candidates(base, space, max(gpu_counts), rules)

    if len(objectives) == 1:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(50, n_trials // 5),
                                             multivariate=True, group=True)
        study = optuna.create_study(sampler=sampler, direction="minimize", storage=storage,
                                    study_name=study_name, load_if_exists=True)
    else:
        sampler = optuna.samplers.NSGAIISampler(seed=seed)
        study = optuna.create_study(sampler=sampler, directions=["minimize"] * len(objectives),
                                    storage=storage, study_name=study_name, load_if_exists=True)

    best_so_far = np.inf
    within = {tol: None for tol in (0.01, 0.02, 0.05)}
    done = 0
    while done < n_trials:
        k = min(batch, n_trials - done)
        trials = [study.ask() for _ in range(k)]
        rows = []
        for tr in trials:
            p = {a: tr.suggest_categorical(a, c) for a, c in cands.items()}
            # define-by-run: vp is a different parameter for each pipeline degree
            p["vp"] = (tr.suggest_categorical(f"vp_pp{p['pp']}", vp_choices(base, space, p["pp"]))
                       if p["pp"] > 1 else 1)
            n = tr.suggest_categorical("n_gpus", list(gpu_counts)) if len(gpu_counts) > 1 else gpu_counts[0]
            rows.append((n, p))
        values = _score(rows, problems, arch, rules, [f for f in cp_forms(base, space)])
        for tr, (vals, cons, attrs) in zip(trials, values):
            for key, v in attrs.items():
                tr.set_user_attr(key, v)
            tr.set_user_attr("constraints", cons)
            tr.set_constraint("memory_excess_gib", cons[0])
            tr.set_constraint("rules_broken", cons[1])
            obj = [vals[o] for o in objectives]
            study.tell(tr, obj[0] if len(obj) == 1 else obj)
            done += 1
            if reference and all(c <= 0 for c in cons):
                best_so_far = min(best_so_far, vals["time"])
                for tol in within:
                    if within[tol] is None and best_so_far <= reference * (1 + tol):
                        within[tol] = done
    feasible = [t for t in study.trials if t.values is not None
                and all(c <= 0 for c in t.user_attrs.get("constraints", [1]))]
    best = None
    if feasible:
        b = min(feasible, key=lambda t: t.values[0])
        best = {"params": b.params, "values": b.values, "user_attrs": b.user_attrs}
    return SampledResult(study, done, best, within if reference else {})


def _form_variants(cp: int, forms) -> list[tuple[int, int]]:
    """(form code, all-to-all group) of every context-parallel form a proposal with degree `cp`
    can run: each of the stack's forms, the hierarchical one once per split (1 < u < cp, u | cp);
    cp = 1: the one row (0, 1)."""
    if cp == 1:
        return [(0, 1)]
    out = []
    for f in forms:
        if f == CpComm.A2A_RING:
            out += [(CP_COMM_CODES[f], u) for u in range(2, cp) if cp % u == 0]
        else:
            out.append((CP_COMM_CODES[f], 1))
    return out or [(0, 1)]


def _score(rows, problems, arch, rules, forms):
    """Evaluate proposals grouped by GPU count; returns (values, constraints, attrs) per row.
    The context-parallel form is searched inside each proposal: every form (and hierarchical
    split) of the stack is costed in the same vectorised pass and the proposal takes the best
    (fewest rules broken, then least memory excess, then fastest; `attrs` say which), so the
    sampler's parameters stay the degrees and the form adds no dimension to sample."""
    out = [None] * len(rows)
    by_n: dict[int, list[int]] = {}
    for i, (n, _) in enumerate(rows):
        by_n.setdefault(n, []).append(i)
    for n, idx in by_n.items():
        problem = problems[n]
        cols = {k: [] for k in ("dp", "tp", "pp", "vp", "cp", "ep", "zero", "rc", "sp", "mb",
                                "cc", "cu")}
        owner = []
        for i in idx:
            p = rows[i][1]
            mp = p["tp"] * p["pp"] * p["cp"]
            for cc, cu in _form_variants(p["cp"], forms):
                owner.append(i)
                cols["dp"].append(max(1, n // mp))
                for a in ("tp", "pp", "vp", "cp", "ep", "zero"):
                    cols[a].append(p[a])
                cols["rc"].append(RECOMPUTE_CODES[p["recompute"]])
                cols["sp"].append(int(p["sp"] and p["tp"] > 1))
                cols["mb"].append(p["micro_batch"])
                cols["cc"].append(cc)
                cols["cu"].append(cu)
        table = LayoutTable.from_arrays(**{k: np.asarray(v) for k, v in cols.items()})
        ev = evaluate(problem, table, rules, arch=arch)
        best: dict[int, tuple] = {}
        for j, i in enumerate(owner):
            flags = int(ev.reject[j])
            broken = bin(flags & ~int(Reject.OOM)).count("1")
            excess = max(0.0, float(ev.memory["fit_peak"][j] - ev.memory["usable"][j]) / GiB)
            step = float(ev.time["step"][j])
            if broken or not np.isfinite(step):
                step = INFEASIBLE_VALUE
            key = (broken, excess, step)
            if i not in best or key < best[i][0]:
                best[i] = (key, j)
        for i, ((broken, excess, step), j) in best.items():
            vals = {"time": step, "memory": float(ev.memory["total"][j]) / GiB, "gpus": float(n)}
            attrs = {"dp": int(ev.table["dp"][j]), "mfu": float(ev.mfu[j]) if broken == 0 else 0.0,
                     "layout": ev.table.row(j).slug}
            out[i] = (vals, [excess, float(broken)], attrs)
    return out
