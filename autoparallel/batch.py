"""Batch estimation: score a CSV of (problem, layout) rows, grouping rows by problem so that each
group is one vectorised evaluation. A malformed row gets an `error` and the others are scored."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .csv_input import read_csv_strings
from .errors import AutoParallelError, SpecError
from .evaluate import _layout_error, evaluate
from .layouts import LayoutTable
from .limits import MAX_SPEC_INT
from .values import parse_count, parse_global_batch
from .problem import make_problem
from .rules import Reject
from .specs.job import JOB_FIELDS, JobSpec
from .splits import with_default_split
from .specs.layout import Layout, parse_stage_layers, stage_layers_slug

INPUT_COLUMNS = (
    "model", "gpu", "n_gpus", "gpus_per_node", "seq_len", "global_batch", "dp", "tp", "pp", "vp",
    "cp", "ep", "etp", "zero", "recompute", "sp", "micro_batch",
)
PROBLEM_COLUMNS = INPUT_COLUMNS[:6]
JOB_COLUMNS = JOB_FIELDS
"""Optional columns: every job setting (`JobSpec`); a blank cell takes the stack's default."""
_OPTIONAL_DEFAULTS = {"gpus_per_node": None, "dp": None, "vp": 1, "cp": 1, "ep": 1, "etp": None,
                      "zero": 1,
                      "recompute": "none", "sp": None, "micro_batch": 1, "cp_comm": None,
                      "cp_a2a": None}
LAYOUT_OPTIONAL = ("cp_comm", "cp_a2a")
"""Optional layout columns: the context-parallel form (ring when blank) and the hierarchical
form's all-to-all group."""
SPLIT_COLUMN = "stage_layers"
"""Optional column: layers per pipeline stage (`7,8x14,7`); blank = even, or the balanced split
`plan` takes where pp x vp does not divide the layers (`splits.with_default_split`). The
output holds the split each row was scored with and a `note` where it was filled in."""
_SUFFIXED = re.compile(r"[0-9]+(\.[0-9]+)?\s*[KMGkmg]")
"""A count with a binary suffix (`values.parse_count`: 4K = 4,096)."""
_TRUE, _FALSE = {"1", "true", "yes", "on", "t", "y"}, {"0", "false", "no", "off", "f", "n"}
OUTPUT_COLUMNS = ("fits", "mfu", "tokens_per_s_per_gpu", "note", "error")
"""Columns `score_frame` adds besides the `mem_*` / `time_*` ledger columns: an output read back
as input keeps them and is scored again."""


def _unknown_columns(columns) -> str | None:
    """Why the header cannot be read, or None: a column named twice (pandas renames the second
    `x.1`) or one that is no input (a typo would otherwise be scored at its default)."""
    import difflib
    import re

    known = set(INPUT_COLUMNS) | set(LAYOUT_OPTIONAL) | {SPLIT_COLUMN} | set(JOB_COLUMNS)
    for col in columns:
        base = re.sub(r"\.\d+$", "", col)
        if base != col and base in columns:
            return f"column `{base}` appears more than once"
    unknown = [c for c in columns if c not in known and c not in OUTPUT_COLUMNS
               and not c.startswith(("mem_", "time_"))]
    if not unknown:
        return None
    hints = []
    for c in unknown:
        near = difflib.get_close_matches(c, sorted(known), n=1, cutoff=0.6)
        hints.append(f"`{c}`" + (f" (did you mean {near[0]}?)" if near else ""))
    return (f"unknown column(s) {', '.join(hints)}; the columns are the problem's "
            f"({', '.join(PROBLEM_COLUMNS)}), the layout's ({', '.join(INPUT_COLUMNS[6:])}, "
            f"{', '.join(LAYOUT_OPTIONAL)}, {SPLIT_COLUMN}) and the job settings "
            f"({', '.join(JOB_COLUMNS)})")


def _blank(row, col) -> bool:
    """True when the cell is empty; raises when an empty cell has no default."""
    value = row[col] if col in row else None  # an optional column absent: its default
    empty = value is None or (isinstance(value, float) and np.isnan(value)) or str(value).strip() == ""
    if empty and col not in _OPTIONAL_DEFAULTS:
        raise SpecError(f"`{col}` is empty")
    return empty


def _int(row, col):
    if _blank(row, col):
        return _OPTIONAL_DEFAULTS[col]
    text = str(row[col]).strip()
    try:
        number = float(text)
    except ValueError:
        if not _SUFFIXED.fullmatch(text):
            raise SpecError(f"`{col}` = {text!r} is not a number") from None
        # 4K = 4,096 as the command line reads it; a global batch with a suffix is tokens
        if col == "global_batch":
            return parse_global_batch(text, _int(row, "seq_len"), name=col, high=MAX_SPEC_INT)
        return parse_count(text, col, low=0 if col == "zero" else 1, high=MAX_SPEC_INT)
    if not math.isfinite(number) or number != int(number) or number < 1 and col != "zero":
        raise SpecError(f"`{col}` = {text!r} must be a positive whole number")
    if number > MAX_SPEC_INT:
        raise SpecError(f"`{col}` = {text!r}: larger than {MAX_SPEC_INT:,} (2^31 - 1), the bound "
                        "on every count; give a realistic value")
    return int(number)


def _text(row, col):
    if _blank(row, col):
        return _OPTIONAL_DEFAULTS[col]
    return str(row[col]).strip()


def _bool(row, col):
    text = _text(row, col)
    if text is None:
        return None
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise SpecError(f"`{col}` = {text!r} is not a boolean (use true/false)")


def job_from_row(row) -> dict:
    """The job settings of a CSV row: each `JobSpec` column present and not blank, typed as its
    field (booleans true/false, numbers); blank or absent cells are left to the stack."""
    out = {}
    for name in JOB_FIELDS:
        if name not in (row.index if hasattr(row, "index") else row):
            continue
        value = row[name]
        if value is None or (isinstance(value, float) and np.isnan(value)) or not str(value).strip():
            continue
        text = str(value).strip()
        kind = str(JobSpec.model_fields[name].annotation)
        if "bool" in kind:
            if text.lower() not in _TRUE | _FALSE:
                raise SpecError(f"`{name}` = {text!r} is not a boolean (use true/false)")
            out[name] = text.lower() in _TRUE
        elif "float" in kind:
            try:
                out[name] = float(text)
            except ValueError:
                raise SpecError(f"`{name}` = {text!r} is not a number") from None
        else:
            out[name] = text
    return out


def read_layouts_csv(path: str | Path) -> pd.DataFrame:
    """Read the batch input, checking the required columns are present."""
    frame = read_csv_strings(path, f"--input {path}")
    frame.columns = [str(c).strip() for c in frame.columns]  # ` model , gpu ` as written by hand
    if len(frame.columns) == 1 and ";" in frame.columns[0]:
        raise SpecError(f"--input {path}: its header {frame.columns[0][:60]!r} is separated by "
                        "semicolons; the batch input is comma-separated CSV")
    required = [c for c in INPUT_COLUMNS if c not in _OPTIONAL_DEFAULTS]
    missing = [c for c in required if c not in frame.columns]
    if not missing:
        why = _unknown_columns(list(frame.columns))
        if why:
            raise SpecError(f"--input {path}: {why}")
    if missing:
        optional = [c for c in INPUT_COLUMNS if c in _OPTIONAL_DEFAULTS]
        raise SpecError(
            f"--input {path}: missing column(s) {', '.join(missing)}; required columns "
            f"{', '.join(required)}; optional {', '.join(optional)}, the context-parallel form "
            "(cp_comm, cp_a2a), stage_layers and any job setting (blank cells take the defaults)"
        )
    for col in _OPTIONAL_DEFAULTS:
        if col not in frame.columns and col not in LAYOUT_OPTIONAL:
            frame[col] = ""
    return frame


def score_frame(frame: pd.DataFrame, profile: str | None = None, rules=None,
                job: dict | None = None) -> pd.DataFrame:
    """Score every row; returns the input columns plus ledger columns and `error`. Rows with the
    same problem and job settings are evaluated together (one vectorised call). `rules`: the
    active rules (default `rules.active_rules()`). `job`: settings (`JobSpec` fields, e.g. the
    command line's `--precision fp8`) for every row whose own cell is blank or absent;
    `profile` is the same for the efficiency profile."""
    defaults = dict(job or {})
    if profile is not None:
        defaults.setdefault("profile", profile)
    parsed: list[tuple | None] = []
    errors: list[str] = [""] * len(frame)
    notes: list[str] = [""] * len(frame)
    splits: list[str] = [""] * len(frame)
    for i, row in enumerate(frame.to_dict("records")):  # dicts: a Series per row costs 4x
        try:
            job = defaults | job_from_row(row)
            key = (_text(row, "model"), _text(row, "gpu"), _int(row, "n_gpus"),
                   _int(row, "gpus_per_node"), _int(row, "seq_len"), _int(row, "global_batch"),
                   tuple(sorted(job.items())))
            rc = _text(row, "recompute")
            zero = _int(row, "zero")
            layout = Layout(
                dp=_int(row, "dp"), tp=_int(row, "tp"), pp=_int(row, "pp"), vp=_int(row, "vp"),
                cp=_int(row, "cp"), ep=_int(row, "ep"), etp=_int(row, "etp"), zero=zero,
                recompute=rc,
                sp=_bool(row, "sp"), micro_batch=_int(row, "micro_batch"),
                cp_comm=_text(row, "cp_comm") if "cp_comm" in row else None,
                cp_a2a=_int(row, "cp_a2a") if "cp_a2a" in row else None,
                stage_layers=_split(row),
            )
            parsed.append((key, layout))
        except (AutoParallelError, ValueError) as exc:
            msg = str(exc).splitlines()[0] if not hasattr(exc, "errors") else _first_pydantic(exc)
            errors[i] = f"row {i + 1}: {msg}"
            parsed.append(None)

    groups: dict[tuple, list[int]] = {}
    for i, item in enumerate(parsed):
        if item is not None:
            groups.setdefault(item[0], []).append(i)

    metrics: dict[str, np.ndarray] = {}  # ledger column -> a value per input row (None: not scored)
    for key, rows in groups.items():
        model, gpu, n_gpus, gpn, seq, gbs, job = key
        job = dict(job)
        try:
            problem = make_problem(model, gpu, n_gpus, seq, gbs, gpus_per_node=gpn, **job)
        except AutoParallelError as exc:
            for i in rows:
                errors[i] = f"row {i + 1}: {str(exc).splitlines()[0]}"
            continue
        filled = [with_default_split(problem, parsed[i][1]) for i in rows]
        layouts = [lay.resolved(n_gpus) for lay, _ in filled]
        ev = evaluate(problem, LayoutTable.from_layouts(layouts, n_gpus, problem.model.n_layers),
                      rules)
        cols = ev.columns()
        broken = ev.reject.astype(np.int64) & ~np.int64(int(Reject.OOM))
        scored = [j for j in range(len(rows)) if not broken[j]]
        at = np.array([rows[j] for j in scored], dtype=np.int64)
        for j in range(len(rows)):
            if broken[j]:
                why = _layout_error(problem, layouts[j], int(broken[j]))
                errors[rows[j]] = f"row {rows[j] + 1}: {why}"
        picked = {k: v for k, v in cols.items() if k.startswith(("mem_", "time_"))}
        picked |= {"fits": cols["fits"], "mfu": cols["mfu"],
                   "tokens_per_s_per_gpu": cols["tokens_per_s_per_gpu"]}
        for k, v in picked.items():
            column = metrics.setdefault(k, np.full(len(frame), None, dtype=object))
            column[at] = [bool(x) if k == "fits" else float(x) for x in np.asarray(v)[scored]]
        for j in scored:
            notes[rows[j]] = filled[j][1] or ""
            split = layouts[j].stage_layers
            if split:
                splits[rows[j]] = stage_layers_slug(split)[1:-1]
    out = frame.copy()
    if any(splits) or SPLIT_COLUMN in out.columns:
        out[SPLIT_COLUMN] = [splits[i] or (str(frame[SPLIT_COLUMN].iloc[i]) if SPLIT_COLUMN in
                                           frame.columns else "") for i in range(len(frame))]
    for col, values in metrics.items():
        out[col] = list(values)
    if any(notes):
        out["note"] = notes
    out["error"] = errors
    return out


def _split(row) -> list[int] | None:
    """The row's `stage_layers` cell as layers per stage; None when absent or blank."""
    if SPLIT_COLUMN not in (row.index if hasattr(row, "index") else row):
        return None
    text = str(row[SPLIT_COLUMN]).strip()
    if not text or text.lower() == "nan":
        return None
    try:
        return parse_stage_layers(text)
    except ValueError as exc:
        raise SpecError(f"`{SPLIT_COLUMN}` = {text!r}: {exc}") from None


def _first_pydantic(exc) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    return f"`{loc}` = {err.get('input')!r}: {err.get('msg', 'invalid').removeprefix('Value error, ')}"
