"""`autoparallel export`: write the launcher file (Megatron-LM script, TorchTitan TOML, DeepSpeed
JSON, Nanotron YAML, sbatch script) of one layout, chosen by rank, by flags or by a CSV row."""

from __future__ import annotations

import os
import stat
from typing import Annotated, Optional

import typer

from ..errors import ExportError, InfeasibleError, SpecError
from ..specs.layout import CpComm, Layout, Recompute
from . import app
from .options import ProblemOptions, with_problem_options

IntOpt = Annotated[Optional[int], typer.Option(show_default=False)]


def _layout_from_flags(values: dict) -> Layout:
    given = {k: v for k, v in values.items() if v is not None}
    try:
        if "stage_layers" in given:
            from ..specs.layout import parse_stage_layers

            given["stage_layers"] = parse_stage_layers(given["stage_layers"])
        return Layout(**given)
    except ValueError as exc:
        from ..errors import format_validation_error

        raise SpecError(format_validation_error(exc, "layout")) from None


def _ranked_layout(problem, rank: int, target: str) -> Layout:
    """The `rank`-th layout of `plan --target target`: ranks count among the layouts the target
    can launch, as `plan --target` lists them."""
    from ..search.explain import nothing_fits_message
    from ..search.plan import plan

    if rank < 1:
        raise SpecError(f"`--rank` = {rank}: ranks start at 1 (the fastest layout)")
    result = plan(problem, top=rank, target=target)
    if result.n_fit == 0:
        raise InfeasibleError(nothing_fits_message(result))
    if rank > len(result.ranked):
        raise ExportError(f"--rank {rank}: only {result.n_fit} layout(s) that {target} can "
                          f"launch fit this problem (`autoparallel plan --target {target}`)")
    return result.ranked.table.row(rank - 1)


def _warn_if_unfit(problem, layout: Layout) -> None:
    from ..evaluate import estimate
    from ..rules import active_rules

    try:
        rec = estimate(problem, layout, rules=active_rules(disabled=["tp_in_node"]))
    except SpecError:
        return
    if not rec["fits"]:
        mem = rec["memory_gib"]
        typer.echo(f"warning: {layout.resolved(problem.cluster.n_gpus).slug} is predicted not to "
                   f"fit: {mem['total']:.1f} GiB per GPU of {mem['usable']:.1f} usable", err=True)


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        if text.startswith("#!"):
            mode = os.stat(path).st_mode
            os.chmod(path, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except OSError as exc:
        raise SpecError(f"--output {path}: cannot write ({exc.strerror or exc})") from None


@app.command("export")
@with_problem_options
def export_command(
    problem: ProblemOptions,
    target: Annotated[Optional[str], typer.Option("--target", help="megatron, torchtitan, deepspeed, nanotron or slurm.", show_default=False)] = None,
    output: Annotated[Optional[str], typer.Option("--output", help="File to write (default: stdout).", show_default=False)] = None,
    rank: Annotated[Optional[int], typer.Option("--rank", help="Export the N-th layout of `autoparallel plan` (1 = fastest).", show_default=False)] = None,
    dp: Annotated[Optional[int], typer.Option(help="Data-parallel degree (default: derived).", show_default=False)] = None,
    tp: Annotated[Optional[int], typer.Option(help="Tensor-parallel degree [1].", show_default=False)] = None,
    pp: Annotated[Optional[int], typer.Option(help="Pipeline-parallel degree [1].", show_default=False)] = None,
    vp: Annotated[Optional[int], typer.Option(help="Virtual stages per pipeline rank [1].", show_default=False)] = None,
    cp: Annotated[Optional[int], typer.Option(help="Context-parallel degree [1].", show_default=False)] = None,
    cp_comm: Annotated[Optional[CpComm], typer.Option(help="Context-parallel form with cp > 1: ring, a2a, allgather, a2a+ring; default ring.", show_default=False)] = None,
    cp_a2a: Annotated[Optional[int], typer.Option(help="With --cp-comm a2a+ring: ranks per all-to-all group.", show_default=False)] = None,
    ep: Annotated[Optional[int], typer.Option(help="Expert-parallel degree [1].", show_default=False)] = None,
    zero: Annotated[Optional[int], typer.Option(help="ZeRO stage 0-3 [1].", show_default=False)] = None,
    recompute: Annotated[Optional[Recompute], typer.Option(help="Activation recomputation [none].", show_default=False)] = None,
    sp: Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="Sequence parallelism (default: on when tp > 1).", show_default=False)] = None,
    micro_batch: Annotated[Optional[int], typer.Option(help="Sequences per micro-batch [1].", show_default=False)] = None,
    stage_layers: Annotated[Optional[str], typer.Option(help="Layers per pipeline stage, e.g. 7,8x14,7 [even].", show_default=False)] = None,
    schedule: Annotated[Optional[str], typer.Option(help="Pipeline schedule [1f1b; interleaved with vp > 1].", show_default=False)] = None,
    recompute_num_layers: Annotated[Optional[int], typer.Option(help="With --recompute full: recompute only the first N layers of each model chunk [all].", show_default=False)] = None,
    recompute_modules: Annotated[Optional[str], typer.Option(help="With --recompute selective: modules re-run, comma-separated (Megatron --recompute-modules) [core_attn].", show_default=False)] = None,
    recompute_group: Annotated[Optional[int], typer.Option(help="With --recompute full: uniform checkpoint groups of N layers (Megatron --recompute-method uniform) [1].", show_default=False)] = None,
    offload_layers: Annotated[Optional[int], typer.Option(help="Activation offload of the first N layers of each stage (Megatron-Core --cpu-offloading-num-layers) [0].", show_default=False)] = None,
    optimizer_offload: Annotated[Optional[float], typer.Option(help="Share of the optimizer state offloaded to the host (Megatron --optimizer-offload-fraction) [0].", show_default=False)] = None,
    from_csv: Annotated[Optional[str], typer.Option("--from", help="Sweep CSV holding the problem and the layout (with --row).", show_default=False)] = None,
    row: Annotated[Optional[int], typer.Option("--row", help="Data row of the --from CSV, numbered from 1.", show_default=False)] = None,
    target_version: Annotated[Optional[str], typer.Option("--target-version", help="Launcher release for torchtitan: 0.3 (current, Python config module) or 0.2 / 0.2.2 (TOML).", show_default=False)] = None,
    time: Annotated[Optional[str], typer.Option("--time", help="slurm: #SBATCH --time (e.g. 2:00:00); written only when given.", show_default=False)] = None,
    partition: Annotated[Optional[str], typer.Option("--partition", help="slurm: #SBATCH --partition.", show_default=False)] = None,
    account: Annotated[Optional[str], typer.Option("--account", help="slurm: #SBATCH --account.", show_default=False)] = None,
    qos: Annotated[Optional[str], typer.Option("--qos", help="slurm: #SBATCH --qos.", show_default=False)] = None,
) -> None:
    """Write a launcher file for one layout: --rank N of the plan, layout flags, or --from CSV --row K."""
    from ..exporters import EXPORTERS, get_exporter, render

    if target is None:
        raise SpecError(f"missing --target: choose one of {', '.join(EXPORTERS)}")
    sbatch = {"time": time, "partition": partition, "account": account, "qos": qos}
    exporter = get_exporter(target, target_version, **sbatch)
    flags = {"dp": dp, "tp": tp, "pp": pp, "vp": vp, "cp": cp, "cp_comm": cp_comm,
             "cp_a2a": cp_a2a, "ep": ep, "zero": zero,
             "recompute": recompute, "sp": sp, "micro_batch": micro_batch,
             "stage_layers": stage_layers, "schedule": schedule,
             "recompute_layers": recompute_num_layers, "recompute_group": recompute_group,
             "recompute_modules": recompute_modules.split(",") if recompute_modules else None,
             "offload_layers": offload_layers, "optimizer_offload": optimizer_offload}
    cli_name = {"recompute_layers": "recompute_num_layers"}
    layout_flags = [f"--{cli_name.get(k, k).replace('_', '-')}" for k, v in flags.items()
                    if v is not None]
    if from_csv is not None:
        problem_flags = problem.given() + (["--rank"] if rank is not None else [])
        if problem_flags or layout_flags:
            raise SpecError(f"--from takes the problem and the layout from the CSV row; drop "
                            f"{', '.join(problem_flags + layout_flags)}")
        if row is None:
            raise SpecError("--from needs --row K (data rows are numbered from 1)")
        from ..exporters.from_csv import read_sweep_row

        problem, layout = read_sweep_row(from_csv, row)
    else:
        if row is not None:
            raise SpecError("--row needs --from sweep.csv")
        problem = problem.for_target(target).build()
        if rank is not None and layout_flags:
            raise SpecError(f"give either --rank or layout flags, not both (got --rank and "
                            f"{', '.join(layout_flags)})")
        if rank is not None:
            layout = _ranked_layout(problem, rank, target)
        elif layout_flags:
            layout = _layout_from_flags(flags)
        else:
            raise SpecError("which layout? give --rank N (the N-th of `autoparallel plan`), "
                            "layout flags (--tp 8 --pp 4 ...), or --from sweep.csv --row K")
    text = render(target, problem, layout, target_version, **sbatch)
    if rank is None:
        _warn_if_unfit(problem, layout)
    from ..exporters import Job

    note = exporter.companion(Job.of(problem, layout))
    if note and output:
        _write(output + ".notes.txt", note)
        typer.echo(f"wrote what the model code must provide to {output}.notes.txt", err=True)
    elif note:
        typer.echo("".join(f"note: {line}\n" for line in note.splitlines()), err=True, nl=False)
    if output:
        _write(output, text)
        typer.echo(f"wrote {exporter.summary.split(':')[0]} for "
                   f"{layout.resolved(problem.cluster.n_gpus).slug} to {output}", err=True)
    else:
        typer.echo(text, nl=False)
