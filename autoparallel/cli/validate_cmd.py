"""`autoparallel validate` (predict measured runs, report errors) and `autoparallel calibrate`
(fit the efficiency profile of one GPU to measured runs)."""

from __future__ import annotations

import math
import os
import sys
from typing import Annotated, Optional

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from ..errors import SpecError
from ..output.files import write_whole
from . import command
from .options import OUTPUT
from .outputs import check_output, working
from .render import fitted_table, make_console, stacked_table

RunsOpt = Annotated[Optional[str], typer.Option("--runs", help="CSV of measured runs (the columns of autoparallel/data/published_runs.csv) [default: the shipped runs].", metavar="CSV", show_default=False)]
StackOpt = Annotated[Optional[str], typer.Option("--stack", help="Use only the runs of this software stack (autoparallel presets stacks).", metavar="NAME", show_default=False)]


def _load(runs: str | None, include_fp16: bool, stack: str | None):
    """Cases and skipped rows of a runs file (default: the shipped published runs), optionally
    only one stack's runs."""
    from ..data import PUBLISHED_RUNS
    from ..presets import load_stack
    from ..validation.runs import load_cases, read_runs

    if runs is not None and not runs.strip():
        raise SpecError("`--runs` is empty: give a runs CSV, or leave it out for the shipped "
                        "published runs")
    path = runs or str(PUBLISHED_RUNS)
    frame = read_runs(path)
    cases, skipped = load_cases(frame, allow_fp16=include_fp16)
    if stack is not None:
        name = load_stack(stack).name
        cases = [c for c in cases if c.stack == name]
    return path, frame, cases, skipped
Fp16Opt = Annotated[bool, typer.Option("--include-fp16", help="Also use FP16 mixed-precision rows (same tensor-core peak as BF16 on A100/V100-era parts).")]


def _console() -> Console:
    """Rich console: `COLUMNS` wide when set, else the terminal's width, else 200 (files, CI logs)."""
    if os.environ.get("COLUMNS", "").strip().isdigit() or not sys.stdout.isatty():
        return make_console() if os.environ.get("COLUMNS", "").strip().isdigit() else Console(width=200)
    return Console()


def _pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:+.1f}%"


def _apct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:.1f}%"


_STEP_COLS = ("used", "skipped", "median |err|", "p90 |err|", "bias")
_MEM_COLS = ("mem rows", "mem median |err|", "mem bias", "not fit", "> usable")


def _summary_rows(summ: pd.DataFrame) -> list[list[str]]:
    return [[str(r.iloc[0]), str(r["used"]), str(r["skipped"]), _apct(r["median_abs_err"]),
             _apct(r["p90_abs_err"]), _pct(r["bias"]), str(r["mem_rows"]),
             _apct(r["mem_median_abs_err"]), _pct(r["mem_bias"]), str(r["not_fit"]),
             str(r["over_usable"])] for _, r in summ.iterrows()]


def summary_tables(summ: pd.DataFrame, title: str, width: int = 200) -> list[Table]:
    """Rich table(s) of `report.summary` output: one table when it fits `width`, else the
    step-time columns and the memory columns as two tables (the group names never cut)."""
    group = str(summ.columns[0])
    rows = _summary_rows(summ)
    table, fits = fitted_table([group, *_STEP_COLS, *_MEM_COLS], rows, width, title=title)
    if fits:
        return [table]
    n = 1 + len(_STEP_COLS)
    step, _ = fitted_table([group, *_STEP_COLS], [r[:n] for r in rows], width, title=title)
    mem, _ = fitted_table([group, *_MEM_COLS], [r[:1] + r[n:] for r in rows], width,
                          title="the same rows: memory")
    return [step, mem]


def summary_table(summ: pd.DataFrame, title: str) -> Table:
    """Rich table of `report.summary` output (all columns in one table)."""
    return fitted_table([str(summ.columns[0]), *_STEP_COLS, *_MEM_COLS], _summary_rows(summ),
                        10_000, title=title)[0]


def _print_report(console: Console, pred: pd.DataFrame, skipped: pd.DataFrame, title: str,
                  details: bool = True) -> None:
    from ..validation.report import skip_table, summary, worst

    summ = summary(pred, skipped)
    console.print(*summary_tables(summ, title, console.width))
    if not details:
        return
    if len(pred):
        by_gpu = summary(pred, by="gpu")
        by_gpu["skipped"] = "-"
        console.print(*summary_tables(by_gpu, "the same, per GPU preset", console.width))
    st = skip_table(skipped)
    if len(st):
        t = Table(title="skipped rows by reason", title_justify="left")
        t.add_column("reason")
        t.add_column("rows", justify="right")
        t.add_column("sources")
        for _, r in st.iterrows():
            t.add_row(r["reason"], str(r["rows"]), r["sources"])
        console.print(t)
    if len(pred):
        assumed = pd.Series([a for s in pred["assumptions"] for a in s.split("; ") if a])
        if len(assumed):
            t = Table(title="assumptions made for used rows", title_justify="left")
            t.add_column("assumption")
            t.add_column("rows", justify="right")
            for name, n in assumed.value_counts().items():
                t.add_row(name, str(n))
            console.print(t)
        if "profile_basis" in pred:
            t = Table(title="efficiency profile used (stack fit on this GPU, nearest GPU, or preset)",
                      title_justify="left")
            t.add_column("profile")
            t.add_column("rows", justify="right")
            for name, n in pred["profile_basis"].value_counts().items():
                t.add_row(str(name), str(n))
            console.print(t)
        w = worst(pred, 10)
        headers = ["row", "source", "model", "GPUs", "layout", "measured s", "predicted s",
                   "error", "largest cost items"]
        rows = [[str(r["row_id"]), str(r["source"]), str(r["model"]), str(r["n_gpus"]),
                 str(r["layout"]), f"{r['measured_step_s']:.3g}", f"{r['predicted_step_s']:.3g}",
                 _pct(r["step_err"]), str(r["top_items"])] for _, r in w.iterrows()]
        title = "worst ten rows (|step error|)"
        t, fits = fitted_table(headers, rows, console.width, left=5, title=title)
        if not fits:
            t = stacked_table(headers, rows, title=title, lines=[[1, 2, 3], [4], [5, 6, 7], [8]],
                              bare=frozenset({1, 2, 4}))
        console.print(t)


def _memory_frame(path: str | None):
    """The memory runs `validate` reports on (default: the shipped ones), read and checked
    before any step time is predicted, so a bad `--memory-runs` file fails at once."""
    from ..data import MEMORY_RUNS
    from ..validation.runs import read_runs

    path = path or str(MEMORY_RUNS)
    return path, read_runs(path, flag="--memory-runs")


def _memory_report(console, path: str, frame, speed_mem_err=None) -> None:
    """Measured memory against the figure each run's `mem_definition` names (allocated,
    reserved, device), per source; OOM reports predicted to fit; runs that ran predicted not to;
    then every dense run with a measured figure (these and the step-time runs reporting memory,
    `speed_mem_err`) together."""
    from ..validation.memory_check import memory_records, memory_summary, stage_summary
    from ..validation.report import skip_table

    records, skipped = memory_records(frame)
    console.print(f"memory runs: {path}")
    console.print(f"memory: {len(records) + len(skipped)} rows: {len(records)} used, "
                  f"{len(skipped)} skipped")
    if not len(records):
        return
    summ = memory_summary(records)
    title = "memory error per source and definition (dense; prediction / measurement - 1)"
    keys = [(str(r["source"]), str(r["definition"])) for _, r in summ.iterrows()]
    errors = [[*k, str(r["rows"]), _apct(r["median_abs_err"]), _apct(r["p90_abs_err"]),
               _pct(r["bias"])] for k, (_, r) in zip(keys, summ.iterrows())]
    verdicts = [[*k, str(r["oom_reports"]), str(r["oom_predicted_fit"]), str(r["ran"]),
                 str(r["ran_predicted_not_fit"])] for k, (_, r) in zip(keys, summ.iterrows())]
    head = ["source", "definition"]
    err_cols = ["rows", "median |err|", "p90 |err|", "bias"]
    oom_cols = ["OOM", "OOM pred. fit", "ran", "ran pred. not fit"]
    both, fits = fitted_table(head + err_cols + oom_cols,
                              [e + v[2:] for e, v in zip(errors, verdicts)], console.width,
                              left=2, title=title)
    if fits:
        console.print(both)
    else:  # two narrower tables, nothing cut
        console.print(fitted_table(head + err_cols, errors, console.width, left=2, title=title)[0])
        console.print(fitted_table(head + oom_cols, verdicts, console.width, left=2,
                                   title="memory verdicts: OOM reports and runs that ran")[0])
    st = skip_table(skipped)
    if len(st):
        t = Table(title="memory rows skipped by reason", title_justify="left")
        t.add_column("reason")
        t.add_column("rows", justify="right")
        for _, r in st.iterrows():
            t.add_row(r["reason"], str(r["rows"]))
        console.print(t)
    per_stage = stage_summary(records)
    if per_stage:
        console.print(f"memory per pipeline stage (first, most loaded middle, last against the "
                      f"stages a run reports; {per_stage['runs']} runs, {per_stage['stages']} "
                      f"stages): median |err| {_apct(per_stage['median_abs_err'])}, largest "
                      f"{_apct(per_stage['max_abs_err'])}")
    dense = records[~records["moe"]]["mem_err"].dropna()
    if speed_mem_err is not None and len(speed_mem_err):
        err = pd.concat([dense, speed_mem_err.dropna()]).abs()
        console.print(f"memory, every dense run with a measured figure ({len(dense)} memory runs "
                      f"+ {len(speed_mem_err.dropna())} step-time runs): median |err| "
                      f"{_apct(err.median())}, p90 {_apct(err.quantile(0.9))}")


@command("validate")
def validate_command(
    runs: RunsOpt = None,
    stack: StackOpt = None,
    output: Annotated[Optional[str], typer.Option("--output", help="Write one row per used run (prediction, measurement, errors) to this CSV.", rich_help_panel=OUTPUT, metavar="FILE", show_default=False)] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write a predicted-vs-measured scatter (.png, .svg or .pdf).", rich_help_panel=OUTPUT, metavar="FILE", show_default=False)] = None,
    profile: Annotated[Optional[list[str]], typer.Option("--profile", help="Calibrated profile TOML (repeatable; its `gpu` key says which GPU it applies to).", metavar="FILE", show_default=False)] = None,
    include_fp16: Fp16Opt = False,
    memory_runs: Annotated[Optional[str], typer.Option("--memory-runs", help="CSV of runs with measured per-GPU memory (the columns of autoparallel/data/memory_runs.csv; none to skip) [default: the shipped runs].", metavar="CSV", show_default=False)] = None,
) -> None:
    """Predict measured runs and report the error per source and overall."""
    from ..validation.loso import profiles_from_files
    from ..validation.report import plot as draw
    from ..validation.report import predict

    from ..presets import load_stack

    check_output("--output", output)
    check_output("--plot", plot, plot=True)
    if stack is not None:
        load_stack(stack)  # an unknown stack fails before the runs are read
    profiles = profiles_from_files(profile or [])
    memory = _memory_frame(memory_runs) if (memory_runs or "").lower() != "none" else None
    runs, frame, cases, skipped = _load(runs, include_fp16, stack)
    console = _console()
    only = f" (stack {cases[0].stack})" if stack and cases else ""
    console.print(f"runs: {runs}")
    console.print(f"{len(frame)} rows: {len(cases)} used{only}, {len(skipped)} skipped")
    with working(f"predicting {len(cases)} runs"):
        pred = predict(cases, profiles)
    _print_report(console, pred, skipped, "step-time error per source (prediction / measurement "
                  "- 1); in-sample where the run's stack profile was fitted on this file's runs; "
                  "out-of-sample figures: benchmarks/validate.py (leave-one-source-out)")
    if output:
        write_whole("--output", output, pred.to_csv(index=False))
        console.print(f"per-run report -> {output}")
    if memory is not None:
        _memory_report(console, *memory,
                       pred["mem_err"] if len(pred) and "mem_err" in pred else None)
    if plot:
        if not len(pred):
            raise SpecError("--plot: no usable runs to plot")
        draw(pred, plot)
        console.print(f"plot -> {plot}")


def _plausible(cases, gpus):
    """The runs of `gpus` no faster than their GPUs' peak allows; a warning on stderr names
    the others (`validation.plausible`), which no efficiency knob can explain."""
    from ..validation.plausible import implied_mfu

    keep, dropped = [], []
    for c in cases:
        if c.gpu in gpus:
            mfu = implied_mfu(c.problem(), c.measured_step_s)
            if mfu > 1:
                dropped.append(f"{c.row_id} ({c.source}: {c.measured_step_s:.4g} s per step = "
                               f"{mfu:.0%} MFU)")
                continue
        keep.append(c)
    if dropped:
        typer.echo(f"warning: {len(dropped)} run(s) left out of the fit: faster than their GPUs' "
                   f"peak allows (more than 100 % MFU): {'; '.join(dropped[:5])}"
                   + ("; ..." if len(dropped) > 5 else "") + "; check their step time or "
                   "throughput columns", err=True)
    return keep


@command("calibrate")
def calibrate_command(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU preset whose runs are fitted (a chip's memory sizes together, e.g. a100-40gb and a100-80gb).", metavar="NAME")],
    output: Annotated[str, typer.Option("--output", help="Profile TOML to write (use with --profile).", rich_help_panel=OUTPUT, metavar="FILE")],
    runs: RunsOpt = None,
    stack: StackOpt = None,
    knobs: Annotated[Optional[str], typer.Option("--knobs", help="Profile knobs to fit, comma-separated [default: the ones the runs identify].", metavar="LIST", show_default=False)] = None,
    loss: Annotated[str, typer.Option("--loss", help="Robust loss of the least-squares fit.", metavar="soft_l1|huber|cauchy|arctan|linear")] = "soft_l1",
    prior_weight: Annotated[float, typer.Option("--prior-weight", help="Pull towards the preset's reference values (0 = none).", metavar="FLOAT")] = 1.0,
    loso: Annotated[bool, typer.Option("--loso/--no-loso", help="Also report leave-one-source-out errors (one fit per source).")] = True,
    include_fp16: Fp16Opt = False,
) -> None:
    """Fit the efficiency knobs of one GPU to measured runs (robust least squares on log step
    time, physical bounds) and write them as a profile file."""
    from ..presets import load_gpu
    from ..validation.calibrate import DEFAULT_KNOBS, check_knobs, toml_text
    from ..validation.loso import fit_group, group_of, loso_predictions
    from ..validation.report import predict, summary

    if loss not in ("soft_l1", "huber", "cauchy", "arctan", "linear"):
        raise SpecError(f"--loss {loss!r}: use soft_l1, huber, cauchy, arctan or linear")
    if not math.isfinite(prior_weight) or prior_weight < 0:
        raise SpecError(f"`--prior-weight` = {prior_weight}: must be a finite number >= 0")
    check_output("--output", output, suffixes=(".toml",))
    names = check_knobs([k.strip() for k in knobs.split(",") if k.strip()]) if knobs else DEFAULT_KNOBS
    preset = load_gpu(gpu).name
    grp = (preset,) + tuple(g for g in group_of(preset) if g != preset)
    runs, _, cases, skipped = _load(runs, include_fp16, stack)
    stack_name = cases[0].stack if stack and cases else None
    cases = _plausible(cases, grp)
    with working(f"fitting {', '.join(names)} to the runs of {', '.join(grp)}"):
        result, chosen = fit_group(cases, grp, knobs=names, loss=loss, prior_weight=prior_weight)
    console = _console()
    from ..attention_prior import derated

    base = derated(load_gpu(preset).reference())  # the prior `fit_group` starts from
    t = Table(title=f"fitted knobs ({len(chosen)} runs of {', '.join(grp)})", title_justify="left")
    for col in ("knob", "reference", "fitted", "+- (runs alone)", "identified"):
        t.add_column(col, justify="right" if col != "knob" else "left")
    from ..validation.calibrate import KNOBS
    from ..validation.plausible import pinned

    at_bound = pinned(result.knobs, {k: (lo, hi) for k, (lo, hi, _) in KNOBS.items()})
    for k, v in result.knobs.items():
        mark = " (at a bound)" if any(line.startswith(f"{k} =") for line in at_bound) else ""
        t.add_row(k, f"{getattr(base, k):.4g}", f"{v:.4g}", f"{result.std[k]:.2g}",
                  ("yes" if result.identified(k) else "no (prior)") + mark)
    console.print(t)
    for line in at_bound:
        typer.echo(f"warning: {line}", err=True)
    sources = sorted({c.source for c in chosen})
    in_sample = predict(chosen, {g: result.profile for g in grp})
    console.print(*summary_tables(summary(in_sample), "in-sample error (fitted on these runs)", console.width))
    extra = {}
    if loso and len(sources) > 1:
        with working(f"leave-one-source-out: one fit per source ({len(sources)})"):
            held, _ = loso_predictions(chosen, grp, knobs=names, loss=loss, prior_weight=prior_weight)
        summ = summary(held)
        console.print(*summary_tables(summ, "leave-one-source-out error (each source predicted by a fit to the others)", console.width))
        overall = summ[summ["source"] == "ALL"].iloc[0]
        extra = {"loso_median_abs_err": float(overall["median_abs_err"]),
                 "loso_p90_abs_err": float(overall["p90_abs_err"]),
                 "loso_bias": float(overall["bias"])}
    write_whole("--output", output, toml_text(result, grp, runs, sources, extra,
                                              stack=stack_name))
    console.print(f"profile -> {output} (use: autoparallel estimate ... --profile {output})")
