"""One writer per output: an advisory lock (`flock`) on the output file itself.

The kernel releases the lock when its holder's last descriptor closes, so a crashed or killed
holder cannot leave it stuck, and no lock file is left behind. A second writer is refused with
the holder named (its pid and command line, from /proc/locks where the system has it), or waits
for it (`wait=True`). A file that is replaced by a rename while a writer waits is locked anew
(the lock belongs to the old file).

A missing output is created holding its first bytes (the CSV header) in one step: the bytes go
to a temporary file that is hard-linked into place, so the output never exists empty.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import OutputError
from .files import output_error, remove_stale_temps, temp_name, write_all


def holder_of(fd: int) -> str:
    """Who holds the lock on the file of `fd`: 'pid 123 (autoparallel sweep ...)', or 'another
    process' when the system does not say."""
    try:
        st = os.fstat(fd)
        dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            pids = [line.split()[4] for line in f
                    if len(line.split()) > 5 and line.split()[5] == dev
                    and "->" not in line.split()[1]]
    except (OSError, IndexError):
        pids = []
    me = str(os.getpid())
    pids = [p for p in pids if p.isdigit() and p != me]
    if not pids:
        return "another process (on this or another host)"
    pid = pids[0]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return f"pid {pid}"
    names = [os.path.basename(a) for a in argv]
    if "autoparallel" in names:  # `python .../autoparallel sweep` or `python -m autoparallel`
        argv = ["autoparallel"] + argv[names.index("autoparallel") + 1:]
    cmd = " ".join(argv)
    cmd = cmd if len(cmd) <= 100 else cmd[:97] + "..."
    return f"pid {pid}, {cmd}" if cmd else f"pid {pid}"


def _create(path: Path, initial: bytes, flag: str) -> None:
    """Create `path` holding `initial`, never empty: a temporary file linked into place. Another
    process creating it first is fine (it holds the same first bytes)."""
    tmp = temp_name(path, "new")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            write_all(fd, initial)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            try:  # a file system without hard links: create exclusively, then write
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            except FileExistsError:
                return
            try:
                write_all(fd, initial)
                os.fsync(fd)
            except OSError:
                os.close(fd)
                os.unlink(path)
                raise
            os.close(fd)
    except OSError as exc:
        raise output_error(flag, path, exc) from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def lock_output(path: Path, flag: str, *, initial: bytes, wait: bool = False,
                say: Callable[[str], None] | None = None) -> int:
    """Open `path` for reading and writing and take its exclusive lock; returns the descriptor
    (close it to release the lock). A missing file is created holding `initial`.

    Raises:
        OutputError: another process holds the lock (and `wait` is False), or the file cannot
            be opened or created.
    """
    say = say or (lambda text: (sys.stderr.write(text + "\n"), sys.stderr.flush()))
    told = False
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            _create(path, initial, flag)
            continue
        except OSError as exc:
            raise output_error(flag, path, exc, "cannot open") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = holder_of(fd)
                if not wait:
                    raise OutputError(
                        f"`{flag}` {path}: another writer holds it ({holder}); two sweeps on "
                        "one file would write its problems twice. Wait for it to finish, give "
                        "another --output, or rerun with --wait to continue after it") from None
                if not told:
                    say(f"waiting for {holder} to finish writing {path} (--wait)")
                    told = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    raise output_error(flag, path, exc, "cannot lock") from None
                say(f"warning: {path}: the file system cannot lock files ({exc.strerror}); "
                    "make sure no other sweep writes it")
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                remove_stale_temps(path)  # what killed writers left (we hold the lock now)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # replaced while we waited: lock the file now at the path


def lock_fd(fd: int) -> None:
    """Take the exclusive lock of a file nobody else knows yet (a replacement being written)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass
