"""A throwaway PostgreSQL server on loopback, for the concurrency tests and for `.ci/run`.

    python tests/pgserver.py start DIR   # prints the URL; the cluster lives in DIR
    python tests/pgserver.py stop DIR

The server listens on 127.0.0.1 at a free port, with its socket in DIR, trust authentication
(loopback only; the cluster is deleted with DIR) and fsync off (test data). PostgreSQL refuses to
run as root, so under root the server runs as an unprivileged user (`postgres` if it exists,
else `nobody`) through `runuser`; DIR is handed to that user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """PostgreSQL cannot be started here (no binaries, no unprivileged user, start failed)."""


def find_binary(name: str) -> str | None:
    """`name` on PATH, else in the newest /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                   key=lambda p: [int(x) for x in p.split("/")[4].split(".") if x.isdigit()])
    return cands[-1] if cands else None


def _as_user() -> tuple[list[str], pwd.struct_passwd | None]:
    """Command prefix to drop root, and the user (None when not root)."""
    if os.geteuid() != 0:
        return [], None
    runuser = shutil.which("runuser") or shutil.which("setpriv")
    for name in ("postgres", "nobody"):
        try:
            user = pwd.getpwnam(name)
        except KeyError:
            continue
        if runuser and runuser.endswith("runuser"):
            return [runuser, "-u", name, "--"], user
        if runuser:
            return [runuser, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                    "--clear-groups"], user
    raise PostgresUnavailable("running as root and found no runuser/setpriv or no unprivileged "
                              "user (postgres, nobody) to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], timeout: float = 120) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise PostgresUnavailable(f"{' '.join(cmd[:4])}... failed: {(r.stderr or r.stdout).strip()[-500:]}")


def start(base: Path) -> str:
    """Initialise and start a cluster in `base`; returns its SQLAlchemy URL."""
    initdb, pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
    if not initdb or not pg_ctl:
        raise PostgresUnavailable("initdb/pg_ctl not found (install PostgreSQL server binaries)")
    prefix, user = _as_user()
    base = Path(base).resolve()
    base.mkdir(parents=True, exist_ok=True)
    data, sock = base / "data", base / "sock"
    sock.mkdir(exist_ok=True)
    if user is not None:
        os.chmod(base, 0o711)  # the server user must reach its directory (parents: e.g. /tmp)
        for p in (base, sock):
            os.chown(p, user.pw_uid, user.pw_gid)
    _run([*prefix, initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
          "--no-sync", "--no-instructions"])
    port = _free_port()
    opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {sock} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
    _run([*prefix, pg_ctl, "-D", str(data), "-o", opts, "-l", str(base / "server.log"), "-w",
          "-t", "60", "start"])
    (base / "url").write_text(f"postgresql://postgres@127.0.0.1:{port}/postgres")
    return (base / "url").read_text()


def stop(base: Path) -> None:
    """Stop the cluster in `base` (immediate shutdown)."""
    pg_ctl = find_binary("pg_ctl")
    prefix, _ = _as_user()
    if pg_ctl and (Path(base) / "data").exists():
        subprocess.run([*prefix, pg_ctl, "-D", str(Path(base) / "data"), "-m", "immediate",
                        "-w", "stop"], capture_output=True, timeout=60)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: pgserver.py start|stop DIR")
    try:
        if sys.argv[1] == "start":
            print(start(Path(sys.argv[2])))
        else:
            stop(Path(sys.argv[2]))
    except (PostgresUnavailable, OSError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"pgserver: {exc}")
