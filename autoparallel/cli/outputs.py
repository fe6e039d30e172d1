"""Output paths checked before any work, so that a finished search or tuning study is never
lost to a typo in `--output`, `--plot` or `--profile-out`."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SpecError

PLOT_SUFFIXES = (".png", ".svg", ".pdf")
"""Plot formats matplotlib writes without extra backends."""


def check_output(flag: str, path: str | None, *, plot: bool = False,
                 suffixes: tuple[str, ...] = ()) -> None:
    """Raise a SpecError naming `flag` unless `path` can be written: not a directory, in an
    existing writable directory, and (for plots, or when `suffixes` are given) with a known
    extension. None (no output requested) passes."""
    if path is None:
        return
    if not str(path).strip():
        raise SpecError(f"`{flag}` is empty: give a file path")
    p = Path(path)
    try:  # first: a directory is no file, whatever its name ends with
        _check_writable(flag, path, p)
    except OSError as exc:  # a name too long for the file system, a loop of links, ...
        raise SpecError(f"`{flag}` = {short_path(path)!r}: cannot be written here "
                        f"({exc.strerror or exc}); give a shorter or other path") from None
    known = PLOT_SUFFIXES if plot else suffixes
    if known and p.suffix.lower() not in known:
        raise SpecError(f"`{flag}` = {short_path(path)!r}: unknown file type {p.suffix or '(none)'!r}; "
                        f"use {', '.join(known)}")


def short_path(path) -> str:
    """The path as an error message shows it: whole up to 80 characters, else its ends."""
    text = str(path)
    return text if len(text) <= 80 else f"{text[:40]}...{text[-30:]} ({len(text)} characters)"


def _check_writable(flag: str, path, p: Path) -> None:
    parent = p.parent if str(p.parent) else Path(".")
    limit = os.pathconf(parent, "PC_NAME_MAX") if parent.is_dir() and hasattr(os, "pathconf") \
        else 255
    if len(p.name.encode()) > limit:
        raise SpecError(f"`{flag}` = {short_path(path)!r}: the file name is {len(p.name.encode())} "
                        f"bytes, more than the {limit} this file system allows; give a "
                        "shorter name")
    if p.is_dir():
        raise SpecError(f"`{flag}` = {short_path(path)!r} is a directory: give a file path inside it")
    if not parent.is_dir():
        raise SpecError(f"`{flag}` = {short_path(path)!r}: directory {short_path(parent)!r} does not exist; "
                        "create it first or write elsewhere")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise SpecError(f"`{flag}` = {short_path(path)!r}: not writable (permission denied); "
                        "write elsewhere")


def working(message: str):
    """A status line with a spinner on stderr while slow work runs (validate, calibrate,
    `plan --storage`); nothing when stderr is not a terminal, so pipes and logs stay clean."""
    from rich.console import Console

    return Console(stderr=True).status(message)
