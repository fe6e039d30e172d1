"""Command line: `autoparallel estimate | plan | sweep | export | schema | presets ...`.

Every command module registers itself on `app`. `main()` turns every `AutoParallelError` into a
readable message on stderr and exit code 2; no traceback unless AUTOPARALLEL_DEBUG=1.
"""

from __future__ import annotations

import os
import sys
import warnings

import typer

from ..errors import AutoParallelError, InfeasibleError, InputWarning

app = typer.Typer(
    name="autoparallel",
    help="Plan data x tensor x pipeline x context x expert parallelism for transformer training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from . import estimate_cmd, info_cmd  # noqa: F401  (modules register their commands)

    for optional in ("plan_cmd", "sweep_cmd", "export_cmd", "validate_cmd", "tune_cmd", "capacity_cmd"):
        try:
            __import__(f"{__name__}.{optional}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{optional}":
                raise


def err(message: str) -> None:
    """Print an error message on stderr."""
    try:
        for i, line in enumerate(str(message).splitlines() or [""]):
            sys.stderr.write(("error: " if i == 0 else "  ") + line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr itself is gone: the exit code still says it
        pass


def _show_warning(message, category, filename, lineno, file=None, line=None,
                  _default=warnings.showwarning) -> None:
    """`InputWarning`s as one `warning:` line on stderr; others as Python prints them."""
    if issubclass(category, InputWarning):
        sys.stderr.write(f"warning: {message}\n")
    else:
        _default(message, category, filename, lineno, file, line)


def main(argv: list[str] | None = None, *, restore_signals: bool = True) -> int:
    """Entry point of the `autoparallel` console script (`restore_signals`: put the signal
    handlers back afterwards, for a command run inside another program)."""
    from . import guard

    previous = guard.install()  # Ctrl-C and SIGTERM: one line and exit 130 (cli/guard.py)
    try:
        return _main(argv, guard)
    finally:
        if restore_signals:
            guard.restore(previous)


def _main(argv, guard) -> int:
    warnings.showwarning = _show_warning
    debug = os.environ.get("AUTOPARALLEL_DEBUG") == "1"
    try:
        _register()
        for info in app.registered_commands:  # an OSError in a command: exit 2, not 70
            if not getattr(info.callback, "__wrapped_by_guard__", False):
                info.callback = guard.guarded(info.callback)
                info.callback.__wrapped_by_guard__ = True
        app(args=argv, standalone_mode=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        if code == 130:
            guard.report_interrupt()
        elif code == 0 and guard._stdout_failed():
            guard.silence_stdout()
            err("standard output: cannot write (the output was cut short)")
            return 2
        return code
    except InfeasibleError as exc:
        if debug:
            raise
        err(str(exc))
        return 1
    except AutoParallelError as exc:
        if debug:
            raise
        err(str(exc))
        return 2
    except KeyboardInterrupt:
        guard.report_interrupt()
        return 130
    except OSError as exc:  # outside a command (start-up, argument parsing)
        if debug:
            raise
        err(str(guard.as_output_error(exc)))
        return 2
    except Exception as exc:  # a bug: say so in one line, keep the traceback for --debug runs
        if debug:
            raise
        err(f"internal error ({type(exc).__name__}: {exc}); rerun with AUTOPARALLEL_DEBUG=1 "
            "for a traceback and report it")
        return 70
    return 0


def run() -> None:
    """Console-script wrapper. Once the command is done, a late Ctrl-C or SIGTERM has nothing
    left to stop: it is ignored while the interpreter exits (else it would kill the finished
    process with the signal's status)."""
    code = main(restore_signals=False)
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if code == 130:
        # CPython marks a KeyboardInterrupt raised inside exec/eval'd code (dataclass and
        # namedtuple creation while modules import) as unhandled even when it was caught, and
        # `python -m` then kills the process with SIGINT at exit instead of exiting 130: the
        # interrupt is reported and every file closed, so leave now with the code we said
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(130)
    sys.exit(code)
