"""`sweep`: plan many problems (models x GPU kinds x GPU counts x sequence lengths x batches)
into one CSV with a frozen schema. Resumable: problems already in the output are skipped; each
problem's rows are written with one write call and flushed, and a trailing partial line left by
a killed run is cut off before resuming."""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd
from pydantic import Field, PositiveInt, ValidationError

from ..errors import SpecError, format_validation_error
from ..output.frames import PROBLEM_COLUMNS, SWEEP_COLUMNS, ranked_frame
from ..problem import make_problem
from ..specs.job import JOB_FIELDS, JobSpec
from ..specs.precision import PrecisionName
from .plan import plan
from .space import SearchSpace


class SweepSpec(JobSpec):
    """The grid of problems of a sweep (each list must be non-empty), plus the job settings
    (`JobSpec`; `stack` and `precision` may also be lists, swept like the others)."""

    stack: str | list[str] = "megatron-core"
    """Stack preset(s) or file(s)."""
    precision: PrecisionName | list[PrecisionName] = "bf16"
    """Precision(s)."""
    model: list[str] = Field(min_length=1)
    gpu: list[str] = Field(min_length=1)
    gpus: list[PositiveInt] = Field(min_length=1)
    seq_len: list[PositiveInt] = Field(min_length=1)
    global_batch: list[PositiveInt] = Field(min_length=1)
    gpus_per_node: PositiveInt = 8
    top: PositiveInt = 3
    target: str | None = None
    """Keep only layouts this launcher can express."""


def load_sweep_file(path: str | Path) -> tuple[SweepSpec, SearchSpace]:
    """Read `[sweep]` (and optional `[space]`) from a TOML file."""
    from ..presets import read_table

    data = read_table(Path(path))
    if "sweep" not in data:
        raise SpecError(f"{path}: no [sweep] table; expected keys model, gpu, gpus, seq_len, "
                        "global_batch (lists)")
    unknown = set(data) - {"sweep", "space"}
    if unknown:
        raise SpecError(f"{path}: unknown table(s) {sorted(unknown)}; allowed: [sweep], [space]")
    try:
        for table in ("sweep", "space"):
            if not isinstance(data.get(table, {}), dict):
                raise SpecError(f"{path}: [{table}] must be a table of keys")
        spec = SweepSpec.validate_strict(data["sweep"])
        space = SearchSpace.validate_strict(data.get("space", {}))
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, f"sweep file ({path})")) from None
    return spec, space


def problems_of(spec: SweepSpec) -> list:
    """Every problem of the grid, validated up front (a bad preset fails before any work)."""
    out = []
    job = {k: getattr(spec, k) for k in JOB_FIELDS if getattr(spec, k) is not None}
    stacks = [spec.stack] if isinstance(spec.stack, str) else spec.stack
    precisions = [spec.precision] if isinstance(spec.precision, str) else spec.precision
    for model, gpu, n, s, b, st, pr in itertools.product(
            spec.model, spec.gpu, spec.gpus, spec.seq_len, spec.global_batch, stacks, precisions):
        out.append(make_problem(model, gpu, n, s, b, gpus_per_node=min(spec.gpus_per_node, n)
                                if n < spec.gpus_per_node else spec.gpus_per_node,
                                **(job | {"stack": st, "precision": pr})))
    return out


def _key(values: Iterable) -> tuple[str, ...]:
    """A problem's identity as the CSV spells it (None is an empty cell)."""
    return tuple("" if v is None else str(v) for v in values)


def _prepare_output(path: Path) -> set[tuple[str, ...]]:
    """Check an existing output's header, cut a partial last line, return finished problems."""
    if not path.exists() or path.stat().st_size == 0:
        return set()
    raw = path.read_bytes()
    if not raw.endswith(b"\n"):
        cut = raw.rfind(b"\n") + 1
        with open(path, "r+b") as f:
            f.truncate(cut)
        raw = raw[:cut]
    if not raw:
        return set()
    header = raw.split(b"\n", 1)[0].decode("utf-8", errors="replace").strip().split(",")
    if header != list(SWEEP_COLUMNS):
        raise SpecError(f"--output {path}: exists with a different column schema; choose another "
                        "file or remove it")
    try:
        done = pd.read_csv(io.BytesIO(raw), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"--output {path}: cannot resume, the file is corrupt ({first}); "
                        "move it away to start afresh") from None
    return {_key(r) for r in done[list(PROBLEM_COLUMNS)].itertuples(index=False)}


def run_sweep(spec: SweepSpec, space: SearchSpace, output: str | Path, rules=None,
              progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Plan every problem not yet in `output` and append its ranked rows. Returns counts."""
    path = Path(output)
    problems = problems_of(spec)
    try:
        done = _prepare_output(path)
        new_file = not path.exists() or path.stat().st_size == 0
        handle = open(path, "a", encoding="utf-8", newline="")
    except OSError as exc:
        raise SpecError(f"--output {path}: cannot write ({exc.strerror or exc})") from None
    written = skipped = 0
    with handle:
        if new_file:
            handle.write(",".join(SWEEP_COLUMNS) + "\n")
            handle.flush()
        for i, problem in enumerate(problems):
            key = _key(problem.describe()[c] for c in PROBLEM_COLUMNS)
            label = "/".join(key[:3]) + f" s{key[4]} b{key[5]}"
            if key in done:
                skipped += 1
            else:
                result = plan(problem, space, top=spec.top, rules=rules, target=spec.target)
                block = ranked_frame(result).to_csv(index=False, header=False)
                handle.write(block)  # one write per problem: all its rows or none
                handle.flush()
                os.fsync(handle.fileno())
                done.add(key)
                written += 1
            if progress:
                progress(i + 1, len(problems), label)
    return {"problems": len(problems), "written": written, "skipped": skipped}
