"""The Optuna layer: survivors become trials of a study (bulk-added, values precomputed by the
vectorised model), so the ranking can be browsed in optuna-dashboard or resumed from storage; and
sampler-driven search (TPE with constraints, NSGA-II) for spaces too large to enumerate."""

from __future__ import annotations

import hashlib

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from ..errors import SpecError
from ..specs.layout import CP_COMM_NAMES, RECOMPUTE_NAMES, SCHEDULE_NAMES

PARAM_AXES = ("dp", "tp", "pp", "vp", "cp", "ep", "etp", "zero", "recompute", "sp",
              "micro_batch", "schedule", "first_stage_layers", "last_stage_layers", "cp_comm",
              "cp_a2a")
"""Optuna parameters of a layout; the stage-layer counts are 0 for the even split, `cp_comm`
the context-parallel form (`ring` when cp = 1), `cp_a2a` the hierarchical form's all-to-all
group (1 otherwise)."""

optuna.logging.set_verbosity(optuna.logging.WARNING)


def default_study_name(problem) -> str:
    d = problem.describe()
    key = "-".join(str(d[k]) for k in ("model", "gpu", "n_gpus", "seq_len", "global_batch"))
    return f"plan-{key}-{hashlib.sha1(problem.model_dump_json().encode()).hexdigest()[:8]}"


def _params(ev, i: int) -> dict:
    t = ev.table
    return {
        "dp": int(t["dp"][i]), "tp": int(t["tp"][i]), "pp": int(t["pp"][i]), "vp": int(t["vp"][i]),
        "cp": int(t["cp"][i]), "ep": int(t["ep"][i]),
        "etp": int(t["etp"][i]), "zero": int(t["zero"][i]),
        "recompute": RECOMPUTE_NAMES[int(t["rc"][i])].value, "sp": bool(t["sp"][i]),
        "micro_batch": int(t["mb"][i]),
        "schedule": SCHEDULE_NAMES[int(t["sch"][i])].value,
        "first_stage_layers": int(t["lf"][i]), "last_stage_layers": int(t["ll"][i]),
        "cp_comm": CP_COMM_NAMES[int(t["cc"][i]) if t["cp"][i] > 1 else 0].value,
        "cp_a2a": int(t["cu"][i]) if t["cp"][i] > 1 else 1,
    }


def _distributions(ev) -> dict:
    t = ev.table
    dist = {}
    for axis in PARAM_AXES:
        if axis == "recompute":
            choices = tuple(sorted({RECOMPUTE_NAMES[int(c)].value for c in np.unique(t["rc"])}))
        elif axis == "sp":
            choices = tuple(sorted({bool(v) for v in np.unique(t["sp"])}))
        elif axis == "schedule":
            choices = tuple(sorted({SCHEDULE_NAMES[int(c)].value for c in np.unique(t["sch"])}))
        elif axis == "cp_comm":  # the form code where cp > 1, ring (0) otherwise
            codes = np.unique(np.where(t["cp"] > 1, t["cc"], 0))
            choices = tuple(sorted({CP_COMM_NAMES[int(c)].value for c in codes}))
        elif axis == "cp_a2a":
            choices = tuple(int(v) for v in np.unique(np.where(t["cp"] > 1, t["cu"], 1)))
        else:
            col = {"micro_batch": "mb", "first_stage_layers": "lf",
                   "last_stage_layers": "ll"}.get(axis, axis)
            choices = tuple(int(v) for v in np.unique(t[col]))
        dist[axis] = CategoricalDistribution(choices)
    return dist


def study_from_survivors(result, keep: int, storage: str | None, study_name: str | None):
    """Create (or load) a study and bulk-add the best `keep` survivors as finished trials.

    Returns (study, number of trials added). A rerun against the same storage and study name
    adds nothing twice: layouts already stored are skipped.
    """
    ev = result.survivors
    n = min(keep, len(ev))
    name = study_name or default_study_name(result.problem)
    try:
        return _store(result, ev, n, storage, name)
    except SpecError:
        raise
    except Exception as exc:  # unreachable database, bad URL, corrupt or read-only file, ...
        from .storage_check import storage_message

        raise SpecError(storage_message(storage, exc, "cannot store the plan")) from None


def _store(result, ev, n: int, storage: str | None, name: str):
    from .storage_check import normalize_url  # postgresql:// with the driver installed

    study = optuna.create_study(storage=normalize_url(storage) if storage else None,
                                study_name=name, direction="minimize", load_if_exists=True)
    study.set_user_attr("problem", result.problem.describe())
    existing = {tuple(sorted(tr.params.items())) for tr in study.get_trials(deepcopy=False,
                                                                             states=(TrialState.COMPLETE,))}
    dist = _distributions(ev)
    cols = ev.columns()
    attr_keys = [k for k in cols if k.startswith(("mem_", "time_"))] + ["mfu", "tokens_per_s_per_gpu"]
    trials = []
    for i in range(n):
        params = _params(ev, i)
        if tuple(sorted(params.items())) in existing:
            continue
        attrs = {k: float(cols[k][i]) for k in attr_keys} | {"rank": i + 1}
        trials.append(create_trial(params=params, distributions=dist,
                                   value=float(ev.time["step"][i]), user_attrs=attrs))
    study.add_trials(trials)
    return study, len(trials)
