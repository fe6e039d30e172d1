"""`autoparallel sweep`: batch planning to CSV."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ..errors import SpecError
from ..limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN, MAX_WORKERS, check_int
from ..values import parse_count_list
from . import command
from .options import (OUTPUT, PROBLEM, SEARCH, GpusPerNode, JobOptions, RecomputeNumLayers,
                      SearchOptions, block_recompute_fields, with_options)
from .outputs import check_output

if TYPE_CHECKING:  # the sweep (pandas) is imported by the command that runs it
    from ..search.sweep import SweepStatus


def _list(flag: str, help_text: str, metavar: str = "LIST", panel: str = PROBLEM):
    return Annotated[Optional[str], typer.Option(flag, help=help_text, rich_help_panel=panel,
                                                 metavar=metavar, show_default=False)]


def _global_batches(text: str | None, seq_lens: list[int] | None) -> list[int] | None:
    """`--global-batch` of a sweep: sequences (512,2048), or tokens with a suffix (16M) when one
    sequence length is swept (a token batch is a different sequence count per length)."""
    from ..values import parse_global_batch

    if text is None:
        return None
    items = [x.strip() for x in text.split(",") if x.strip()]
    if any(not x.isdigit() for x in items) and (seq_lens is None or len(seq_lens) != 1):
        raise SpecError(f"`--global-batch` = {text!r}: a batch in tokens (a K, M or G suffix) "
                        "needs exactly one --seq-len in a sweep; give sequences, e.g. 512,2048")
    seq = seq_lens[0] if seq_lens else None
    return parse_count_list(",".join(str(parse_global_batch(x, seq, high=MAX_GLOBAL_BATCH))
                                     for x in items) or None, "--global-batch")


def _names(text, flag):
    if text is None:
        return None
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise SpecError(f"`{flag}` is empty: give at least one value")
    return names


@command("sweep")
@with_options(job=JobOptions)
def sweep_command(
    job: JobOptions,
    sweep_file: Annotated[Optional[str], typer.Argument(help="Sweep TOML: a [sweep] table and an optional [space] table.", metavar="SWEEP_FILE", show_default=False)] = None,
    model: _list("--model", "Models, comma-separated (presets or files).") = None,
    gpu: _list("--gpu", "GPU kinds, comma-separated.") = None,
    gpus: _list("--gpus", "GPU counts, e.g. 8,64,512, 16K or 512:4096:x2.") = None,
    seq_len: _list("--seq-len", "Sequence lengths, e.g. 4096,8K.") = None,
    global_batch: _list("--global-batch", "Global batches in sequences, e.g. 512,2048 (or tokens, 16M, with one --seq-len).") = None,
    gpus_per_node: GpusPerNode = None,
    top: Annotated[Optional[int], typer.Option(help="Layouts per problem [default: the file's, else 10].", rich_help_panel=SEARCH, metavar="N", show_default=False)] = None,
    allow_tp_across_nodes: Annotated[bool, typer.Option(help="Let TP groups span nodes.", rich_help_panel=SEARCH)] = False,
    target: Annotated[Optional[str], typer.Option(help="Keep only layouts this launcher can write.", rich_help_panel=SEARCH, metavar="NAME", show_default=False)] = None,
    recompute_num_layers: RecomputeNumLayers = None,
    output: Annotated[Optional[str], typer.Option("--output", help="CSV to write (resumed when it exists).", rich_help_panel=OUTPUT, metavar="FILE", show_default=False)] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", help="Worker processes (default: the cores available); the same CSV for any number.", rich_help_panel=SEARCH, metavar="N", show_default=False)] = None,
    shard: Annotated[Optional[str], typer.Option("--shard", help="K/N: only the K-th of N runs of the grid (Slurm job arrays); the shards concatenate to the whole sweep.", rich_help_panel=SEARCH, metavar="K/N", show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait", help="If another sweep writes --output, wait for it, then continue (default: refuse).", rich_help_panel=OUTPUT)] = False,
) -> None:
    """Plan a grid of problems into one CSV (one row per problem and ranked layout)."""
    from ..search.sweep import SweepSpec, SweepStatus, load_sweep_file, parse_shard, run_sweep
    from ..search.sweep_pool import available_cores
    from .guard import interrupted

    job = job.for_target(target)
    if not output:
        raise SpecError("missing --output: a sweep writes a CSV (it resumes when the file exists)")
    check_output("--output", output)
    jobs = available_cores() if jobs is None else check_int("--jobs", jobs, high=MAX_WORKERS)
    shard_kn = parse_shard(shard)
    if sweep_file:
        spec, space = load_sweep_file(sweep_file)
    else:
        spec, space = None, SearchOptions().search_space()
    space = space.narrowed(**block_recompute_fields(recompute_num_layers))
    seq_lens = parse_count_list(seq_len, "--seq-len", high=MAX_SEQ_LEN)
    overrides = {
        "model": _names(model, "--model"), "gpu": _names(gpu, "--gpu"),
        "gpus": parse_count_list(gpus, "--gpus", ranges=True, high=MAX_GPUS),
        "seq_len": seq_lens,
        "global_batch": _global_batches(global_batch,
                                        seq_lens or (spec.seq_len if spec else None)),
        "gpus_per_node": gpus_per_node, "top": top, "target": target,
    } | job.job()
    for key in ("stack", "precision"):  # comma lists are swept
        if key in overrides and "," in overrides[key]:
            overrides[key] = _names(overrides[key], "--" + key)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    data = (spec.model_dump() if spec else {}) | overrides
    missing = [k for k in ("model", "gpu", "gpus", "seq_len", "global_batch") if k not in data]
    if missing:
        raise SpecError(f"sweep: missing {', '.join('--' + m.replace('_', '-') for m in missing)} "
                        "(or give a sweep file)")
    try:
        spec = SweepSpec.model_validate(data)
    except ValueError as exc:
        from ..errors import format_validation_error

        raise SpecError(format_validation_error(exc, "sweep")) from None
    rules = SearchOptions(allow_tp_across_nodes=allow_tp_across_nodes).rules()
    status = SweepStatus(output)
    of = f" of shard {shard}" if shard else ""
    with SweepProgress() as bar:
        try:
            run_sweep(spec, space, output, rules=rules, progress=bar.update, jobs=jobs,
                      shard=shard_kn, wait=wait, status=status, on_start=bar.start)
        except KeyboardInterrupt:
            bar.stop()
            if status.stream:
                kept = f"{status.written} of {status.problems} problems{of} were written to {output}"
            elif not status.problems:
                kept = (f"stopped before planning any problem; {output} holds what earlier runs "
                        "wrote; rerun the same command to start")
            else:
                kept = (f"{status.kept} of {status.problems} problems{of} are in {output} "
                        f"({status.written} planned this run); rerun the same command to resume")
            interrupted(kept)
            raise typer.Exit(130) from None
    resumed = f"; resume: {status.resumed}" if status.resumed else ""
    typer.echo(f"{status.written} problems planned, {status.skipped} already in {output} "
               f"(of {status.problems}{of}){resumed}", err=True)


class SweepProgress:
    """A progress bar on stderr while the sweep runs (a terminal only; it leaves no line
    behind): problems done, rate, time elapsed and left. Refreshed on each finished problem (no
    refresh thread: the sweep forks its workers while it runs)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                            TextColumn("left"), TimeRemainingColumn(),
                            console=Console(stderr=True), auto_refresh=False, transient=True)
        self.task = None
        self.t0 = 0.0
        self.shown = self.bar.console.is_terminal

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, status: SweepStatus) -> None:
        import time

        if not self.shown:
            return
        skipped = f" ({status.skipped} already done)" if status.skipped else ""
        self.bar.start()
        self.task = self.bar.add_task(f"sweep{skipped}", total=status.todo, rate="")
        self.t0 = time.perf_counter()
        self.bar.refresh()

    def update(self, done: int, total: int, label: str) -> None:
        import time

        if self.task is None:
            return
        took = time.perf_counter() - self.t0
        rate = f"{done / took:.2f} problems/s" if done and took > 0 else ""
        self.bar.update(self.task, completed=done, total=total, rate=rate,
                        description=label or self.bar.tasks[0].description)
        self.bar.refresh()

    def stop(self) -> None:
        if self.task is not None:
            self.bar.stop()
            self.task = None
