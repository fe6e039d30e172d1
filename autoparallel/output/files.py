"""Writing outputs so that a failure says so and never leaves an empty or half file.

- `write_whole`: a whole-file output (plot, export, report, profile) goes to a temporary file
  in the target's directory, is flushed to the disk (`fsync`) and renamed over the target, so the
  target holds either its old content or the complete new one; the temporary file is removed on
  any failure. Streams (`/dev/null`, `/dev/stdout`, a pipe or a FIFO, any non-regular file) are
  written directly, without `fsync` (which they refuse).
- Every write, flush, fsync or close error becomes an `OutputError` (exit code 2) naming the
  flag, the path and the reason in plain words (`reason`).
- A FIFO is opened without blocking first: when no process reads it, a line on stderr says that
  the command waits for a reader (it never hangs silently).
- `strict_json`: JSON that strict parsers accept (`null` for a non-finite number).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import OutputError

_REASONS = {
    errno.ENOSPC: "no space left on the device, the disk is full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for the file-size limit or the file system",
    errno.EIO: "input/output error, the disk or the file system failed",
    errno.EPIPE: "the reading end of the pipe was closed",
    errno.EINVAL: "invalid argument, the file does not support this operation",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "no such file or directory",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EISDIR: "it is a directory",
    errno.ENXIO: "no process is reading the FIFO",
    errno.EAGAIN: "the output is not ready and would block",
    errno.ESTALE: "stale file handle, the network file system lost the file",
    errno.ENAMETOOLONG: "file name too long",
    errno.ETXTBSY: "the file is a running program",
    errno.EBADF: "the file descriptor is not open for writing",
    errno.ELOOP: "too many levels of symbolic links",
}
STREAM_PREFIXES = ("/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/")
"""Paths that name a stream of this process whatever they point to."""


def reason(exc: OSError) -> str:
    """The error of `exc` in plain words after its errno name: 'ENOSPC: no space left ...'."""
    code = exc.errno
    name = errno.errorcode.get(code, "") if code is not None else ""
    text = _REASONS.get(code) or (exc.strerror or str(exc) or type(exc).__name__).lower()
    return f"{name}: {text}" if name else text


def output_error(flag: str, path: str | os.PathLike | None, exc: OSError,
                 action: str = "cannot write") -> OutputError:
    """`OutputError`: "`--output` out.csv: cannot write (no space left on the device ...)"."""
    where = f"`{flag}` {path}" if flag and path is not None else (flag or str(path))
    return OutputError(f"{where}: {action} ({reason(exc)})")


def is_stream(path: str | os.PathLike) -> bool:
    """Whether `path` is a stream rather than a regular file: `/dev/stdout`-like names, or an
    existing non-regular file (character device such as /dev/null or /dev/full, FIFO, socket).
    A stream is written directly: no temporary file, no fsync, no resume."""
    text = str(path)
    if text.startswith(STREAM_PREFIXES):
        return True
    try:
        st = os.stat(text)
    except OSError:
        return False
    return not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode)


def _fd_of(text: str) -> int | None:
    """The descriptor a `/dev/stdout`-like name stands for, or None."""
    named = {"/dev/stdout": 1, "/dev/stderr": 2}
    if text in named:
        return named[text]
    for prefix in ("/dev/fd/", "/proc/self/fd/"):
        if text.startswith(prefix) and text[len(prefix):].isdigit():
            return int(text[len(prefix):])
    return None


def open_stream(flag: str, path: str | os.PathLike) -> int:
    """A file descriptor for writing the stream `path` (`is_stream`). `/dev/stdout` and the
    like duplicate this process's descriptor (its position and mode stay the shell's). A FIFO
    without a reader is first reported on stderr, then waited for (never a silent hang)."""
    text = str(path)
    try:
        fd = _fd_of(text)
        if fd is not None:
            return os.dup(fd)
        try:
            fifo = stat.S_ISFIFO(os.stat(text).st_mode)
        except OSError:
            fifo = False
        flags = os.O_WRONLY | os.O_CLOEXEC
        if fifo:
            try:
                return _blocking(os.open(text, flags | os.O_NONBLOCK))
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
            sys.stderr.write(f"waiting for a process to read the FIFO {text} ({flag}); "
                             "Ctrl-C to stop\n")
            sys.stderr.flush()
        return os.open(text, flags)
    except OSError as exc:
        raise output_error(flag, path, exc, "cannot open") from None


def _blocking(fd: int) -> int:
    os.set_blocking(fd, True)
    return fd


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` (os.write may write fewer)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(path: Path) -> None:
    """Flush the directory entry of a renamed file (best effort: some file systems refuse)."""
    try:
        fd = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_name(target: Path, suffix: str) -> Path:
    """`.<name>.<pid>-<random>.<suffix>` beside `target`: a temporary file of this process."""
    return target.with_name(f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.{suffix}")


def remove_stale_temps(target: Path) -> int:
    """Remove the temporary files (`temp_name`) that killed processes left beside `target`:
    those whose process no longer runs on this host. Returns how many were removed."""
    removed = 0
    prefix = f".{target.name}."
    try:
        names = os.listdir(target.parent if str(target.parent) else ".")
    except OSError:
        return 0
    for name in names:
        if not name.startswith(prefix) or not name.endswith((".tmp", ".new")):
            continue
        pid_text = name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # alive (or not ours to judge)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        try:
            os.unlink(target.with_name(name))
            removed += 1
        except OSError:
            pass
    return removed


def _target(path: Path) -> Path:
    """The file a rename must replace: the end of a symbolic link, so the link stays."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def write_whole(flag: str, path: str | os.PathLike, data: bytes | str, *,
                executable: bool = False) -> Path:
    """Write `data` as the whole content of `path` (see the module docstring). Raises
    `OutputError` with the flag, path and reason; the target is never left empty or half
    written. `executable` adds the execute bits (launch scripts)."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    p = Path(path)
    if is_stream(p):
        fd = open_stream(flag, p)
        try:
            write_all(fd, raw)
        except OSError as exc:
            raise output_error(flag, p, exc) from None
        finally:
            _close(fd, flag, p)
        return p
    target = _target(p)
    remove_stale_temps(target)
    tmp = temp_name(target, "tmp")
    try:
        old = os.stat(target).st_mode
    except OSError:
        old = None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                     0o777 if executable else 0o666)
    except OSError as exc:
        raise output_error(flag, p, exc) from None
    try:
        try:
            write_all(fd, raw)
            os.fsync(fd)
            if old is not None:  # keep the target's permissions
                os.fchmod(fd, stat.S_IMODE(old) | (0o111 & ~_umask() if executable else 0))
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as exc:
        _unlink(tmp)
        raise output_error(flag, p, exc) from None
    except BaseException:
        _unlink(tmp)
        raise
    fsync_dir(target)
    return p


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _close(fd: int, flag: str, path) -> None:
    try:
        os.close(fd)
    except OSError as exc:
        raise output_error(flag, path, exc) from None


@contextmanager
def writing(flag: str, path: str | os.PathLike) -> Iterator[None]:
    """Turn any OSError inside the block into an `OutputError` naming `flag` and `path`."""
    try:
        yield
    except OSError as exc:
        raise output_error(flag, path, exc) from None


def finite_or_none(obj):
    """`obj` with every non-finite float (NaN, +-inf) replaced by None, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    if hasattr(obj, "dtype") and hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return finite_or_none(obj.item())  # a numpy scalar
    return obj


def strict_json(obj, indent: int | None = 2) -> str:
    """JSON text that strict parsers accept: NaN and infinities become `null`."""
    return json.dumps(finite_or_none(obj), indent=indent, allow_nan=False)


def save_figure(fig, flag: str, path: str | os.PathLike, dpi: int) -> Path:
    """Render a matplotlib figure in memory (format from the suffix: png, svg, pdf) and write
    it whole (`write_whole`)."""
    import io

    fmt = Path(path).suffix.lower().lstrip(".") or "png"
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi)
    return write_whole(flag, path, buf.getvalue())
