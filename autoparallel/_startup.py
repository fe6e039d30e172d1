"""Ctrl-C or SIGTERM while the `autoparallel` program is still importing its modules: one line
and exit code 130, never a traceback. Installed by the package's first import when (and only
when) the process is the `autoparallel` command (`autoparallel ...` or `python -m
autoparallel`); the command line replaces these handlers as soon as it starts
(`cli/guard.py`). A library import changes nothing."""

from __future__ import annotations

import os
import signal
import sys


def _is_the_command() -> bool:
    argv = getattr(sys, "orig_argv", None) or sys.argv
    if argv and os.path.basename(argv[0]) == "autoparallel":
        return True
    if sys.argv and os.path.basename(sys.argv[0]) == "autoparallel":
        return True
    return "-m" in argv[:-1] and argv[argv.index("-m") + 1] == "autoparallel"


def _stop(signum, frame) -> None:
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    try:
        os.write(2, f"interrupted ({name}) while starting; nothing was done\n".encode())
    except OSError:
        pass
    os._exit(130)


def guard_startup() -> None:
    """Install the start-up handlers when this process is the `autoparallel` command."""
    try:
        if _is_the_command():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, _stop)
    except (ValueError, OSError, IndexError):  # not the main thread, or an odd argv
        pass
