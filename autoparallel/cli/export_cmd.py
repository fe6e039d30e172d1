"""`autoparallel export`: write the launcher file (Megatron-LM script, TorchTitan TOML, DeepSpeed
JSON, Nanotron YAML, sbatch script) of one layout, chosen by rank, by flags or by a CSV row."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import ExportError, InfeasibleError, SpecError
from . import command
from .options import (OUTPUT, TARGET_NAMES, ProblemOptions, layout_options_class,
                      with_options)

EXPORT = "Export"
SLURM = "Slurm (--target slurm)"


def _ranked_layout(problem, rank: int, target: str):
    """The `rank`-th layout of `plan --target target` for this problem (the stack given, else
    the one the target runs): ranks count among the layouts the target can launch, as `plan
    --target` lists them."""
    from ..search.explain import nothing_fits_message
    from ..search.plan import plan
    from ..search.top import ranked_top

    if rank < 1:
        raise SpecError(f"`--rank` = {rank}: ranks start at 1 (the fastest layout)")
    head = ranked_top(problem, top=rank, target=target)  # the ranking's head (`plan`'s)
    if head is None:  # nothing the target can launch fits: the plan says why
        raise InfeasibleError(nothing_fits_message(plan(problem, top=1, target=target)))
    if rank > len(head):  # fewer fit than the rank: all of them are in the head
        raise ExportError(f"--rank {rank}: only {len(head)} layout(s) that {target} can "
                          f"launch fit this problem (`autoparallel plan --target {target}`)")
    return head.table.row(rank - 1)


def _warn_if_unfit(problem, layout) -> None:
    from ..evaluate import estimate
    from ..rules import active_rules

    try:
        rec = estimate(problem, layout, rules=active_rules(disabled=["tp_in_node"]))
    except SpecError:
        return
    mem = rec["memory_gib"]
    if not rec["fits"]:
        from ..search.explain import fit_figure_of

        typer.echo(f"warning: {rec['slug']} is predicted not to fit: {fit_figure_of(rec)} per "
                   f"GPU of its {mem['usable']:.1f} usable", err=True)
    elif rec["memory_risk"]:
        typer.echo(f"warning: {rec['slug']} may run out of memory: its memory band reaches "
                   f"{mem['total_high']:.1f} GiB per GPU, above its {mem['usable']:.1f} usable",
                   err=True)


def _write(path: str, text: str) -> None:
    """The whole file or nothing (`output.files.write_whole`); a script is made executable."""
    from ..output.files import write_whole

    write_whole("--output", path, text, executable=text.startswith("#!"))


def _opt(flag: str, help_text: str, panel: str = EXPORT, metavar: str = "TEXT"):
    return typer.Option(flag, help=help_text, rich_help_panel=panel, metavar=metavar,
                        show_default=False)


@command("export")
@with_options(problem=ProblemOptions, layout=layout_options_class)
def export_command(
    problem: ProblemOptions,
    layout,
    target: Annotated[Optional[str], _opt("--target", f"Launcher: {TARGET_NAMES}.", metavar="NAME")] = None,
    rank: Annotated[Optional[int], _opt("--rank", "Export the N-th layout of `autoparallel plan --target NAME` (1 = fastest).", metavar="N")] = None,
    from_csv: Annotated[Optional[str], _opt("--from", "Sweep CSV holding the problem and the layout (with --row).", metavar="CSV")] = None,
    row: Annotated[Optional[int], _opt("--row", "Data row of the --from CSV, numbered from 1.", metavar="N")] = None,
    target_version: Annotated[Optional[str], _opt("--target-version", "torchtitan release: 0.3 (Python config module) or 0.2 (TOML).", metavar="VERSION")] = None,
    output: Annotated[Optional[str], _opt("--output", "File to write (default: stdout).", OUTPUT, "FILE")] = None,
    time: Annotated[Optional[str], _opt("--time", "#SBATCH --time, e.g. 2:00:00 (written only when given).", SLURM)] = None,
    partition: Annotated[Optional[str], _opt("--partition", "#SBATCH --partition.", SLURM)] = None,
    account: Annotated[Optional[str], _opt("--account", "#SBATCH --account.", SLURM)] = None,
    qos: Annotated[Optional[str], _opt("--qos", "#SBATCH --qos.", SLURM)] = None,
) -> None:
    """Write a launcher file for one layout: --rank N of the plan, --layout SLUG or layout flags,
    or --from CSV --row K."""
    from ..exporters import EXPORTERS, get_exporter, render
    from .outputs import check_output

    if target is None:
        raise SpecError(f"missing --target: choose one of {', '.join(EXPORTERS)}")
    sbatch = {"time": time, "partition": partition, "account": account, "qos": qos}
    exporter = get_exporter(target, target_version, **sbatch)
    check_output("--output", output)
    layout_flags = layout.flags()
    if from_csv is not None:
        problem_flags = problem.given() + (["--rank"] if rank is not None else [])
        if problem_flags or layout_flags:
            raise SpecError(f"--from takes the problem and the layout from the CSV row; drop "
                            f"{', '.join(problem_flags + layout_flags)}")
        if row is None:
            raise SpecError("--from needs --row K (data rows are numbered from 1)")
        from ..exporters.from_csv import read_sweep_row

        built, lay = read_sweep_row(from_csv, row)
    else:
        if row is not None:
            raise SpecError("--row needs --from sweep.csv")
        if rank is not None and layout_flags:
            raise SpecError(f"give either --rank or layout flags, not both (got --rank and "
                            f"{', '.join(layout_flags)})")
        if rank is None and not layout_flags:
            raise SpecError("which layout? give --rank N (the N-th of `autoparallel plan`), "
                            "--layout SLUG or layout flags (--tp 8 --pp 4 ...), or --from "
                            "sweep.csv --row K")
        lay = layout.layout() if layout_flags else None
        problem.check()
        if rank is not None:
            _, note = problem.implied_stack(target)
            if note and problem.stack is None:
                typer.echo(f"note: {note}; --rank {rank} is rank {rank} of `autoparallel plan "
                           f"--target {target}` on that stack", err=True)
        built = problem.for_target(target).build()
        if rank is not None:
            lay = _ranked_layout(built, rank, target)
    from ..splits import with_default_split

    lay, split_note = with_default_split(built, lay)
    text = render(target, built, lay, target_version, **sbatch)
    if split_note:
        typer.echo(f"note: {split_note}", err=True)
    if rank is None:
        _warn_if_unfit(built, lay)
    from ..exporters import Job

    note = exporter.companion(Job.of(built, lay))
    if note and output:
        _write(output + ".notes.txt", note)
        typer.echo(f"wrote what the model code must provide to {output}.notes.txt", err=True)
    elif note:
        typer.echo("".join(f"note: {line}\n" for line in note.splitlines()), err=True, nl=False)
    if output:
        _write(output, text)
        typer.echo(f"wrote {exporter.summary.split(':')[0]} for "
                   f"{lay.resolved(built.cluster.n_gpus).slug} to {output}", err=True)
    else:
        typer.echo(text, nl=False)
