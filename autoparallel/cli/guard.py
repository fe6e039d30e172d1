"""Signals and I/O errors at the edge of the command line.

- Ctrl-C (SIGINT) and SIGTERM (what Slurm sends before the kill at the time limit) stop a
  command the same way: a `KeyboardInterrupt` in the main thread. The command (or, when it has
  nothing to add, `main`) prints one line saying what was kept and how to resume, and the exit
  code is 130; never a traceback.
- An `OSError` escaping a command (a full disk, a closed pipe, an I/O error) is exit code 2 with
  the path and the reason in plain words, never an internal error. When standard output itself
  failed, it is pointed at /dev/null so that nothing else is reported at exit.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
import threading

from ..errors import OutputError

_state = {"signal": None, "reported": False}
NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


def _handler(signum, frame):
    _state["signal"] = signum
    raise KeyboardInterrupt


def install() -> dict:
    """Route SIGINT and SIGTERM to `KeyboardInterrupt` (main thread only); returns the handlers
    they replace (for `restore`)."""
    _state["signal"], _state["reported"] = None, False
    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, _handler)
    return old


def restore(old: dict) -> None:
    """Put back the handlers `install` replaced (a command run inside another program)."""
    for sig, handler in old.items():
        try:
            signal.signal(sig, handler)
        except (ValueError, TypeError, OSError):
            pass


def signal_name() -> str:
    return NAMES.get(_state["signal"], "Ctrl-C")


def interrupted(what: str) -> None:
    """The one line of an interrupted command: 'interrupted (SIGTERM): <what>'."""
    _say(f"interrupted ({signal_name()}): {what}")
    _state["reported"] = True


def report_interrupt() -> None:
    """The line for a command that said nothing itself when it was interrupted."""
    if not _state["reported"]:
        interrupted("stopped before finishing; files are written whole, so none is left "
                    "half-written")


def _say(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _stdout_failed() -> bool:
    """Whether standard output cannot take the bytes it holds."""
    try:
        sys.stdout.flush()
        return False
    except (OSError, ValueError):
        return True


def _writing_stdout(exc: BaseException) -> bool:
    """Whether `exc` was raised writing standard output: a frame near where it was raised
    holds sys.stdout (click's echo, `print`, a rich Console writing its `file`)."""
    streams = {id(s) for s in (sys.stdout, sys.__stdout__) if s is not None}
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames[-4:]):
        for value in frame.f_locals.values():
            if id(value) in streams or id(getattr(value, "file", None)) in streams:
                return True
    return False


def silence_stdout() -> None:
    """Point the standard output descriptor at /dev/null: what is left in its buffer goes
    nowhere instead of failing again at exit."""
    try:
        if sys.stdout is None or sys.stdout.fileno() != 1:
            return  # a captured stream (a command run inside another program)
    except (OSError, ValueError, AttributeError):
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass


def as_output_error(exc: OSError) -> OutputError:
    """An OSError as the readable `OutputError` main reports (exit 2)."""
    from ..output.files import output_error

    if exc.filename is not None:
        return output_error("", exc.filename, exc, "I/O error")
    if exc.errno == errno.EPIPE or _writing_stdout(exc) or _stdout_failed():
        silence_stdout()
        return output_error("", "standard output", exc, "cannot write")
    return output_error("", "input/output", exc, "failed")


def guarded(fn):
    """Wrap a command's function: an OSError it raises becomes an `OutputError` before the
    command-line framework sees it (which would end a closed pipe with a silent exit 1)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OSError as exc:
            raise as_output_error(exc) from None
    return run
