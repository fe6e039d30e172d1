"""Claims: the uniqueness mechanism of `tune` — a layout is measured by the one trial that holds
its claim, and a claim is taken by an atomic insert.

With a database storage the claims live in the same database as the Optuna study, in a table
`autoparallel_tune_claims` with primary key (study, key). Two workers — threads, processes or
hosts — that try to claim the same layout race on one INSERT; the database lets exactly one
succeed (the other gets a primary-key violation and moves on to another layout). Nothing is
checked and then written, so there is no window between the check and the claim.

A claim names the trial *and the execution* holding it: the trial number plus a token unique to
one attempt of one worker (`new_token`). The token matters because Optuna cannot always give a
queued trial to one worker only: on SQLite, which ignores SELECT ... FOR UPDATE, two workers can
both pop the same enqueued trial. Both then see their own trial number on the claim, but only
the one whose token is on it runs the command; the other leaves the trial alone.

A claim moves only by compare-and-swap (`transfer`: UPDATE ... WHERE trial_number = old), which
`tune` uses for one purpose: the retry of a trial whose worker died (heartbeat lost) takes over
the dead trial's claim. In-memory studies use a dict under a lock instead.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

from sqlalchemy import (
    Column, Float, Integer, MetaData, String, Table, create_engine, insert, select, update,
)
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from ..search.storage_check import normalize_url

TABLE_NAME = "autoparallel_tune_claims"


def worker_id() -> str:
    """`host:pid:thread` of the caller (recorded with each claim and trial)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"


_local = threading.local()


def new_token() -> str:
    """Start a new attempt in this thread: claims taken from now on carry a fresh token."""
    _local.token = f"{worker_id()}:{uuid.uuid4().hex[:12]}"
    return _local.token


def current_token() -> str:
    """The token of this thread's current attempt."""
    return getattr(_local, "token", None) or new_token()


class MemoryClaims:
    """Claims for a single process (in-memory study)."""

    def __init__(self) -> None:
        self._owners: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()

    def claim(self, key: str, trial_number: int) -> bool:
        """Claim `key` for `trial_number` and this attempt; False when someone holds it."""
        with self._lock:
            if key in self._owners:
                return False
            self._owners[key] = (trial_number, current_token())
            return True

    def owner(self, key: str) -> tuple[int, str] | None:
        """(trial number, attempt token) holding `key`, or None."""
        with self._lock:
            return self._owners.get(key)

    def transfer(self, key: str, old: int, new: int) -> bool:
        """Move `key` from trial `old` to trial `new` (this attempt) if `old` still holds it."""
        with self._lock:
            if key not in self._owners or self._owners[key][0] != old:
                return False
            self._owners[key] = (new, current_token())
            return True

    def keys(self) -> set[str]:
        """Every claimed key."""
        with self._lock:
            return set(self._owners)


class SqlClaims:
    """Claims in a table of the study's database (SQLite, PostgreSQL, MySQL via SQLAlchemy)."""

    def __init__(self, url: str, study: str, engine_kwargs: dict | None = None) -> None:
        self.study = study
        self.engine = create_engine(normalize_url(url), **(engine_kwargs or {}))
        meta = MetaData()
        self.table = Table(
            TABLE_NAME, meta,
            Column("study", String(512), primary_key=True),
            Column("key", String(512), primary_key=True),
            Column("trial_number", Integer, nullable=False),
            Column("token", String(300)),
            Column("claimed_at", Float),
        )
        for attempt in range(5):  # several workers may create the table at the same moment
            try:
                meta.create_all(self.engine, checkfirst=True)
                break
            except (IntegrityError, OperationalError, ProgrammingError):
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    def _write(self, stmt) -> int | None:
        """Run one write in its own transaction; rowcount, or None on a key conflict.
        SQLite's 'database is locked' is retried."""
        for attempt in range(50):
            try:
                with self.engine.begin() as conn:
                    return conn.execute(stmt).rowcount
            except IntegrityError:
                return None
            except OperationalError as exc:
                if "locked" not in str(exc).lower() or attempt == 49:
                    raise
                time.sleep(0.05 * (1 + attempt % 10))
        return None

    def claim(self, key: str, trial_number: int) -> bool:
        """Claim `key` for `trial_number` and this attempt (one INSERT); False when someone
        holds it already."""
        stmt = insert(self.table).values(study=self.study, key=key, trial_number=trial_number,
                                         token=current_token(), claimed_at=time.time())
        return self._write(stmt) == 1

    def owner(self, key: str) -> tuple[int, str] | None:
        """(trial number, attempt token) holding `key`, or None."""
        t = self.table
        with self.engine.connect() as conn:
            row = conn.execute(select(t.c.trial_number, t.c.token).where(
                t.c.study == self.study, t.c.key == key)).first()
        return None if row is None else (int(row[0]), str(row[1]))

    def transfer(self, key: str, old: int, new: int) -> bool:
        """Compare-and-swap: move `key` from trial `old` to trial `new` (this attempt) if `old`
        still holds it."""
        t = self.table
        stmt = (update(t).where(t.c.study == self.study, t.c.key == key, t.c.trial_number == old)
                .values(trial_number=new, token=current_token(), claimed_at=time.time()))
        return self._write(stmt) == 1

    def keys(self) -> set[str]:
        """Every claimed key of this study."""
        t = self.table
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(select(t.c.key).where(t.c.study == self.study))}

    def close(self) -> None:
        self.engine.dispose()
