"""`autoparallel sweep`: batch planning to CSV."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import SpecError
from ..limits import MAX_WORKERS, check_int
from ..search.space import parse_int_list
from ..search.sweep import SweepSpec, SweepStatus, load_sweep_file, parse_shard, run_sweep
from ..search.sweep_pool import available_cores
from . import app
from .guard import interrupted
from .outputs import check_output
from .options import (
    JobOptions, RecomputeNumLayers, SearchOptions, block_recompute_fields, with_options,
)


def _names(text, flag):
    if text is None:
        return None
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise SpecError(f"`{flag}` is empty: give at least one value")
    return names


@app.command("sweep")
@with_options(job=JobOptions)
def sweep_command(
    job: JobOptions,
    sweep_file: Annotated[Optional[str], typer.Argument(help="Sweep TOML ([sweep] and optional [space]).", show_default=False)] = None,
    output: Annotated[Optional[str], typer.Option("--output", help="CSV to write (resumed if it exists).", show_default=False)] = None,
    model: Annotated[Optional[str], typer.Option(help="Comma-separated models.", show_default=False)] = None,
    gpu: Annotated[Optional[str], typer.Option(help="Comma-separated GPU kinds.", show_default=False)] = None,
    gpus: Annotated[Optional[str], typer.Option(help="Comma-separated GPU counts.", show_default=False)] = None,
    seq_len: Annotated[Optional[str], typer.Option(help="Comma-separated sequence lengths.", show_default=False)] = None,
    global_batch: Annotated[Optional[str], typer.Option(help="Comma-separated global batches.", show_default=False)] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option(help="GPUs per node.", show_default=False)] = None,
    top: Annotated[Optional[int], typer.Option(help="Layouts per problem.", show_default=False)] = None,
    allow_tp_across_nodes: Annotated[bool, typer.Option(help="Let TP groups span nodes.")] = False,
    target: Annotated[Optional[str], typer.Option(help="Keep only layouts this launcher can run.", show_default=False)] = None,
    recompute_num_layers: RecomputeNumLayers = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", help="Worker processes (default: the cores available); the same CSV for any number.", show_default=False)] = None,
    shard: Annotated[Optional[str], typer.Option("--shard", help="K/N: only the K-th of N runs of the grid (Slurm job arrays); the shards concatenate to the whole sweep.", show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait", help="If another sweep writes --output, wait for it, then continue (default: refuse).")] = False,
) -> None:
    """Plan a grid of problems into one CSV (one row per problem and ranked layout)."""
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
    overrides = {
        "model": _names(model, "--model"), "gpu": _names(gpu, "--gpu"),
        "gpus": parse_int_list(gpus, "--gpus"), "seq_len": parse_int_list(seq_len, "--seq-len"),
        "global_batch": parse_int_list(global_batch, "--global-batch"),
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
