"""Two-objective fronts: step time vs memory (one GPU count) and step time vs GPU count."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..evaluate import Evaluation
from ..specs.problem import Problem
from ..frontier import pareto_front
from .plan import PlanResult, plan


@dataclass
class Front:
    """Pareto-optimal layouts, fastest first; `second` names the other objective."""

    second: str
    points: list[dict]
    """Estimate records (plus `rank`, and `n_gpus` for the GPU front)."""
    study: object | None = None


def gpu_counts(max_gpus: int, gpus_per_node: int) -> list[int]:
    """Candidate GPU counts up to `max_gpus`: powers of two below a node, then whole nodes
    doubling (gpus_per_node x 2^k), and `max_gpus` itself."""
    counts = {n for n in (1, 2, 4) if n < gpus_per_node and n <= max_gpus}
    n = gpus_per_node
    while n <= max_gpus:
        counts.add(n)
        n *= 2
    counts.add(max_gpus)
    return sorted(counts)


def time_memory_front(problem: Problem, space=None, rules=None) -> tuple[Front, PlanResult]:
    """Layouts no other layout beats on both step time and memory."""
    res = plan(problem, space, rules=rules, top=1)
    ev: Evaluation = res.survivors
    if len(ev) == 0:
        return Front("memory", []), res
    idx = pareto_front(ev.time["step"], ev.memory["total"])
    front = ev.take(idx)
    return Front("memory", [{"rank": i + 1, **front.record(i)} for i in range(len(front))]), res


def time_gpus_front(make_for, max_gpus: int, gpus_per_node: int, space=None, rules=None) -> Front:
    """Best layout per GPU count, keeping counts that are faster than every smaller count."""
    best = []
    for n in gpu_counts(max_gpus, gpus_per_node):
        res = plan(make_for(n), space, rules=rules, top=1)
        if res.n_fit:
            best.append((n, res.ranked.record(0)))
    points, fastest = [], np.inf
    for n, rec in best:
        if rec["time_s"]["step"] < fastest:
            fastest = rec["time_s"]["step"]
            points.append(rec)
    points = sorted(points, key=lambda r: r["time_s"]["step"])
    return Front("gpus", [{"rank": i + 1, **r} for i, r in enumerate(points)])


def add_front_to_study(front: Front, storage: str | None, study_name: str | None):
    """Store a front as finished trials of a two-objective Optuna study."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import create_trial

    try:
        study = optuna.create_study(storage=storage, study_name=study_name,
                                    directions=["minimize", "minimize"], load_if_exists=True)
        trials = _front_trials(front, create_trial, CategoricalDistribution)
        study.add_trials(trials)
    except Exception as exc:  # unreachable database, bad URL, corrupt or read-only file, ...
        from ..errors import SpecError
        from .storage_check import storage_message

        raise SpecError(storage_message(storage, exc, "cannot store the front")) from None
    front.study = study
    return study


def _front_trials(front: Front, create_trial, CategoricalDistribution) -> list:
    trials = []
    for rec in front.points:
        params = {k: v for k, v in rec["layout"].items() if k != "grad_accum"} | {"n_gpus": rec["n_gpus"]}
        dist = {k: CategoricalDistribution((v,)) for k, v in params.items()}
        second = rec["memory_gib"]["total"] if front.second == "memory" else float(rec["n_gpus"])
        trials.append(create_trial(params=params, distributions=dist,
                                   values=[rec["time_s"]["step"], second]))
    return trials
