"""Measured vs predicted: one row per trial of a tuning study, and the best measured layout."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import optuna
from optuna.trial import TrialState

from ..validation.plausible import implausible


@dataclass(frozen=True)
class TrialRow:
    """One trial as `tune` reports it."""

    number: int
    state: str
    """COMPLETE, FAIL, RUNNING or WAITING (Optuna's trial state)."""
    layout: str | None
    predicted_s: float | None
    predicted_rank: int | None
    measured_s: float | None
    error_pct: float | None
    """(predicted - measured) / measured x 100; negative = the model is optimistic."""
    failure: str | None
    """oom, crash, timeout, no_metric, implausible (a step time that cannot be one:
    `plausible`), duplicate, not_a_candidate, or `worker_lost` for a trial failed by the
    heartbeat check (its worker died; a retry measures the layout)."""
    detail: str | None
    retry_of: int | None
    """For a retry, the number of the first trial whose worker died measuring this layout."""
    worker: str | None
    wall_s: float | None

    def to_json(self) -> dict:
        return asdict(self)


def trial_row(t: optuna.trial.FrozenTrial, slug_of=None, fastest_s: float = 0.0) -> TrialRow:
    ua = t.user_attrs
    layout = ua.get("layout") or (slug_of(t.params) if slug_of else None)
    pred = ua.get("predicted_s")
    meas = t.value if t.state == TrialState.COMPLETE else None
    failure = ua.get("failure")
    detail = ua.get("failure_detail")
    state = t.state.name
    if t.state == TrialState.FAIL and failure is None:
        failure = "worker_lost"
    why = (implausible(meas, fastest_s=fastest_s, predicted_s=pred)
           if t.state == TrialState.COMPLETE else None)
    if why is not None:  # recorded as a result by an earlier version: not one
        state, failure, meas = "FAIL", "implausible", None
        detail = why + " (recorded as a result by an earlier version; not used)"
    err = (pred - meas) / meas * 100 if pred is not None and meas else None
    return TrialRow(
        number=t.number, state=state, layout=layout, predicted_s=pred,
        predicted_rank=ua.get("predicted_rank"), measured_s=meas, error_pct=err, failure=failure,
        detail=detail, retry_of=t.system_attrs.get("failed_trial"),
        worker=ua.get("worker"), wall_s=ua.get("wall_s"),
    )


def collect(study: optuna.Study, slug_of=None, fastest_s: float = 0.0) -> list[TrialRow]:
    """Every trial of the study, in trial order (a stored result that is `implausible` is
    reported as a failure)."""
    return [trial_row(t, slug_of, fastest_s) for t in study.get_trials(deepcopy=False)]


def best_row(rows: list[TrialRow]) -> TrialRow | None:
    """The fastest measured trial (ties: the better predicted rank), or None."""
    done = [r for r in rows if r.measured_s is not None]
    return min(done, key=lambda r: (r.measured_s, r.predicted_rank or 0)) if done else None

