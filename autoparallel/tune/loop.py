"""The worker loop: ask a trial, hold the claim on its layout, send heartbeats, run the command,
tell the result.

The invariant behind "no layout measured twice": a command runs only for a trial that holds the
claim on its layout (`claims.py`). Claims are taken by the sampler (`pool.CandidateSampler`) for
proposed layouts, by `_hold_claim` for enqueued ones (the seeds), and moved only from a trial
whose worker died (failed by the heartbeat check, no `failure` attribute) to its retry.

Stopping: Ctrl-C or SIGTERM sets `TuneSession.stop`; running jobs are killed and their trials
are left RUNNING, so that with a database storage the heartbeat check fails them after the grace
period and a retry measures the layout again (an interrupted measurement is not a result).

Lost trials: a worker that has finished its own work (budget spent or pool exhausted) does not
leave while a trial it saw RUNNING might belong to a dead worker: it watches each until its
heartbeat moves (its worker is alive), it finishes, or it goes stale (no heartbeat for the grace
period); it fails the stale ones itself (Optuna's retry callback queues a copy of each) and
measures the retries, so that a lost trial does not wait for the next `tune` invocation when no
live worker remains. A trial that goes stale while a worker still has work is failed when that
worker next asks for a trial; the invocation then owes its retry and measures it before
leaving, whether or not its budget is spent. With live workers around, a finished worker lingers about one heartbeat
interval.
"""

from __future__ import annotations

import copy
import os
import threading
import time

import optuna
from optuna.storages import RDBStorage, fail_stale_trials
from optuna.trial import TrialState

from ..errors import AutoParallelError
from ..search.study import PARAM_AXES
from .claims import current_token, new_token, worker_id
from ..validation.plausible import implausible
from .command import layout_values, render_exports
from .runner import Interrupted, run_measurement
from .study import TuneSession


def _exhausted(s: TuneSession) -> bool:
    waiting = s.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    claimed = {k for k in s.claims.keys() if k in s.pool.by_slug}
    return not waiting and len(claimed) >= len(s.pool)


def _lost(trial: optuna.trial.FrozenTrial) -> bool:
    """A trial failed by the heartbeat check (its worker died), not by its measurement."""
    return trial.state == TrialState.FAIL and "failure" not in trial.user_attrs


def _hold_claim(s: TuneSession, slug: str, number: int) -> str:
    """Whether this attempt may measure `slug` for trial `number`: "held" when it holds the
    claim (the sampler took it, it takes it now, or it takes it over from a trial whose worker
    died); "other_attempt" when another worker runs this very trial (it popped the same queued
    trial); "taken" when another trial holds the layout."""
    if s.claims.claim(slug, number):
        return "held"
    owner = s.claims.owner(slug)
    if owner is None:
        return "taken"
    held_by, token = owner
    if held_by == number:
        return "held" if token == current_token() else "other_attempt"
    if held_by < 0:
        return "taken"
    prev = next((t for t in s.study.get_trials(deepcopy=False) if t.number == held_by), None)
    if prev is not None and _lost(prev) and s.claims.transfer(slug, held_by, number):
        return "held"
    owner = s.claims.owner(slug)  # lost the takeover race: was it to another attempt of ours?
    return "other_attempt" if owner is not None and owner[0] == number else "taken"


class _Heartbeat:
    """Records the trial's heartbeat every interval while it runs (database storage only)."""

    def __init__(self, rdb: RDBStorage | None, trial_id: int, interval_s: float) -> None:
        self.rdb, self.trial_id, self.interval_s = rdb, trial_id, interval_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # an interval beyond what a wait accepts (OverflowError) waits as long as it can
        interval = min(float(self.interval_s), threading.TIMEOUT_MAX)
        while not self.stop.wait(interval):
            try:
                self.rdb.record_heartbeat(self.trial_id)
            except Exception:  # a transient database error must not end the measurement
                pass

    def __enter__(self):
        if self.rdb is not None:
            self.rdb.record_heartbeat(self.trial_id)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()


def _drop(s: TuneSession, trial, reason: str, detail: str) -> None:
    """Finish a trial as failed, with the reason (`failure`) and detail as user attributes."""
    trial.set_user_attr("failure", reason)
    trial.set_user_attr("failure_detail", detail)
    s.study.tell(trial, state=TrialState.FAIL)


def measure_one(s: TuneSession) -> str:
    """Ask for a trial, claim its layout, run the command, tell the result.

    Returns "measured" (a result or a failure of the layout's own command), "dropped" (the trial
    got no layout of its own and ran nothing) or "exhausted" (every pool layout is claimed).
    Raises `Interrupted` when the session is stopped mid-measurement."""
    new_token()
    _fail_stale_owed(s)
    if _exhausted(s):
        return "exhausted"
    trial = s.study.ask()
    with _Heartbeat(s.rdb, trial._trial_id, s.config.heartbeat_interval_s):
        try:
            params = {a: trial.suggest_categorical(a, s.pool.distributions[a].choices)
                      for a in PARAM_AXES}
            cand = s.pool.find(params)
            if cand is None:
                _drop(s, trial, "not_a_candidate", f"params {params} are not in the pool")
                return "dropped"
            hold = _hold_claim(s, cand.slug, trial.number)
            if hold == "taken":
                owner = s.claims.owner(cand.slug)
                _drop(s, trial, "duplicate", f"{cand.slug} is claimed by trial "
                      f"{owner[0] if owner else '?'}; not measured")
                return "exhausted" if _exhausted(s) else "dropped"
        except optuna.exceptions.UpdateFinishedTrialError:
            hold = "other_attempt"  # another worker popped this queued trial and finished it
        if hold == "other_attempt":  # another worker runs this very trial: leave it alone
            return "dropped"
        _measure(s, trial, cand)
    with s._lock:
        s.measured += 1
    return "measured"


def _measure(s: TuneSession, trial, cand) -> None:
    """Render the command for `cand`, run it, and tell the outcome (the trial holds the claim)."""
    cfg = s.config
    for k, v in (("layout", cand.slug), ("predicted_s", cand.predicted_s),
                 ("predicted_rank", cand.rank), ("memory_gib", cand.memory_gib),
                 ("worker", worker_id())):
        trial.set_user_attr(k, v)
    trial_dir = claim_dir(s.workdir, f"trial-{trial.number:05d}-{cand.slug}")
    values: dict = layout_values(cfg.problem, cand.layout, trial=trial.number,
                                 study=s.study.study_name, trial_dir=trial_dir,
                                 grad_accum=cand.grad_accum)
    try:
        exported, export_env = render_exports(cfg.template, cfg.problem, cand.layout, trial_dir)
    except AutoParallelError as exc:  # e.g. a pool stored by a run with another template
        _drop(s, trial, "export", str(exc))
        s.log(f"trial {trial.number}: {cand.slug} cannot be rendered: {exc}")
        return
    argv = cfg.template.render(values | exported)
    env = dict(cfg.env if cfg.env is not None else os.environ) | export_env
    env |= {"AUTOPARALLEL_LAYOUT": cand.slug, "AUTOPARALLEL_TRIAL": str(trial.number),
            "AUTOPARALLEL_STUDY": s.study.study_name}
    s.log(f"trial {trial.number}: {cand.slug} (predicted {cand.predicted_s:.4g} s, "
          f"rank {cand.rank})")
    out = run_measurement(argv, timeout_s=cfg.timeout_s, metric=cfg.metric,
                          log_path=trial_dir / "output.log", env=env, stop=s.stop)
    try:
        _record(s, trial, cand, out)
    except optuna.exceptions.UpdateFinishedTrialError:
        # another worker failed this trial as stale (our heartbeats came later than --grace):
        # its retry owns the layout now, so this result is not recorded
        s.log(f"trial {trial.number}: {cand.slug}: declared lost by the heartbeat check while it "
              "ran (heartbeats late: raise --grace); the result goes unrecorded and the retry "
              "measures the layout")


def claim_dir(workdir, name: str):
    """A new directory `workdir/name` for one trial's files (`name-2`, `name-3`, ... when it
    exists): created exclusively, so no two tune processes sharing a --workdir (other studies,
    or an earlier run of an in-memory study) ever write or overwrite each other's logs."""
    workdir.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = workdir / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{workdir / name}: 9,999 directories of that name exist")


def _record(s: TuneSession, trial, cand, out) -> None:
    trial.set_user_attr("wall_s", out.wall_s)
    trial.set_user_attr("log", str(out.log_path))
    if out.returncode is not None:
        trial.set_user_attr("returncode", out.returncode)
    why = None if out.failure is not None else implausible(
        out.step_time_s, fastest_s=s.fastest_s, predicted_s=cand.predicted_s)
    if why is not None:
        _drop(s, trial, "implausible", why)
        s.log(f"trial {trial.number}: {cand.slug} failed (implausible): {why}")
    elif out.failure is None:
        s.study.tell(trial, out.step_time_s)
        s.log(f"trial {trial.number}: {cand.slug} measured {out.step_time_s:.4g} s")
    else:
        _drop(s, trial, out.failure, out.detail)
        s.log(f"trial {trial.number}: {cand.slug} failed ({out.failure}): {out.detail}")


def _fail_stale_owed(s: TuneSession) -> None:
    """Fail the stale trials before asking for work (Optuna's retry callback queues a retry of
    each); with a database storage, count the ones this call failed: their retries are this
    invocation's to measure, even when its budget runs out first (`run_workers`)."""
    if s.rdb is None:
        fail_stale_trials(s.study)
        return
    failed = _fail_stale(s)
    if failed:
        with s._lock:
            s.retries_owed += failed


def _owed_retry(s: TuneSession) -> bool:
    """True (and one owed retry fewer) while this invocation owes a retry and a retry waits in
    the queue, the next one `measure_one` asks for."""
    with s._lock:
        if s.retries_owed <= 0:
            return False
        s.retries_owed -= 1
    waiting = s.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    return any("failed_trial" in t.system_attrs for t in waiting)


def _running_beats(s: TuneSession) -> dict[int, object]:
    """Last heartbeat (None before the first) of every RUNNING trial of the study, by trial id,
    read from Optuna's heartbeat table as `RDBStorage._get_stale_trial_ids` reads it."""
    from optuna.storages._rdb import models

    session = s.rdb.scoped_session()
    try:
        rows = (session.query(models.TrialModel.trial_id, models.TrialHeartbeatModel.heartbeat)
                .outerjoin(models.TrialHeartbeatModel,
                           models.TrialHeartbeatModel.trial_id == models.TrialModel.trial_id)
                .filter(models.TrialModel.state == TrialState.RUNNING,
                        models.TrialModel.study_id == s.study._study_id).all())
    finally:
        session.close()
    return {tid: beat for tid, beat in rows}


def _fail_stale(s: TuneSession) -> int:
    """Fail the trials whose heartbeat is older than the grace period and queue their retries
    (what `optuna.storages.fail_stale_trials` does); returns how many *this* call failed (the
    state change is atomic, so of two workers failing one trial exactly one counts it)."""
    failed = 0
    callback = s.rdb.get_heartbeat_stale_trial_callback()
    for tid in s.rdb._get_stale_trial_ids(s.study._study_id):
        try:
            if not s.rdb.set_trial_state_values(tid, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        failed += 1
        if callback is not None:
            callback(s.study, copy.deepcopy(s.rdb.get_trial(tid)))
    return failed


def recover_lost(s: TuneSession) -> bool:
    """Wait for the trials RUNNING now until each shows its worker alive (its heartbeat moves)
    or finishes, or goes stale; True as soon as this worker has failed a stale one (its retry
    is queued for this worker to measure), False when none is left to wait for, or on stop.
    With live workers around this lingers about one heartbeat interval; a dead worker's trial
    keeps it until the grace period has passed."""
    if s.rdb is None:  # in memory: every worker is a thread of this process
        return False
    interval = float(s.config.heartbeat_interval_s)
    try:
        watch = _running_beats(s)
    except Exception:  # the heartbeat table could not be read: leave as before
        return False
    first_seen = time.monotonic()
    # a heartbeat stamped in the future (a skewed clock) never goes stale: stop waiting once a
    # normal one would have (grace period plus two intervals)
    give_up = first_seen + float(s.config.grace_period_s) + 2 * interval
    while watch and not s.stop.is_set() and time.monotonic() < give_up:
        if _fail_stale(s):
            return True
        try:
            now = _running_beats(s)
        except Exception:
            return False
        silent_too_long = time.monotonic() - first_seen > 2 * interval
        # alive (heartbeat moved), finished, or never beat at all (Optuna cannot fail those)
        watch = {tid: beat for tid, beat in watch.items()
                 if tid in now and now[tid] == beat and not (beat is None and silent_too_long)}
        if watch:
            s.stop.wait(max(0.05, interval / 4))
    return False


def run_workers(s: TuneSession, max_drops: int = 50) -> None:
    """Run `config.workers` threads until the budget is spent, the pool is exhausted, or the
    session is stopped (KeyboardInterrupt in the calling thread stops it and is re-raised)."""
    errors: list[BaseException] = []

    def work() -> None:
        drops = 0
        try:
            while drops < max_drops and not s.stop.is_set() and s.take_ticket():
                status = measure_one(s)
                if status != "measured":
                    s.give_back_ticket()
                if status == "exhausted":
                    break
                drops = drops + 1 if status == "dropped" else 0
            # own work done: one thread per process stays for trials of workers that died; it
            # first measures the retries of those it failed itself while asking for work
            if not s.stop.is_set() and s.recovering.acquire(blocking=False):
                try:
                    while (_owed_retry(s) or recover_lost(s)) and measure_one(s) == "measured":
                        pass
                finally:
                    s.recovering.release()
        except Interrupted:
            pass
        except BaseException as exc:  # surfaced after the other threads stop
            errors.append(exc)
            s.stop.set()

    threads = [threading.Thread(target=work, name=f"w{i}", daemon=True)
               for i in range(max(1, s.config.workers))]
    for t in threads:
        t.start()
    # poll rather than join: a signal interrupting Thread.join can leave the thread looking
    # finished while it still runs, and the workers must get to kill their jobs
    try:
        while any(t.is_alive() for t in threads):
            time.sleep(0.1)
    except KeyboardInterrupt:
        s.stop.set()
        deadline = time.monotonic() + 30
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise
    if errors:
        raise errors[0]
