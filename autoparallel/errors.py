"""Error hierarchy. Bad input raises one of these; the CLI turns them into one line and exit 2.

Infeasible layouts are never exceptions: they are rows with reject flags (see `rules.py`).
"""

from __future__ import annotations


class AutoParallelError(Exception):
    """Base class for every error autoparallel raises on purpose."""


class SpecError(AutoParallelError, ValueError):
    """A model, GPU, cluster, job or layout specification is malformed or impossible."""


class InfeasibleError(AutoParallelError):
    """No layout fits; carries a human-readable account of the nearest misses."""

    def __init__(self, message: str, nearest: list | None = None):
        super().__init__(message)
        self.nearest = nearest or []


class ExportError(AutoParallelError):
    """A launcher cannot express the requested layout."""


class OutputError(AutoParallelError):
    """An output cannot be written (disk full, I/O error, a closed pipe, a file that is not
    ours, another writer holding it); the message names the path and the reason."""


class InputWarning(UserWarning):
    """An input was accepted but part of it is not modelled (e.g. a Hugging Face config field
    that changes cost). The CLI prints it as one `warning:` line on stderr."""


def format_validation_error(exc, source: str) -> str:
    """Turn a pydantic ValidationError into readable lines: `field` (value): why."""
    if not hasattr(exc, "errors"):  # a plain ValueError raised while building the spec
        return f"{source}: {exc}"
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
        msg = err.get("msg", "invalid")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            msg = "unknown key (not allowed here)"
        if not loc:  # a check across fields: its message names the fields itself
            lines.append(f"{source}: {msg}")
            continue
        if kind == "missing":
            lines.append(f"{source}: `{loc}` is required but missing")
            continue
        value = err.get("input")
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        lines.append(f"{source}: `{loc}` = {shown}: {msg}")
    return "\n".join(lines)
