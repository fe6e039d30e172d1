"""`autoparallel plan`: the best layouts for N GPUs, ranked, explained."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import InfeasibleError, SpecError
from ..rules import active_rules
from ..search.explain import largest_costs, nothing_fits_message, why_first
from ..search.plan import plan
from ..search.space import SearchSpace, load_space, parse_int_list
from ..specs.layout import Recompute
from . import app
from .render import make_console
from .options import Fmt, ProblemOptions, with_problem_options

AxisOpt = Annotated[Optional[str], typer.Option(help="Comma-separated values to allow.", show_default=False)]


def space_from_options(space_file, tp, pp, vp, cp, ep, zero, recompute, sp, micro_batch) -> SearchSpace:
    """Search space from a file and/or flags (flags narrow the file)."""
    space = load_space(space_file) if space_file else SearchSpace()
    rc = None
    if recompute is not None:
        names = [r.strip() for r in recompute.split(",") if r.strip()]
        bad = [r for r in names if r not in {x.value for x in Recompute}]
        if bad or not names:
            raise SpecError(f"`--recompute` = {recompute!r}: choose from none, selective, full")
        rc = names
    sp_values = None
    if sp is not None:
        sp_values = {"on": [True], "off": [False], "both": [True, False]}.get(sp)
        if sp_values is None:
            raise SpecError(f"`--sp` = {sp!r}: choose on, off or both")
    return space.narrowed(
        tp=parse_int_list(tp, "--tp"), pp=parse_int_list(pp, "--pp"), vp=parse_int_list(vp, "--vp"),
        cp=parse_int_list(cp, "--cp"), ep=parse_int_list(ep, "--ep"),
        zero=parse_int_list(zero, "--zero"), recompute=rc, sp=sp_values,
        micro_batch=parse_int_list(micro_batch, "--micro-batch"),
    )


def rules_from_options(allow_tp_across_nodes: bool, ep_in_node: bool):
    return active_rules(disabled=["tp_in_node"] if allow_tp_across_nodes else [],
                        enabled=["ep_in_node"] if ep_in_node else [])


def print_plan(result, console: Console) -> None:
    d = result.problem.describe()
    console.print(
        f"[b]{d['model']}[/b] on {d['n_gpus']} x {d['gpu']} ({d['gpus_per_node']} per node), "
        f"seq {d['seq_len']}, global batch {d['global_batch']}: {result.n_layouts:,} layouts, "
        f"{result.n_valid:,} pass the rules, {result.n_fit:,} fit "
        f"({result.search_s * 1e3:.0f} ms)"
    )
    table = Table(show_edge=False)
    for col, justify in (("rank", "right"), ("layout", "left"), ("mem GiB", "right"),
                         ("step s", "right"), ("MFU", "right"), ("tok/s/GPU", "right")):
        table.add_column(col, justify=justify)
    for rec in result.records():
        lay = rec["layout"]
        sp = "-sp" if lay["sp"] else ""
        slug = (f"dp{lay['dp']}-tp{lay['tp']}-pp{lay['pp']}-vp{lay['vp']}-cp{lay['cp']}-ep{lay['ep']}"
                f"-z{lay['zero']}-r{lay['recompute']}{sp}-mb{lay['micro_batch']}")
        table.add_row(str(rec["rank"]), slug, f"{rec['memory_gib']['total']:.1f}",
                      f"{rec['time_s']['step']:.3f}", f"{rec['mfu'] * 100:.1f}%",
                      f"{rec['tokens_per_s_per_gpu']:,.0f}")
    console.print(table)
    console.print(why_first(result.ranked))
    console.print(f"#1 largest costs: {largest_costs(result.ranked, 0)}")
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
@with_problem_options
def plan_command(
    problem: ProblemOptions,
    top: Annotated[int, typer.Option(help="How many layouts to show.")] = 10,
    fmt: Annotated[Fmt, typer.Option("--format", help="table, json or csv.")] = Fmt.table,
    plot: Annotated[Optional[str], typer.Option(help="Write a PNG of breakdowns and the Pareto cloud.", show_default=False)] = None,
    space: Annotated[Optional[str], typer.Option(help="Search-space TOML file.", show_default=False)] = None,
    tp: AxisOpt = None, pp: AxisOpt = None, vp: AxisOpt = None, cp: AxisOpt = None,
    ep: AxisOpt = None, zero: AxisOpt = None,
    recompute: Annotated[Optional[str], typer.Option(help="Comma-separated: none,selective,full.", show_default=False)] = None,
    sp: Annotated[Optional[str], typer.Option(help="on, off or both.", show_default=False)] = None,
    micro_batch: AxisOpt = None,
    allow_tp_across_nodes: Annotated[bool, typer.Option(help="Let TP groups span nodes.")] = False,
    ep_in_node: Annotated[bool, typer.Option(help="Require tp x ep inside one node.")] = False,
    objective: Annotated[str, typer.Option(help="time, or a Pareto front: time,memory or time,gpus.")] = "time",
    target: Annotated[Optional[str], typer.Option(help="Keep only layouts this launcher can run (megatron, torchtitan, deepspeed, nanotron, slurm).", show_default=False)] = None,
    keep: Annotated[int, typer.Option(help="Fitting layouts stored as Optuna trials.")] = 1000,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL (sqlite:///plan.db, postgresql://...).", show_default=False)] = None,
    study: Annotated[Optional[str], typer.Option(help="Optuna study name.", show_default=False)] = None,
) -> None:
    """Rank every layout that fits, fastest first, and explain the winner."""
    if top < 1:
        raise SpecError(f"`--top` = {top}: must be at least 1")
    problem = problem.build()
    sp_space = space_from_options(space, tp, pp, vp, cp, ep, zero, recompute, sp, micro_batch)
    rules = rules_from_options(allow_tp_across_nodes, ep_in_node)
    objectives = [o.strip() for o in objective.split(",")]
    if objectives not in (["time"], ["time", "memory"], ["time", "gpus"]):
        raise SpecError(f"`--objective` = {objective!r}: use time, time,memory or time,gpus")
    if len(objectives) == 2:
        from .pareto_cmd import run_pareto

        run_pareto(problem, sp_space, rules, objectives[1], top, fmt, storage, study)
        return
    if keep < 0:
        raise SpecError(f"`--keep` = {keep}: must be 0 (no Optuna study) or more")
    result = plan(problem, sp_space, top=top, rules=rules, keep=keep, storage=storage,
                  study_name=study, with_study=keep > 0, target=target)
    if fmt == Fmt.json:
        typer.echo(json.dumps(result.to_json(), indent=2))
    elif fmt == Fmt.csv:
        from ..output.frames import ranked_frame

        typer.echo(ranked_frame(result).to_csv(index=False), nl=False)
    elif result.n_fit:
        print_plan(result, make_console())
    if plot and result.n_fit:
        from ..output.plot import plot_plan

        plot_plan(result, plot, top=top)
        Console(stderr=True).print(f"plot written to {plot}")
    if result.n_fit == 0:
        raise InfeasibleError(nothing_fits_message(result))
