"""The tuning study: storage, the Optuna study whose trials are measured layouts, its candidate
pool and its seeds (the worker loop is `loop.py`).

Storage: in memory by default; any SQLAlchemy URL Optuna accepts (`sqlite:///tune.db`,
`postgresql://user@host/db`) to share one study between workers and to resume it.

Workers: `tune` runs `workers` threads in this process; any number of processes on any hosts may
run the same command against the same storage. Each measurement is preceded by a claim
(`claims.py`), so no layout is measured twice. With a database storage every running trial
sends a heartbeat; before each new trial a worker fails the trials whose heartbeat is older than
the grace period (`optuna.storages.fail_stale_trials`) and Optuna's
`RetryHeartbeatStaleTrialCallback` enqueues a copy of each, which takes over the dead trial's
claim and measures the layout again. A rerun of the same command resumes the study: finished
trials stay, new layouts are measured.
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
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from ..errors import SpecError
from ..specs.problem import Problem
from .claims import MemoryClaims, SqlClaims, normalize_url
from .command import CommandTemplate
from ..search.storage_check import storage_message as _storage_message
from ..validation.plausible import fastest_step_s
from .pool import CandidatePool, CandidateSampler, make_base_sampler
from .runner import MetricParser

SEEDED = "__seeded__"  # claim key: the worker holding it enqueues the seed layouts
SEEDED_DONE = "__seeded_done__"
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
# heartbeats are sent by `loop._Heartbeat` (Optuna's own thread only runs inside optimize())
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")


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
    """Per-trial logs and configs; None: a new temporary directory, removed at the end unless
    `keep_workdir` (a directory given here is never removed)."""
    keep_workdir: bool = False
    env: Mapping[str, str] | None = None


def default_tune_study_name(problem: Problem) -> str:
    """`tune-<model>-<gpu>-<n>-<seq>-<batch>-<hash of the problem>`."""
    d = problem.describe()
    key = "-".join(str(d[k]) for k in ("model", "gpu", "n_gpus", "seq_len", "global_batch"))
    return f"tune-{key}-{problem_hash(problem)}"


def problem_hash(problem: Problem) -> str:
    return hashlib.sha1(problem.model_dump_json().encode()).hexdigest()[:8]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
            retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
            storage = RDBStorage(
                normalize_url(url), engine_kwargs=kwargs, heartbeat_interval=heartbeat_interval_s,
                grace_period=grace_period_s, heartbeat_stale_trial_callback=retry)
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
            raise SpecError(_storage_message(url, exc, "cannot open the Optuna storage")) from None
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
    """Trials this invocation measured."""
    stop: threading.Event = field(default_factory=threading.Event)
    """Set to stop the workers (Ctrl-C, SIGTERM, an error in one of them)."""
    fastest_s: float = 0.0
    """The least time a step of the problem can take (`validation.plausible.fastest_step_s`); faster
    measurements are refused as implausible."""
    recovering: threading.Lock = field(default_factory=threading.Lock)
    """Held by the one worker thread that, its own work done, waits for lost trials
    (`loop.recover_lost`)."""
    retries_owed: int = 0
    """Stale trials this invocation failed while asking for work (`loop.measure_one`): their
    retries are its to measure, its budget spent or not (`loop.run_workers`)."""

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
        raise SpecError(_storage_message(config.storage, exc,
                                         f"cannot create or load study {name!r}")) from None
    attrs = study.user_attrs
    phash = problem_hash(config.problem)
    if "problem_hash" in attrs and attrs["problem_hash"] != phash:
        raise SpecError(f"study {name!r} was created for another problem "
                        f"({attrs.get('problem')}); pick another `--study` name")
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
    session.fastest_s = fastest_step_s(config.problem)
    return session
