"""Read one (problem, layout) pair from a row of a sweep CSV (`autoparallel sweep`, `plan --format
csv`) or of a batch-estimate CSV: the columns of `output.frames.SWEEP_COLUMNS` that describe the
problem and the layout. Rows are numbered from 1, the first line after the header."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..batch import _bool, _int, _text, job_from_row
from ..csv_input import read_csv_strings
from ..errors import AutoParallelError, SpecError
from ..problem import make_problem
from ..specs.layout import Layout
from ..specs.problem import Problem

REQUIRED = ("model", "gpu", "n_gpus", "seq_len", "global_batch", "tp", "pp")
"""Columns a row must have; `gpus_per_node` (the GPU's node), `dp` (derived), `vp`, `cp`, `ep` (1), `etp` (tp),
`zero`
(1), `recompute` (none), `sp` (on with TP) and `micro_batch` (1) take defaults when absent; the
job settings (`JobSpec` columns: stack, precision, ...) the stack's defaults when absent or blank."""
OPTIONAL = ("gpus_per_node", "dp", "vp", "cp", "cp_comm", "cp_a2a", "ep", "etp", "zero",
            "recompute", "sp", "micro_batch", "layout")


def read_table(path: str | Path) -> pd.DataFrame:
    """The CSV as strings, with the required columns checked."""
    where = f"--from {path}"
    frame = read_csv_strings(path, where)
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise SpecError(f"{where}: missing column(s) {', '.join(missing)}; a sweep CSV (from "
                        "`autoparallel sweep` or `plan --format csv`) has them")
    for col in OPTIONAL:
        if col not in frame.columns:
            frame[col] = ""
    return frame


def read_sweep_row(path: str | Path, row: int) -> tuple[Problem, Layout]:
    """The problem and the layout of data row `row` (1 = first row after the header).

    Raises:
        SpecError: missing file, unreadable CSV, missing columns, no such row, a row without a
            layout (a 'nothing fits' row) or a malformed value, each naming the row and column.
    """
    frame = read_table(path)
    if not 1 <= row <= len(frame):
        raise SpecError(f"--row {row}: {path} has {len(frame)} data row(s), numbered from 1")
    rec = frame.iloc[row - 1]
    where = f"{path} row {row}"
    if not str(rec["tp"]).strip() and "note" in frame.columns and str(rec["note"]).strip():
        raise SpecError(f"{where} holds no layout: {str(rec['note']).strip()}")
    try:
        layout = Layout(
            dp=_int(rec, "dp"), tp=_int(rec, "tp"), pp=_int(rec, "pp"), vp=_int(rec, "vp"),
            cp=_int(rec, "cp"), ep=_int(rec, "ep"), etp=_int(rec, "etp"), zero=_int(rec, "zero"),
            recompute=_text(rec, "recompute"), sp=_bool(rec, "sp"),
            micro_batch=_int(rec, "micro_batch"),
            cp_comm=_text(rec, "cp_comm"), cp_a2a=_int(rec, "cp_a2a"),
        )
        slug = str(rec.get("layout", "") or "").strip()
        if slug and slug.lower() != "nan":
            # the full slug (sweep schema 4) carries what the axis columns cannot: the uneven
            # split, schedule, block/uniform/named recompute and offload; the axes must agree
            # (the CP form columns too, sweep schema 5; empty ones take the slug's)
            full = Layout.from_slug(slug)
            if not str(rec.get("cp_comm", "") or "").strip():
                layout = layout.model_copy(update={"cp_comm": full.cp_comm,
                                                   "cp_a2a": full.cp_a2a})
            axes = ("dp", "tp", "pp", "vp", "cp", "cp_comm", "cp_a2a", "ep", "etp", "zero",
                    "recompute", "sp", "micro_batch")
            differ = [k for k in axes if getattr(full, k) != getattr(layout, k)]
            if differ:
                raise SpecError(f"`layout` = {slug!r} disagrees with the column(s) "
                                f"{', '.join(differ)}; fix one or empty `layout`")
            layout = full
        problem_args = (_text(rec, "model"), _text(rec, "gpu"), _int(rec, "n_gpus"),
                        _int(rec, "seq_len"), _int(rec, "global_batch"))
        gpus_per_node = _int(rec, "gpus_per_node")
        job = job_from_row(rec)
    except AutoParallelError as exc:
        raise SpecError(f"{where}: {exc}") from None
    except ValueError as exc:  # pydantic: the first failure, named
        err = exc.errors()[0] if hasattr(exc, "errors") else {"loc": (), "msg": str(exc)}
        loc = ".".join(str(p) for p in err.get("loc", ())) or "layout"
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        raise SpecError(f"{where}: `{loc}` = {err.get('input')!r}: {msg}") from None
    model, gpu, n_gpus, seq_len, global_batch = problem_args
    problem = make_problem(model, gpu, n_gpus, seq_len, global_batch, gpus_per_node=gpus_per_node,
                           **job)
    return problem, layout
