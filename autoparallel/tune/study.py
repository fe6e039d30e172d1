"""The tuning loop: an Optuna study (ask/tell) whose trials are measured layouts.

Storage: in memory by default; any SQLAlchemy URL Optuna accepts (`sqlite:///tune.db`,
`postgresql://user@host/db`) to share one study between workers and to resume it.

Workers: `tune` runs `workers` threads in this process; any number of processes on any hosts may
run the same command against the same storage. Each measurement is preceded by a claim
(`claims.py`), so no layout is measured twice. With a database storage every running trial
sends a heartbeat; before each new trial a worker fails the trials whose heartbeat is older than
the grace period (`optuna.storages.fail_stale_trials`) and Optuna's `RetryHeartbeatStaleTrialCallback`
enqueues a copy of each, which takes over the dead trial's claim and measures the layout again.
A rerun of the same command resumes the study: finished trials stay, new layouts are measured.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback, fail_stale_trials
from optuna.trial import TrialState

from ..errors import SpecError
from ..search.study import PARAM_AXES
from ..specs.problem import Problem
from .claims import MemoryClaims, SqlClaims, normalize_url, worker_id
from .command import CommandTemplate, layout_values, render_exports
from .pool import CandidatePool, CandidateSampler, make_base_sampler
from .runner import MetricParser, run_measurement

SEEDED = "__seeded__"  # claim key: the worker holding it enqueues the seed layouts
SEEDED_DONE = "__seeded_done__"
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@dataclass
class TuneConfig:
    """Everything `tune` needs besides the candidate pool."""

    problem: Problem
    template: CommandTemplate
    trials: int = 20
    """Measurements this invocation makes (shared by its worker threads)."""
    storage: str | None = None
    study_name: str | None = None
    metric: MetricParser = field(default_factory=lambda: MetricParser.compile(None))
    timeout_s: float = 900.0
    workers: int = 1
    seeds: int = 3
    sampler: str = "tpe"
    seed: int | None = None
    heartbeat_interval_s: int = 30
    grace_period_s: int = 120
    max_retry: int = 3
    workdir: Path | None = None
    env: Mapping[str, str] | None = None


def default_tune_study_name(problem: Problem) -> str:
    """`tune-<model>-<gpu>-<n>-<seq>-<batch>-<hash of the problem>`."""
    d = problem.describe()
    key = "-".join(str(d[k]) for k in ("model", "gpu", "n_gpus", "seq_len", "global_batch"))
    return f"tune-{key}-{problem_hash(problem)}"


def problem_hash(problem: Problem) -> str:
    return hashlib.sha1(problem.model_dump_json().encode()).hexdigest()[:8]


def open_storage(url: str | None, heartbeat_interval_s: int, grace_period_s: int, max_retry: int):
    """(Optuna storage, engine kwargs) for `url`; SpecError when it cannot be opened."""
    if url is None:
        return optuna.storages.InMemoryStorage(), None
    kwargs: dict = {}
    if url.startswith("sqlite"):
        kwargs = {"connect_args": {"timeout": 60}}
    elif url.startswith("postgresql"):
        kwargs = {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    for attempt in range(6):
        try:
            storage = RDBStorage(
                normalize_url(url), engine_kwargs=kwargs, heartbeat_interval=heartbeat_interval_s,
                grace_period=grace_period_s,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=max_retry))
            break
        except ImportError as exc:
            raise SpecError(f"`--storage` {url!r}: no database driver for this URL ({exc}); "
                            "for PostgreSQL: pip install 'autoparallel[postgres]'") from None
        except Exception as exc:  # bad URL, unreachable server, unwritable file, ...
            text = str(exc)
            # workers starting together on a fresh database race to create Optuna's schema:
            # the loser sees a conflict, and the schema is there when it tries again
            if attempt < 5 and ("IntegrityError" in type(exc).__name__ or "UNIQUE" in text
                                or "already exists" in text or "locked" in text):
                time.sleep(0.2 * (attempt + 1))
                continue
            first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            raise SpecError(f"`--storage` {url!r}: cannot open the Optuna storage ({first})") from None
    return storage, kwargs


@dataclass
class TuneSession:
    """An opened study with its pool, claims and sampler (shared by the worker threads)."""

    config: TuneConfig
    study: optuna.Study
    pool: CandidatePool
    claims: object
    rdb: RDBStorage | None
    workdir: Path
    log: Callable[[str], None]
    _budget: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    measured: int = 0

    def take_ticket(self) -> bool:
        with self._lock:
            if self._budget <= 0:
                return False
            self._budget -= 1
            return True

    def give_back_ticket(self) -> None:
        with self._lock:
            self._budget += 1


def open_session(config: TuneConfig, make_pool: Callable[[], CandidatePool],
                 log: Callable[[str], None] = lambda s: None) -> TuneSession:
    """Open (or create) the study, settle its candidate pool and enqueue the seeds once."""
    name = config.study_name or default_tune_study_name(config.problem)
    storage, kwargs = open_storage(config.storage, config.heartbeat_interval_s,
                                   config.grace_period_s, config.max_retry)
    try:
        study = optuna.create_study(storage=storage, study_name=name, direction="minimize",
                                    load_if_exists=True)
    except Exception as exc:
        raise SpecError(f"`--storage` {config.storage!r}: cannot create or load study {name!r} "
                        f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    attrs = study.user_attrs
    phash = problem_hash(config.problem)
    if "problem_hash" in attrs and attrs["problem_hash"] != phash:
        raise SpecError(f"study {name!r} was created for another problem ({attrs.get('problem')}); "
                        "pick another `--study` name")
    if "candidates" in attrs:
        from .pool import Candidate

        pool = CandidatePool([Candidate.from_attr(d) for d in attrs["candidates"]])
    else:
        pool = make_pool()
        study.set_user_attr("problem", config.problem.describe())
        study.set_user_attr("problem_hash", phash)
        study.set_user_attr("candidates", [c.to_attr() for c in pool.candidates])
    claims = (MemoryClaims() if config.storage is None
              else SqlClaims(config.storage, name, kwargs))
    n_seeds = min(config.seeds, len(pool))
    study.sampler = CandidateSampler(make_base_sampler(config.sampler, n_seeds, config.seed),
                                     pool, claims)
    if claims.claim(SEEDED, -1):
        for cand in pool.candidates[:n_seeds]:
            study.enqueue_trial(cand.params, user_attrs={"seed": True})
        claims.claim(SEEDED_DONE, -1)
    else:  # another worker seeds: give it a moment so its seeds are measured first
        deadline = time.time() + 30
        while claims.owner(SEEDED_DONE) is None and time.time() < deadline:
            time.sleep(0.1)
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="autoparallel-tune-"))
    rdb = storage if isinstance(storage, RDBStorage) else None
    session = TuneSession(config, study, pool, claims, rdb, Path(workdir), log)
    session._budget = config.trials
    return session


def _exhausted(s: TuneSession) -> bool:
    waiting = s.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    claimed = {k for k in s.claims.keys() if k in s.pool.by_slug}
    return not waiting and len(claimed) >= len(s.pool)


def _lost(trial: optuna.trial.FrozenTrial) -> bool:
    """A trial failed by the heartbeat check (its worker died), not by its measurement."""
    return trial.state == TrialState.FAIL and "failure" not in trial.user_attrs


def _hold_claim(s: TuneSession, slug: str, number: int) -> bool:
    """True when trial `number` holds (or could take over) the claim on `slug`."""
    if s.claims.claim(slug, number):
        return True
    owner = s.claims.owner(slug)
    if owner == number:
        return True
    if owner is None or owner < 0:
        return False
    prev = s.study.get_trials(deepcopy=False)
    prev_trial = next((t for t in prev if t.number == owner), None)
    return prev_trial is not None and _lost(prev_trial) and s.claims.transfer(slug, owner, number)


class _Heartbeat:
    """Records the trial's heartbeat every interval while the measurement runs."""

    def __init__(self, rdb: RDBStorage | None, trial_id: int, interval_s: float) -> None:
        self.rdb, self.trial_id, self.interval_s = rdb, trial_id, interval_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.interval_s):
            try:
                self.rdb.record_heartbeat(self.trial_id)
            except Exception:  # a transient database error must not kill the measurement
                pass

    def __enter__(self):
        if self.rdb is not None:
            self.rdb.record_heartbeat(self.trial_id)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()


def _drop(s: TuneSession, trial, reason: str, detail: str) -> None:
    """Finish a trial that measured nothing (no layout of its own) as failed, with the reason."""
    trial.set_user_attr("failure", reason)
    trial.set_user_attr("failure_detail", detail)
    s.study.tell(trial, state=TrialState.FAIL)


def measure_one(s: TuneSession) -> str:
    """Ask for a trial, claim its layout, run the command, tell the result.

    Returns "measured", "dropped" (the trial got no layout of its own and measured nothing) or
    "exhausted" (every pool layout is claimed)."""
    cfg = s.config
    fail_stale_trials(s.study)
    if _exhausted(s):
        return "exhausted"
    trial = s.study.ask()
    with _Heartbeat(s.rdb, trial._trial_id, cfg.heartbeat_interval_s):
        params = {a: trial.suggest_categorical(a, s.pool.distributions[a].choices)
                  for a in PARAM_AXES}
        cand = s.pool.find(params)
        if cand is None:
            _drop(s, trial, "not_a_candidate", f"params {params} are not in the candidate pool")
            return "dropped"
        if not _hold_claim(s, cand.slug, trial.number):
            _drop(s, trial, "duplicate",
                  f"{cand.slug} is claimed by trial {s.claims.owner(cand.slug)}; not measured")
            return "exhausted" if _exhausted(s) else "dropped"
        for k, v in (("layout", cand.slug), ("predicted_s", cand.predicted_s),
                     ("predicted_rank", cand.rank), ("memory_gib", cand.memory_gib),
                     ("worker", worker_id())):
            trial.set_user_attr(k, v)
        trial_dir = s.workdir / f"trial-{trial.number:05d}-{cand.slug}"
        trial_dir.mkdir(parents=True, exist_ok=True)
        values: dict = layout_values(cfg.problem, cand.layout, trial=trial.number,
                                     study=s.study.study_name, trial_dir=trial_dir,
                                     grad_accum=cand.grad_accum)
        values |= render_exports(cfg.template, cfg.problem, cand.layout, trial_dir)
        argv = cfg.template.render(values)
        env = dict(cfg.env) if cfg.env is not None else None
        s.log(f"trial {trial.number}: {cand.slug} (predicted {cand.predicted_s:.4g} s, "
              f"rank {cand.rank})")
        out = run_measurement(argv, timeout_s=cfg.timeout_s, metric=cfg.metric,
                              log_path=trial_dir / "output.log", env=env, cwd=None)
        trial.set_user_attr("wall_s", out.wall_s)
        trial.set_user_attr("log", str(out.log_path))
        if out.returncode is not None:
            trial.set_user_attr("returncode", out.returncode)
        if out.failure is None:
            s.study.tell(trial, out.step_time_s)
            s.log(f"trial {trial.number}: {cand.slug} measured {out.step_time_s:.4g} s")
        else:
            _drop(s, trial, out.failure, out.detail)
            s.log(f"trial {trial.number}: {cand.slug} failed ({out.failure}): {out.detail}")
    with s._lock:
        s.measured += 1
    return "measured"


def run_workers(s: TuneSession, max_drops: int = 50) -> None:
    """Run `config.workers` threads until the budget is spent or the pool is exhausted."""
    errors: list[BaseException] = []

    def work() -> None:
        drops = 0
        try:
            while drops < max_drops and s.take_ticket():
                status = measure_one(s)
                if status != "measured":
                    s.give_back_ticket()
                if status == "exhausted":
                    break
                drops = drops + 1 if status == "dropped" else 0
        except BaseException as exc:  # surfaced after the other threads stop
            errors.append(exc)
            with s._lock:
                s._budget = 0

    threads = [threading.Thread(target=work, name=f"w{i}") for i in range(max(1, s.config.workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
