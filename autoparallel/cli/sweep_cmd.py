"""`autoparallel sweep`: batch planning to CSV."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import SpecError
from ..search.space import parse_int_list
from ..search.sweep import SweepSpec, load_sweep_file, run_sweep
from . import app
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
) -> None:
    """Plan a grid of problems into one CSV (one row per problem and ranked layout)."""
    job = job.for_target(target)
    if not output:
        raise SpecError("missing --output: a sweep writes a CSV (it resumes when the file exists)")
    check_output("--output", output)
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
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=False) as bar:
        task = bar.add_task("sweep", total=None)

        def progress(done, total, label):
            bar.update(task, total=total, completed=done, description=label)

        counts = run_sweep(spec, space, output, rules=rules, progress=progress)
    typer.echo(f"{counts['written']} problems planned, {counts['skipped']} already in {output} "
               f"(of {counts['problems']})", err=True)
