"""`tune`: measure the layouts the cost model ranks best, with an Optuna study, and learn from
the measurements which one is really fastest.

Modules: `command` (the `--measure` template), `runner` (one measurement as a subprocess),
`claims` (no layout measured twice), `pool` (candidates and the sampler), `study` (storage,
the study, seeding), `loop` (the ask/tell worker loop, heartbeats), `results` (measured vs
predicted), `calibrate` (a small profile refit).

Example:
    >>> from autoparallel import make_problem
    >>> from autoparallel.tune import TuneConfig, tune
    >>> from autoparallel.tune.command import CommandTemplate
    >>> cfg = TuneConfig(make_problem("llama3-8b", "h100", 8, 4096, 64),
    ...                  CommandTemplate.parse("python train.py --tp {tp} --pp {pp}"), trials=5)
    >>> result = tune(cfg)   # doctest: +SKIP
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ExportError, InfeasibleError, SpecError
from ..search.plan import plan
from ..search.space import SearchSpace
from .calibrate import Calibration, fit_profile
from .command import CommandTemplate, render_exports
from .pool import CandidatePool
from .results import TrialRow, best_row, collect
from .loop import run_workers
from .study import TuneConfig, TuneSession, open_session

__all__ = ["TuneConfig", "TuneResult", "tune", "CommandTemplate", "TrialRow"]


@dataclass
class TuneResult:
    """Every trial of the study (this run's and earlier ones), the best measured layout, and the
    refitted profile when calibration was asked for."""

    study_name: str
    storage: str | None
    n_candidates: int
    measured_now: int
    """Layouts this invocation measured."""
    rows: list[TrialRow]
    """Every trial that ran or runs (trials still waiting in the queue are left out)."""
    best: TrialRow | None
    calibration: Calibration | None = None
    warnings: list[str] = field(default_factory=list)
    """Implausible measurements (faster than the GPUs' peak allows), a constant ratio between
    measured and predicted times and what to check, knobs a refit pinned at a bound."""
    calibration_refused: str | None = None
    """Why `--calibrate` fitted nothing (measurements no GPU can produce), else None."""
    workdir: str | None = None
    """Where the per-trial logs are (None: a temporary directory that was removed)."""
    waiting: int = 0
    """Enqueued trials that no worker started (left for a later run)."""

    def to_json(self) -> dict:
        return {
            "study": self.study_name, "storage": self.storage,
            "n_candidates": self.n_candidates, "measured_now": self.measured_now,
            "best": self.best.to_json() if self.best else None,
            "trials": [r.to_json() for r in self.rows],
            "calibration": self.calibration.to_json() if self.calibration else None,
            "calibration_refused": self.calibration_refused,
            "warnings": list(self.warnings), "workdir": self.workdir, "waiting": self.waiting,
        }


def build_pool(config: TuneConfig, n_candidates: int, space: SearchSpace | None = None,
               rules=None) -> CandidatePool:
    """Plan the problem and keep the `n_candidates` fastest predicted layouts that every
    launcher the template renders can express."""
    targets = config.template.exporter_targets
    if targets:  # search only the schedules and splits every rendered launcher can write
        from ..exporters import get_exporter
        from ..specs.layout import Schedule

        space = space or SearchSpace()
        exps = [get_exporter(t) for t in targets]
        space = space.narrowed(
            schedule=[s for s in (space.schedule or list(Schedule))
                      if all(s in e.schedules for e in exps)],
            uneven=space.uneven and all(e.uneven_splits for e in exps))
    result = plan(config.problem, space, rules=rules, top=1)
    if result.n_fit == 0:
        from ..search.explain import nothing_fits_message

        raise InfeasibleError(nothing_fits_message(result))

    def expressible(layout) -> bool:
        try:
            render_exports(config.template, config.problem, layout, None)
            return True
        except ExportError:
            return False

    keep = expressible if config.template.exporter_targets else None
    pool, refused = CandidatePool.from_survivors(result.survivors, n_candidates, keep)
    if not len(pool):
        raise SpecError(f"none of the fitting layouts can be expressed by "
                        f"{', '.join(sorted(config.template.exporter_targets))} "
                        f"({refused} refused); drop those placeholders or widen the space")
    return pool


def tune(config: TuneConfig, *, candidates: int = 48, space: SearchSpace | None = None,
         rules=None, calibrate: bool = False,
         log: Callable[[str], None] = lambda s: None) -> TuneResult:
    """Measure up to `config.trials` layouts of the pool and report every trial of the study.

    Raises:
        SpecError: bad storage, a study made for another problem, an inexpressible template.
        InfeasibleError: no layout fits.
    """
    if config.trials < 0 or candidates < 1 or config.workers < 1:
        raise SpecError("`--trials` must be >= 0, `--candidates` and `--workers` >= 1")
    session: TuneSession = open_session(
        config, lambda: build_pool(config, candidates, space, rules), log)
    remove = config.workdir is None and not config.keep_workdir
    log(f"trial logs and configs: {session.workdir}"
        + (" (a temporary directory, removed at the end; --keep-workdir keeps it)"
           if config.workdir is None else ""))
    try:
        run_workers(session)
        return _result(session, calibrate, None if remove else str(session.workdir))
    finally:  # whatever ends the run (an error, Ctrl-C), the directory tune made goes
        if remove:
            shutil.rmtree(session.workdir, ignore_errors=True)


def _result(session: TuneSession, calibrate: bool, workdir: str | None) -> TuneResult:
    """Every trial that ran, the plausibility notes, the refit (when asked for)."""
    from ..validation.plausible import constant_ratio, faster_than_peak

    config = session.config
    slug_of = lambda p: (c.slug if (c := session.pool.find(p)) else None)  # noqa: E731
    every = collect(session.study, slug_of, session.fastest_s)
    rows = [r for r in every if r.state != "WAITING"]
    measured = [(r.layout or f"trial {r.number}", r.measured_s) for r in rows
                if r.measured_s is not None]
    too_fast = faster_than_peak(config.problem, measured)
    notes = list(too_fast)
    ratio = constant_ratio([(r.measured_s, r.predicted_s) for r in rows
                            if r.measured_s is not None and r.predicted_s])
    if ratio:
        notes.append(ratio)
    cal, refused = None, None
    if calibrate:
        from ..specs.layout import Layout

        pairs = [(Layout.from_slug(r.layout), r.measured_s) for r in rows
                 if r.measured_s is not None and r.layout]
        bogus = [r for r in rows if r.failure == "implausible"]
        if len(pairs) < 2 and bogus:  # the trials failed as no measurement (validation/plausible.py)
            refused = (f"{len(bogus)} trial(s) read step times that are no measurement (trial "
                       f"{bogus[0].number}: {bogus[0].detail}); no efficiency knob explains "
                       "more than 100 % MFU or a unit mix-up: fix the measurement (--measure, "
                       "--metric-regex) before calibrating")
        elif len(pairs) < 2:
            raise SpecError(f"`--calibrate` needs at least 2 measured layouts; the study has "
                            f"{len(pairs)}")
        elif too_fast:
            refused = ("measurements faster than the GPUs' peak allows (more than 100 % MFU) "
                       "cannot be explained by any efficiency knob: fix the measurement (see "
                       "the warning) before calibrating")
        else:
            from .calibrate import pinned_knobs

            cal = fit_profile(config.problem, pairs)
            notes += pinned_knobs(cal)
    return TuneResult(session.study.study_name, config.storage, len(session.pool),
                      session.measured, rows, best_row(rows), cal, notes, refused, workdir,
                      waiting=len(every) - len(rows))
