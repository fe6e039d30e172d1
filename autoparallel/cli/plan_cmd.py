"""`autoparallel plan`: the best layouts for N GPUs, ranked, explained."""

from __future__ import annotations

import shlex
from contextlib import nullcontext
from typing import Annotated, Optional

import numpy as np
import typer
from rich.markup import escape

from ..output.files import strict_json
from ..errors import InfeasibleError, SpecError
from ..limits import MAX_KEEP, MAX_TOP, MAX_TOP_TABLE, check_int
from . import command
from .options import (SEARCH, TARGET_NAMES, TARGET_STACKS, Fmt, FormatOpt, PlotOpt,
                      ProblemOptions,
                      SearchOptions, with_options)
from .outputs import check_output, working

EXPORT_TARGET = {stack: target for target, stack in reversed(TARGET_STACKS.items())}
"""The export target that launches each stack (megatron for megatron-core)."""


def problem_line(result, note: str | None = None) -> str:
    """'llama3-70b (70.6B params) on 64 x h100 (8 per node), seq 8192, global batch 512;
    megatron-core, bf16: 33,768 layouts, ...': what was planned, on which stack and precision,
    with the MoE settings that differ from the stack's (`Problem.moe_settings_changed`)."""
    from ..cost.model_arch import build_arch
    from .render import params_label, settings_text

    d = result.problem.describe()
    params = params_label(build_arch(result.problem.model).param_counts())
    stack = f"{d['stack']}{f' ({note})' if note else ''}, {d['precision']}"
    stack += settings_text(result.problem.moe_settings_changed())  # beyond the stack's
    net = f", network {d['network']}" if d.get("network") else ""
    # names from the user's files are text, not Rich markup
    return (f"[b]{escape(d['model'])}[/b] ({params}) on {d['n_gpus']} x {escape(d['gpu'])} "
            f"({d['gpus_per_node']} "
            f"per node{net}), seq {d['seq_len']}, global batch {d['global_batch']}; {stack}: "
            f"{result.n_layouts:,} layouts, {result.n_valid:,} pass the rules, "
            f"{result.n_fit:,} fit ({result.search_s * 1e3:.0f} ms)")


def shell_lines(argv: list[str], width: int) -> list[str]:
    """A command as lines of at most `width` characters where it can, continued with ` \\`
    (copy-pastable into a shell): arguments quoted where needed, never split, and a flag kept
    on the line of its value."""
    words = [shlex.quote(a) for a in argv]
    units: list[str] = []
    i = 0
    while i < len(words):
        if words[i].startswith("-") and i + 1 < len(words) and not words[i + 1].startswith("-"):
            units.append(f"{words[i]} {words[i + 1]}")
            i += 2
        else:
            units.append(words[i])
            i += 1
    lines = [units[0]]
    for unit in units[1:]:
        if len(lines[-1]) + 1 + len(unit) + 2 <= width or len(lines[-1]) <= 4:
            lines[-1] += " " + unit
        else:
            lines[-1] += " \\"
            lines.append("    " + unit)
    return lines


def export_hint(result, problem_argv: list[str], target: str | None) -> tuple[str, list[str]]:
    """(what the command does, argv) of the `autoparallel export` that writes #1; argv empty
    (and the text says why) when no launcher can: the stack has none, or #1 is outside it."""
    from ..exporters import check

    first = result.ranked.table.row(0)
    stack = result.problem.job.stack
    tgt = target or EXPORT_TARGET.get(stack)
    if tgt is None:
        return (f"no export target launches the {stack} stack "
                f"(targets: {', '.join(TARGET_STACKS)})", [])
    reasons = check(tgt, result.problem, first)
    if reasons:
        return (f"{tgt} cannot write #1 ({reasons[0]}); `plan --target {tgt}` ranks the layouts "
                "it can", [])
    argv = ["autoparallel", "export", "--target", tgt, *problem_argv, "--layout", first.slug,
            "--output", _default_file(tgt)]
    return "write #1's launcher file", argv


def _default_file(target: str) -> str:
    return {"megatron": "train.sh", "slurm": "train.sbatch", "torchtitan": "train_config.py",
            "deepspeed": "ds_config.json", "nanotron": "config.yaml",
            "megatron-bridge": "train_bridge.py"}.get(target, "launch.txt")


def print_plan(result, console, vs=None, *, note: str | None = None,
               export: tuple[str, list[str]] | None = None) -> None:
    """The plan as a table and its explanations: the header (problem, stack, precision, counts),
    the ranked layouts, why #1, the robust pick, the bands' basis, the usable memory and the
    layouts at memory risk, #1's largest costs, `vs` against #1, the rules' rejections, the
    Optuna study when one was asked for, and the command that exports #1 (`export`)."""
    from ..search.explain import (cp_forms_line, largest_costs, tier_crossings,
                                  usable_memory_line, versus, why_first)
    from ..search.robust import why_recommended
    from .render import layout_slug, ranked_table

    console.print(problem_line(result, note))
    rows = []
    records = result.records()
    for rec in records:
        ts = rec["time_s"]
        risk = "!" if rec["memory_risk"] else ""
        rows.append((str(rec["rank"]), layout_slug(rec), [
            ("mem GiB", f"{rec['memory_gib']['total']:.1f}"),
            ("mem high", f"{rec['memory_gib']['total_high']:.1f}{risk}"),
            ("step s", f"{ts['step']:.3f}"),
            ("band s", f"{ts['step_low']:.3g}-{ts['step_high']:.3g}"),
            ("tied", "yes" if rec["tied"] else "no"),
            ("robust s", f"{rec['robustness']['score_s']:.3g}"),
            ("MFU", f"{rec['mfu'] * 100:.1f}%"),
            ("tok/s/GPU", f"{rec['tokens_per_s_per_gpu']:,.0f}")]))
    console.print(ranked_table(rows, console.width))
    if result.rank_by == "time":
        # #1 against #2 of every fitting layout, also when --top 1 shows #1 alone
        survivors = result.survivors if result.survivors is not None else result.ranked
        console.print(why_first(survivors.take(np.arange(min(2, len(survivors))))))
    console.print(why_recommended(result))
    band = records[0]["band"] if records else None
    if band:
        console.print(f"[dim]bands: {band['note']} ({', '.join(band['step_sources']) or 'none'}); "
                      "docs/validation.md#error-bands[/dim]")
    console.print(usable_memory_line(records))
    console.print(f"#1 largest costs: {largest_costs(result.ranked, 0)}")
    console.print(f"#1 groups by the outermost tier they cross: {tier_crossings(result.ranked, 0)}")
    forms = cp_forms_line(result)
    if forms:
        console.print(forms)
    if vs is not None:
        console.print(f"versus {versus(result, vs)}")
    ignored = result.problem.ignored_note()  # settings given that change nothing here
    if ignored:
        console.print(f"note: {ignored}")
    rejected = dict(result.reject_counts)
    beaten = rejected.pop("cp_split_dominated", 0)  # not a rule: a search reduction
    if rejected:
        counts = ", ".join(f"{k} {v:,}" for k, v in sorted(rejected.items(), key=lambda kv: -kv[1]))
        console.print(f"[dim]rejected by rule (a layout may break several): {counts}[/dim]")
    if beaten:
        console.print(f"[dim]not costed: {beaten:,} layouts whose a2a+ring split another split "
                      "of the same layout beats on CP time and buffers (search/dominated.py)"
                      "[/dim]")
    if result.study is not None:
        where = "in memory" if result.storage is None else result.storage
        more = (f"; the best {result.kept:,} of {result.n_fit:,} fitting layouts (raise --keep "
                "for more)") if result.kept < result.n_fit else ""
        console.print(f"[dim]Optuna study {result.study.study_name!r} ({where}): "
                      f"{len(result.study.trials):,} trials{more}[/dim]")
    if export is not None:
        what, argv = export
        if not argv:
            console.print(f"[dim]export: {what}[/dim]")
        else:
            console.print(f"{what}:")
            for line in shell_lines(argv, console.width - 2):
                console.print("  " + line, markup=False, highlight=False, soft_wrap=True)


@command("plan")
@with_options(problem=ProblemOptions, search=SearchOptions)
def plan_command(
    problem: ProblemOptions,
    search: SearchOptions,
    top: Annotated[int, typer.Option(help="How many layouts to show.", metavar="N", rich_help_panel=SEARCH)] = 10,
    objective: Annotated[str, typer.Option(help="time, or a Pareto front: time,memory or time,gpus.", metavar="time|time,memory|time,gpus")] = "time",
    rank_by: Annotated[str, typer.Option("--rank-by", help="time: fastest first; robust: the layouts tied with the fastest, most robust first.", metavar="time|robust")] = "time",
    target: Annotated[Optional[str], typer.Option(help=f"Keep only layouts this launcher can write ({TARGET_NAMES}).", metavar="NAME", show_default=False)] = None,
    versus_slug: Annotated[Optional[str], typer.Option("--versus", help="Rank a layout slug (e.g. a published one) against #1.", metavar="SLUG", show_default=False)] = None,
    keep: Annotated[int, typer.Option(help="Fitting layouts stored as Optuna trials (with --storage or --study).", metavar="N")] = 1000,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL, e.g. sqlite:///plan.db.", metavar="URL", show_default=False)] = None,
    study: Annotated[Optional[str], typer.Option(help="Optuna study name (stores the fitting layouts as trials).", metavar="NAME", show_default=False)] = None,
    fmt: FormatOpt = Fmt.table,
    plot: PlotOpt = None,
) -> None:
    """Rank every layout that fits, fastest first, and explain the winner.

    The table ends with why #1 wins, the layouts tied with it within the error band, the usable
    memory (layouts whose memory band exceeds it are marked !) and the command that exports #1.
    """
    from ..search.robust import RANK_BY

    check_int("--top", top, high=MAX_TOP if fmt != Fmt.table else MAX_TOP_TABLE,
              why="" if fmt != Fmt.table else "rows of a table; --format csv or json takes more")
    check_int("--keep", keep, low=0, high=MAX_KEEP, why="each kept layout is an Optuna trial")
    check_output("--plot", plot, plot=True)
    objectives = [o.strip() for o in objective.split(",")]
    if objectives not in (["time"], ["time", "memory"], ["time", "gpus"]):
        raise SpecError(f"`--objective` = {objective!r}: use time, time,memory or time,gpus")
    if rank_by not in RANK_BY:
        raise SpecError(f"`--rank-by` = {rank_by!r}: choose {' or '.join(RANK_BY)}")
    if target is not None:
        from ..exporters import get_exporter

        get_exporter(target)  # an unknown target: one error before any work
    from ..specs.layout import Layout

    vs = Layout.read_slug(versus_slug, "--versus") if versus_slug is not None else None
    problem.check()
    given = problem
    note = (f"implied by --target {target}" if given.stack is None and target in TARGET_STACKS
            else None)
    problem = problem.for_target(target).build()
    sp_space = search.search_space()
    rules = search.rules()
    if vs is not None:
        from ..evaluate import estimate
        from ..splits import with_default_split

        try:
            vs, split_note = with_default_split(problem, vs)
            estimate(problem, vs)
        except SpecError as exc:
            raise SpecError(f"`--versus` = {versus_slug!r}: {exc}") from None
        if split_note:
            typer.echo(f"note: --versus: {split_note}", err=True)
    if len(objectives) == 2:
        from .pareto_cmd import run_pareto

        ignored = [flag for flag, used in (
            ("--target", target is not None), ("--plot", plot is not None),
            ("--versus", versus_slug is not None), ("--rank-by robust", rank_by != "time"),
            ("--top", top != 10 and objectives[1] == "memory")) if used]
        if ignored:
            raise SpecError(f"`--objective {objective}` gives a Pareto front and does not "
                            f"use {', '.join(ignored)}; drop {'it' if len(ignored) == 1 else 'them'}, "
                            "or use --objective time")

        run_pareto(problem, sp_space, rules, objectives[1], top, fmt, storage, study)
        return
    from ..search.plan import plan

    asked = storage is not None or study is not None
    with working(f"planning; storing up to {keep:,} layouts in {storage}") if storage else nullcontext():
        result = plan(problem, sp_space, top=top, rules=rules, keep=keep, storage=storage,
                      study_name=study, with_study=asked and keep > 0, target=target,
                      rank_by=rank_by)
    if fmt == Fmt.json:
        typer.echo(strict_json(result.to_json()))
    elif fmt == Fmt.csv:
        from ..output.frames import ranked_frame

        typer.echo(ranked_frame(result).to_csv(index=False), nl=False)
    elif result.n_fit:
        from .render import make_console

        print_plan(result, make_console(), vs, note=note,
                   export=export_hint(result, given.argv(), target))
    if plot and result.n_fit:
        from rich.console import Console

        from ..output.plot import plot_plan

        plot_plan(result, plot, top=top)
        Console(stderr=True).print(f"plot written to {plot}")
    if result.n_fit == 0:
        from ..search.explain import nothing_fits_message
        from ..search.next_steps import next_steps

        steps = next_steps(result, rules) if fmt == Fmt.table else []
        raise InfeasibleError("\n".join([nothing_fits_message(result)]
                                        + [f"next step: {s}" for s in steps]))
