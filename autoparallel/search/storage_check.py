"""Say what is wrong with an SQLite storage that Optuna cannot open: not a database, a corrupt
file, a foreign schema (tables of another program, or of a different Optuna schema), or
read-only. Used only after opening failed, to replace the database driver's message (which for
a foreign schema is Optuna's "exceeding max length" commit error)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

SQLITE_MAGIC = b"SQLite format 3\x00"


def normalize_url(url: str) -> str:
    """`postgresql://...` with the psycopg2 driver when psycopg (3), SQLAlchemy 2.1's default
    PostgreSQL driver, is not installed but psycopg2 (the `postgres` extra) is."""
    if url.startswith("postgresql://"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            try:
                import psycopg2  # noqa: F401
            except ImportError:
                return url
            return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def sqlite_path(url: str) -> Path | None:
    """The file of an `sqlite:///path` URL (None for other URLs and in-memory databases)."""
    if not url.startswith("sqlite:"):
        return None
    rest = url.split(":", 1)[1]
    if not rest.startswith("///"):
        return None
    path = rest[3:].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


def _optuna_tables() -> dict[str, set[str]]:
    from optuna.storages._rdb import models

    return {name: {c.name for c in table.columns}
            for name, table in models.BaseModel.metadata.tables.items()}


def diagnose(url: str) -> str | None:
    """What is wrong with the SQLite file of `url`, in plain words, or None when nothing is
    found (or the URL is not an SQLite file)."""
    path = sqlite_path(url)
    if path is None:
        return None
    folder = path.parent if str(path.parent) else Path(".")
    if not path.exists():
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            return f"the directory {str(folder)!r} is read-only, so the database cannot be created"
        return None
    if path.is_dir():
        return f"{str(path)!r} is a directory, not a database file"
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        return f"the file cannot be read ({exc.strerror})"
    if head and head != SQLITE_MAGIC:
        return (f"not an SQLite database (it starts {head[:12]!r}): a corrupt file or another "
                "program's")
    if not head:
        return None  # empty: SQLite makes a database of it
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            check = con.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                return f"a corrupt SQLite file (its integrity check says: {check})"
            names = [r[0] for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
            tables = {n: {r[1] for r in con.execute(f'PRAGMA table_info("{n}")')} for n in names}
            version = None
            if "alembic_version" in tables:
                row = con.execute("SELECT version_num FROM alembic_version").fetchone()
                version = row[0] if row else None
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        return f"a corrupt SQLite file ({exc})"
    reference = _optuna_tables()
    for name, want in reference.items():
        if name in tables and not want <= tables[name]:
            missing = ", ".join(sorted(want - tables[name]))
            return (f"a foreign schema: its table `{name}` lacks Optuna's column(s) {missing}, "
                    "so the database belongs to another program or another Optuna schema")
    if version is not None:
        known = _known_versions()
        if known and version not in known:
            return (f"a foreign schema: its schema version {version!r} is not one Optuna "
                    "knows (another program's database, or a newer Optuna's)")
    if not os.access(path, os.W_OK) or not os.access(folder, os.W_OK | os.X_OK):
        return "read-only (the file or its directory cannot be written)"
    return None


def _known_versions() -> set[str]:
    """Schema revisions Optuna's migrations define."""
    try:
        import optuna.storages._rdb as rdb

        folder = Path(rdb.__file__).parent / "alembic" / "versions"
        out = set()
        for f in folder.glob("*.py"):
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.startswith("revision ="):
                    out.add(line.split("=", 1)[1].strip().strip("'\""))
        return out
    except OSError:
        return set()


def read_only_hint(exc: BaseException) -> str | None:
    """'read-only ...' when a database error says so."""
    text = str(exc).lower()
    if "readonly" in text or "read-only" in text or "read only" in text:
        return "read-only (the file or its directory cannot be written)"
    return None


def storage_message(url: str | None, exc: BaseException, action: str) -> str:
    """"`--storage` URL: <action>: <what is wrong>" (`diagnose`, else the driver's first
    line)."""
    why = (diagnose(url) if url else None) or read_only_hint(exc)
    if why:
        return (f"`--storage` {url!r}: {action}: {why}; give another storage, or move the file "
                "away to start a new study")
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"`--storage` {url!r}: {action} ({first})"
