"""`autoparallel sweep`: batch planning to CSV."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import SpecError
from ..limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN
from ..values import parse_count_list
from . import command
from .options import (OUTPUT, PROBLEM, SEARCH, JobOptions, RecomputeNumLayers, SearchOptions,
                      block_recompute_fields, with_options)
from .outputs import check_output


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
    gpus_per_node: Annotated[Optional[int], typer.Option(help="GPUs per node.", rich_help_panel=PROBLEM, metavar="N", show_default=False)] = None,
    top: Annotated[Optional[int], typer.Option(help="Layouts per problem [default: the file's, else 10].", rich_help_panel=SEARCH, metavar="N", show_default=False)] = None,
    allow_tp_across_nodes: Annotated[bool, typer.Option(help="Let TP groups span nodes.", rich_help_panel=SEARCH)] = False,
    target: Annotated[Optional[str], typer.Option(help="Keep only layouts this launcher can write.", rich_help_panel=SEARCH, metavar="NAME", show_default=False)] = None,
    recompute_num_layers: RecomputeNumLayers = None,
    output: Annotated[Optional[str], typer.Option("--output", help="CSV to write (resumed when it exists).", rich_help_panel=OUTPUT, metavar="FILE", show_default=False)] = None,
) -> None:
    """Plan a grid of problems into one CSV (one row per problem and ranked layout)."""
    from ..search.sweep import SweepSpec, load_sweep_file, run_sweep

    job = job.for_target(target)
    if not output:
        raise SpecError("missing --output: a sweep writes a CSV (it resumes when the file exists)")
    check_output("--output", output)
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
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), transient=False) as bar:
        task = bar.add_task("sweep", total=None)

        def progress(done, total, label):
            bar.update(task, total=total, completed=done, description=label)

        counts = run_sweep(spec, space, output, rules=rules, progress=progress)
    typer.echo(f"{counts['written']} problems planned, {counts['skipped']} already in {output} "
               f"(of {counts['problems']})", err=True)
