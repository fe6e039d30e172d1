"""`autoparallel plan`: the best layouts for N GPUs, ranked, explained."""

from __future__ import annotations

import json
from contextlib import nullcontext
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..errors import InfeasibleError, SpecError
from ..search.explain import (cp_forms_line, largest_costs, nothing_fits_message, versus,
                              why_first)
from ..search.plan import plan
from ..search.robust import RANK_BY, why_recommended
from . import app
from ..cost.arch import build_arch
from .render import layout_slug, make_console, params_label, ranked_table
from ..limits import MAX_KEEP, MAX_TOP, MAX_TOP_TABLE, check_int
from .outputs import check_output, working
from .options import Fmt, ProblemOptions, SearchOptions, with_options

def print_plan(result, console: Console, vs=None) -> None:
    d = result.problem.describe()
    params = params_label(build_arch(result.problem.model).param_counts())
    console.print(
        f"[b]{d['model']}[/b] ({params}) on {d['n_gpus']} x {d['gpu']} ({d['gpus_per_node']} per node), "
        f"seq {d['seq_len']}, global batch {d['global_batch']}: {result.n_layouts:,} layouts, "
        f"{result.n_valid:,} pass the rules, {result.n_fit:,} fit "
        f"({result.search_s * 1e3:.0f} ms)"
    )
    rows = []
    for rec in result.records():
        ts = rec["time_s"]
        rows.append((str(rec["rank"]), layout_slug(rec), [
            ("mem GiB", f"{rec['memory_gib']['total']:.1f}"),
            ("mem high", f"{rec['memory_gib']['total_high']:.1f}"),
            ("step s", f"{ts['step']:.3f}"),
            ("band s", f"{ts['step_low']:.3g}-{ts['step_high']:.3g}"),
            ("tied", "yes" if rec["tied"] else "no"),
            ("robust s", f"{rec['robustness']['score_s']:.3g}"),
            ("MFU", f"{rec['mfu'] * 100:.1f}%"),
            ("tok/s/GPU", f"{rec['tokens_per_s_per_gpu']:,.0f}")]))
    table = ranked_table(rows, console.width)
    console.print(table)
    if result.rank_by == "time":
        console.print(why_first(result.ranked))
    console.print(why_recommended(result))
    band = result.records()[0]["band"] if len(result.ranked) else None
    if band:
        console.print(f"[dim]bands: {band['note']} ({', '.join(band['step_sources']) or 'none'}); "
                      "docs/validation.md#error-bands[/dim]")
    console.print(f"#1 largest costs: {largest_costs(result.ranked, 0)}")
    forms = cp_forms_line(result)
    if forms:
        console.print(forms)
    if vs is not None:
        console.print(f"versus {versus(result, vs)}")
    if result.reject_counts:
        counts = ", ".join(f"{k} {v:,}" for k, v in sorted(result.reject_counts.items(), key=lambda kv: -kv[1]))
        console.print(f"[dim]rejected by rule (a layout may break several): {counts}[/dim]")
    if result.study is not None:
        where = "in memory" if result.storage is None else result.storage
        more = (f"; the best {result.kept:,} of {result.n_fit:,} fitting layouts (raise --keep "
                "for more)") if result.kept < result.n_fit else ""
        console.print(f"[dim]Optuna study {result.study.study_name!r} ({where}): "
                      f"{len(result.study.trials):,} trials{more}[/dim]")


@app.command("plan")
@with_options(problem=ProblemOptions, search=SearchOptions)
def plan_command(
    problem: ProblemOptions,
    search: SearchOptions,
    top: Annotated[int, typer.Option(help="How many layouts to show.")] = 10,
    fmt: Annotated[Fmt, typer.Option("--format", help="table, json or csv.")] = Fmt.table,
    plot: Annotated[Optional[str], typer.Option(help="Write a PNG of breakdowns and the Pareto cloud.", show_default=False)] = None,
    objective: Annotated[str, typer.Option(help="time, or a Pareto front: time,memory or time,gpus.")] = "time",
    target: Annotated[Optional[str], typer.Option(help="Keep only layouts this launcher can run (megatron, torchtitan, deepspeed, nanotron, slurm).", show_default=False)] = None,
    keep: Annotated[int, typer.Option(help="Fitting layouts stored as Optuna trials.")] = 1000,
    versus_slug: Annotated[Optional[str], typer.Option("--versus", help="A layout slug (e.g. a published one, dp128-tp8-pp16[7,8x14,7]-z2) to rank against #1.", show_default=False)] = None,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL (sqlite:///plan.db, postgresql://...).", show_default=False)] = None,
    study: Annotated[Optional[str], typer.Option(help="Optuna study name.", show_default=False)] = None,
    rank_by: Annotated[str, typer.Option("--rank-by", help="time (fastest first) or robust (layouts tied with the fastest within the error band, by step x (1 + robustness penalty)).")] = "time",
) -> None:
    """Rank every layout that fits, fastest first, and explain the winner."""
    check_int("--top", top, high=MAX_TOP if fmt != Fmt.table else MAX_TOP_TABLE,
              why="" if fmt != Fmt.table else "rows of a table; --format csv or json takes more")
    check_int("--keep", keep, low=0, high=MAX_KEEP, why="each kept layout is an Optuna trial")
    check_output("--plot", plot, plot=True)
    problem = problem.for_target(target).build()
    sp_space = search.search_space()
    rules = search.rules()
    objectives = [o.strip() for o in objective.split(",")]
    if objectives not in (["time"], ["time", "memory"], ["time", "gpus"]):
        raise SpecError(f"`--objective` = {objective!r}: use time, time,memory or time,gpus")
    if len(objectives) == 2:
        from .pareto_cmd import run_pareto

        ignored = [flag for flag, given in (
            ("--target", target is not None), ("--plot", plot is not None),
            ("--versus", versus_slug is not None), ("--rank-by robust", rank_by != "time"),
            ("--top", top != 10 and objectives[1] == "memory")) if given]
        if ignored:
            raise SpecError(f"`--objective {objective}` gives a Pareto front and does not "
                            f"use {', '.join(ignored)}; drop {'it' if len(ignored) == 1 else 'them'}, "
                            "or use --objective time")

        run_pareto(problem, sp_space, rules, objectives[1], top, fmt, storage, study)
        return
    if rank_by not in RANK_BY:
        raise SpecError(f"`--rank-by` = {rank_by!r}: choose {' or '.join(RANK_BY)}")
    if keep < 0:
        raise SpecError(f"`--keep` = {keep}: must be 0 (no Optuna study) or more")
    with working(f"planning; storing up to {keep:,} layouts in {storage}") if storage else nullcontext():
        result = plan(problem, sp_space, top=top, rules=rules, keep=keep, storage=storage,
                      study_name=study, with_study=keep > 0, target=target, rank_by=rank_by)
    if fmt == Fmt.json:
        typer.echo(json.dumps(result.to_json(), indent=2))
    elif fmt == Fmt.csv:
        from ..output.frames import ranked_frame

        typer.echo(ranked_frame(result).to_csv(index=False), nl=False)
    elif result.n_fit:
        vs = None
        if versus_slug is not None:
            from ..specs.layout import Layout

            try:
                vs = Layout.from_slug(versus_slug)
            except ValueError as exc:
                raise SpecError(f"`--versus` = {versus_slug!r}: {exc}") from None
        print_plan(result, make_console(), vs)
    if plot and result.n_fit:
        from ..output.plot import plot_plan

        plot_plan(result, plot, top=top)
        Console(stderr=True).print(f"plot written to {plot}")
    if result.n_fit == 0:
        raise InfeasibleError(nothing_fits_message(result))
