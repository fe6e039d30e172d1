"""`sweep`: plan many problems (models x GPU kinds x GPU counts x sequence lengths x batches)
into one CSV with a frozen schema.

- Resumable: problems whose rows are all in the output are skipped; a problem with rows missing
  (a cut file) is recomputed (`output.sweep_csv`). Each problem's rows are written with one
  write and flushed to the disk, in grid order, so a resumed sweep is byte-identical to an
  uninterrupted one.
- One writer: the output is locked while a sweep writes it (`output.lock`).
- Parallel: `jobs` worker processes plan the problems; the output stays in grid order
  (`sweep_pool`).
- Sharded: `--shard K/N` plans the K-th of N contiguous runs of the grid; the shards' rows, in
  shard order, are the one-machine sweep's rows.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, PositiveInt, ValidationError

from ..errors import SpecError, format_validation_error
from ..presets import load_gpu
from ..limits import check_int
from ..output.frames import PROBLEM_COLUMNS, ranked_frame, rows_frame
from ..problem import make_problem
from ..specs.job import JOB_FIELDS, JobSpec
from ..specs.precision import PrecisionName
from .plan import plan
from .space import SearchSpace
from .top import ranked_top


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
    gpus_per_node: PositiveInt | None = None
    """GPUs per node; default: each GPU's node (`GPUSpec.gpus_per_node`)."""
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
        node = spec.gpus_per_node or load_gpu(gpu).gpus_per_node
        gpn = min(node, n) if n < node else spec.gpus_per_node
        out.append(make_problem(model, gpu, n, s, b, gpus_per_node=gpn,
                                **(job | {"stack": st, "precision": pr})))
    return out


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """`--shard K/N` as (K, N), 1 <= K <= N; None when not given."""
    if text is None:
        return None
    parts = str(text).strip().split("/")
    try:
        k, n = (int(x) for x in parts)
    except ValueError:
        k = n = 0
    if len(parts) != 2 or not 1 <= k <= n:
        raise SpecError(f"`--shard` = {text!r}: give K/N with 1 <= K <= N, e.g. 2/8 for the "
                        "second of eight shards (Slurm: --shard $SLURM_ARRAY_TASK_ID/"
                        "$SLURM_ARRAY_TASK_COUNT with --array=1-N)")
    check_int("--shard N", n, high=MAX_SHARDS)
    return k, n


MAX_SHARDS = 1_000_000


def shard_range(n_problems: int, shard: tuple[int, int] | None) -> range:
    """The problems of shard K of N: a contiguous run of the grid order, so that the shards'
    rows, concatenated in shard order, are the rows of the one-machine sweep."""
    if shard is None:
        return range(n_problems)
    k, n = shard
    return range((k - 1) * n_problems // n, k * n_problems // n)


def problem_label(problem) -> str:
    d = problem.describe()
    return f"{d['model']}/{d['gpu']}/{d['n_gpus']} s{d['seq_len']} b{d['global_batch']}"


@dataclass
class SweepStatus:
    """Where a sweep stands (filled in as it runs, so an interrupted one can say what it
    kept)."""

    output: str
    problems: int = 0
    """Problems of this sweep (of this shard with `--shard`)."""
    todo: int = 0
    """Problems not yet in the output when the sweep started."""
    written: int = 0
    skipped: int = 0
    resumed: str = ""
    """What resume dropped or repaired ('' when nothing)."""
    stream: bool = False
    """The output is a stream (no resume)."""

    @property
    def kept(self) -> int:
        return self.written + self.skipped


class _Block:
    """The CSV rows of one problem, as a picklable callable for the worker processes."""

    def __init__(self, space, top, rules, target) -> None:
        self.space, self.top, self.rules, self.target = space, top, rules, target

    def __call__(self, problem) -> bytes:
        # the ranking's head alone (`ranked_top`); `plan` says why when nothing fits
        head = ranked_top(problem, self.space, top=self.top, rules=self.rules,
                          target=self.target)
        if head is None:
            frame = ranked_frame(plan(problem, self.space, top=self.top, rules=self.rules,
                                      target=self.target))
        else:
            frame = rows_frame(problem, head)
        return frame.to_csv(index=False, header=False).encode("utf-8")


def sweep_settings(spec: SweepSpec, space: SearchSpace, rules=None) -> dict:
    """What a sweep's rows depend on beyond each row's problem columns: layouts kept per
    problem, target, the active rules and the search space (`output.sweep_csv.check_settings`
    refuses to resume a file planned with others)."""
    from ..rules import active_rules

    return {"top": spec.top, "target": spec.target,
            "rules": sorted(r.name for r in (active_rules() if rules is None else rules)),
            "space": space.model_dump(mode="json", exclude_none=True)}


def run_sweep(spec: SweepSpec, space: SearchSpace, output: str | Path, rules=None,
              progress: Callable[[int, int, str], None] | None = None, *, jobs: int = 1,
              shard: tuple[int, int] | None = None, wait: bool = False,
              status: SweepStatus | None = None,
              on_start: Callable[[SweepStatus], None] | None = None) -> dict:
    """Plan every problem (of `shard`) not yet in `output` and append its rows, one whole
    problem at a time, in grid order, with `jobs` worker processes. Returns counts.

    The output is locked for the whole run (another writer is refused, or waited for with
    `wait`); an existing file is verified first (`output.sweep_csv.read_existing`). `progress`
    gets (problems done this run, problems to do, label); `on_start` the status once the
    output has been read (before any work).

    Raises:
        OutputError: the output cannot be written, is not a sweep CSV of this version, is
            corrupt, or another process writes it.
    """
    from ..output.files import is_stream, open_stream
    from ..output.lock import lock_output
    from ..output.sweep_csv import (
        HEADER, StreamWriter, SweepWriter, check_settings, problem_key, read_all, read_existing,
    )
    from .sweep_pool import results_in_order

    path = Path(output)
    status = status or SweepStatus(str(output))
    everything = problems_of(spec)
    problems = [everything[i] for i in shard_range(len(everything), shard)]
    keys = [problem_key(p.describe()[c] for c in PROBLEM_COLUMNS) for p in problems]
    status.problems = len(problems)
    if is_stream(path):
        status.stream = True
        writer = StreamWriter(open_stream("--output", path), path)
        todo = list(range(len(problems)))
    else:
        fd = lock_output(path, "--output", initial=HEADER, wait=wait)
        try:
            existing = read_existing(read_all(fd, path), path)
            check_settings(existing, path, sweep_settings(spec, space, rules))
            writer = SweepWriter(fd, path, existing)
        except BaseException:
            os.close(fd)
            raise
        status.resumed = existing.summary()
        done = existing.done
        todo = [i for i, k in enumerate(keys) if k not in done]
    status.todo = len(todo)
    status.skipped = len(problems) - len(todo)
    if on_start:
        on_start(status)
    results = None
    try:
        work = _Block(space, spec.top, rules, spec.target)
        if progress:
            progress(0, len(todo), "")
        results = results_in_order(problems, todo, work, jobs, close_fds=(writer.fd,),
                                   label=lambda j: problem_label(problems[j]))
        for n, (i, block) in enumerate(results, start=1):
            _check_block(block, keys[i])
            with _signals_held():  # Ctrl-C lands after the block and its count, not between
                writer.write_block(block)  # one write per problem: all its rows or none
                status.written += 1
            if progress:
                progress(n, len(todo), problem_label(problems[i]))
    finally:
        if results is not None:
            results.close()  # stops the workers now, whatever ended the loop
        writer.close()
    return {"problems": status.problems, "written": status.written, "skipped": status.skipped}


class _signals_held:
    """Hold SIGINT and SIGTERM (delivered when the block ends) in the main thread."""

    def __enter__(self):
        import signal
        import threading

        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        return self

    def __exit__(self, *exc) -> None:
        if self.old is not None:
            import signal

            signal.pthread_sigmask(signal.SIG_SETMASK, self.old)


def _check_block(block: bytes, key: tuple[str, ...]) -> None:
    """A block must be whole lines of its own problem (resume finds it by these)."""
    import csv

    first = next(csv.reader([block.split(b"\n", 1)[0].decode("utf-8")]))
    if tuple(first[: len(key)]) != key or not block.endswith(b"\n"):
        raise RuntimeError(f"sweep block of {key} is spelt {tuple(first[:len(key)])} in the "
                           "CSV: resume would not find it")
