"""Command line: `autoparallel estimate | plan | sweep | export | schema | presets ...`.

The commands are registered by name (`COMMANDS`) and a command's module is imported only when
that command runs or prints its help, so `autoparallel --help` loads neither numpy nor pandas nor
Optuna. `main()` turns every `AutoParallelError` into a readable message on stderr and exit code
2; no traceback unless AUTOPARALLEL_DEBUG=1.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Annotated

import typer

from ..errors import AutoParallelError, InfeasibleError, InputWarning
from .help import HelpCommand, LazyGroup


@dataclass(frozen=True)
class CommandEntry:
    """A command as the top-level help lists it, and where it lives."""

    module: str
    """Module of `autoparallel.cli` that defines it (imported on first use)."""
    summary: str
    """One line: the command's help in `autoparallel --help` and the first line of its own."""
    details: str
    """Where the details are (README section or docs page)."""
    panel: str
    """Help panel of the command's own options that declare none (`cli.help`)."""


COMMANDS: dict[str, CommandEntry] = {
    "plan": CommandEntry("plan_cmd", "Rank every layout that fits, fastest first, and explain "
                         "the winner.", "README.md#plan", "Search"),
    "estimate": CommandEntry("estimate_cmd", "Memory per GPU and time per step of one layout "
                             "(or of every row of a CSV).", "README.md#estimate", "Layout"),
    "sweep": CommandEntry("sweep_cmd", "Plan a grid of problems into one CSV (one row per "
                          "problem and ranked layout).", "README.md#sweep", "Problem"),
    "export": CommandEntry("export_cmd", "Write the launcher file of one layout (Megatron, "
                           "TorchTitan, DeepSpeed, Nanotron, Slurm).", "docs/export.md", "Export"),
    "capacity": CommandEntry("capacity_cmd", "Days, GPU-hours, cost and energy to train a token "
                             "budget, per GPU kind and count.", "README.md#capacity", "Capacity"),
    "tune": CommandEntry("tune_cmd", "Measure the best predicted layouts with a real command; "
                         "report measured vs predicted.", "README.md#tuning", "Tuning"),
    "validate": CommandEntry("validate_cmd", "Predict measured runs and report the error per "
                             "source and overall.", "docs/validation.md", "Validation"),
    "calibrate": CommandEntry("validate_cmd", "Fit one GPU's efficiency knobs to measured runs "
                              "and write a profile file.", "README.md#validate-and-calibrate",
                              "Calibration"),
    "presets": CommandEntry("info_cmd", "List the built-in model, GPU or software-stack "
                            "presets.", "README.md#commands", "Options"),
    "schema": CommandEntry("info_cmd", "Print the JSON Schema of an input spec or of a JSON "
                           "output.", "README.md#commands", "Options"),
}
"""Every command, in the order `autoparallel --help` lists them."""


app = typer.Typer(
    name="autoparallel",
    cls=LazyGroup,
    help="Plan data x tensor x pipeline x context x expert parallelism for transformer training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def command(name: str):
    """Register the decorated function as command `name` (its summary from `COMMANDS`; the
    function's docstring, when it has more than one paragraph, adds the details)."""
    entry = COMMANDS[name]

    def decorate(fn):
        doc = (fn.__doc__ or "").strip().split("\n\n", 1)
        more = doc[1].strip() if len(doc) > 1 else ""
        help_text = entry.summary + (f"\n\n{more}" if more else "") + f"\n\nDetails: {entry.details}"
        from .guard import guarded  # an OSError in a command: exit 2, not 70

        app.command(name, help=help_text, cls=HelpCommand)(guarded(fn))
        return fn

    return decorate


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"autoparallel {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.",
                                          is_eager=True, callback=_version)] = False,
) -> None:
    """Plan data x tensor x pipeline x context x expert parallelism for transformer training."""


def load_command(name: str):
    """The Typer registration (`CommandInfo`) of command `name`, importing its module."""
    importlib.import_module(f"{__name__}.{COMMANDS[name].module}")
    return next(c for c in app.registered_commands if c.name == name)


def _register() -> None:
    """Import every command's module (tests that invoke `app` directly; `main` needs none)."""
    for name in COMMANDS:
        load_command(name)


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
    left to stop: it is ignored while the process exits (else it would kill the finished
    process with the signal's status). The process then runs its exit handlers, flushes its
    output and leaves without the interpreter's teardown (below)."""
    code = main(restore_signals=False)
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # The command is done and has said everything: leave without tearing the interpreter down.
    # Freeing every module, class and cached schema one by one at exit (PEP 3121 module
    # finalisation, then the garbage collector over what is left) takes ~0.1 s here after
    # numpy, pandas and pydantic are loaded: a sixth of a small `plan`. What an exit must still
    # do is done first: the exit handlers (`atexit`, which also runs `weakref.finalize`
    # callbacks such as temporary directories' clean-up) and the buffered output. Also for
    # 130: CPython marks a KeyboardInterrupt raised inside exec/eval'd code (dataclass and
    # namedtuple creation while modules import) as unhandled even when it was caught, and
    # `python -m` then kills the process with SIGINT at exit instead of exiting 130.
    import atexit

    run_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's; absent elsewhere
    if run_handlers is None and code != 130:
        sys.exit(code)  # an interpreter without it: the usual exit, teardown and all
    try:
        if run_handlers is not None:
            run_handlers()
    except BaseException:  # a failing handler must not turn a finished command into a crash
        pass
    for stream in (sys.stdout, sys.stderr):  # click.echo and rich flush their own writes;
        try:                                   # this is for any other writer
            stream.flush()
        except (OSError, ValueError):
            if stream is sys.stdout and code == 0:
                err("standard output: cannot write (the output was cut short)")
                code = 2
    os._exit(code)
