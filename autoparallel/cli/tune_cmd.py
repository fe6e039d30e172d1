"""`autoparallel tune`: measure the best predicted layouts with a real launcher command, learn
from the measurements (Optuna), and report measured vs predicted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from ..output.files import strict_json
from ..errors import SpecError
from ..limits import MAX_TRIALS, MAX_WORKERS, check_int
from ..values import parse_duration
from . import command
from .guard import interrupted
from .options import (OUTPUT, Fmt, FormatOpt, ProblemOptions, SearchOptions, with_options)
from .outputs import check_output

TUNING = "Tuning"
CALIBRATION = "Calibration"


def _opt(help_text: str, metavar: str | None = None, panel: str = TUNING, **kw):
    return typer.Option(help=help_text, rich_help_panel=panel, metavar=metavar,
                        show_default=kw.pop("show_default", metavar is None), **kw)



def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_result(res, console: Console) -> None:
    """Measured vs predicted for every trial (fastest measured first), then the best layout."""
    from .render import fitted_table, stacked_table

    title = (f"study {res.study_name!r}: {len(res.rows)} trials, {res.measured_now} measured "
             f"now, {res.n_candidates} candidates")
    headers = ["trial", "layout", "pred rank", "predicted s", "measured s", "error", "result"]
    order = sorted(res.rows, key=lambda r: (r.measured_s is None, r.measured_s or 0, r.number))
    rows = []
    for r in order:
        result = "ok" if r.state == "COMPLETE" else (r.failure or r.state.lower())
        if r.retry_of is not None:
            result += f" (retry of {r.retry_of})"
        rows.append([str(r.number), r.layout or "-", _fmt(r.predicted_rank, "d"),
                     _fmt(r.predicted_s, ".4g"), _fmt(r.measured_s, ".4g"),
                     "-" if r.error_pct is None else f"{r.error_pct:+.1f}%", result])
    table, fits = fitted_table(headers, rows, console.width, left=2, title=title)
    if not fits:  # narrow: each trial's slug on a line of its own, nothing cut
        table = stacked_table(headers, rows, title=title, lines=[[1], [2, 3, 4, 5, 6]],
                              bare=frozenset({1}))
    console.print(table)
    b = res.best
    if b is None:
        console.print("[b]no layout measured successfully[/b]")
    else:
        console.print(f"[b]best measured:[/b] {b.layout}  {b.measured_s:.4g} s "
                      f"(predicted {b.predicted_s:.4g} s, rank {b.predicted_rank})")
    if res.calibration is not None:
        c = res.calibration
        knobs = ", ".join(f"{k} {v:.4g}" for k, v in c.fitted.items())
        console.print(f"calibrated profile: {knobs}; RMS log error {c.rms_log_error_before:.4f} "
                      f"-> {c.rms_log_error_after:.4f} over {c.n_measurements} measurements")
    if res.waiting:
        console.print(f"[dim]{res.waiting} enqueued trial(s) not started (left for a later run; "
                      "not listed)[/dim]")
    for note in res.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(note)}", highlight=False)
    if res.workdir:
        console.print(f"[dim]trial logs and configs: {escape(str(res.workdir))}[/dim]")
    if res.storage:
        console.print(f"[dim]browse: optuna-dashboard {escape(res.storage)}[/dim]")


@command("tune")
@with_options(problem=ProblemOptions, search=SearchOptions)
def tune_command(
    problem: ProblemOptions,
    search: SearchOptions,
    measure: Annotated[Optional[str], _opt("Command that runs a short training job, with placeholders such as {megatron_args}, {tp}, {layout} (README, Tuning).", "CMD", show_default=False)] = None,
    trials: Annotated[int, _opt("Layouts this invocation measures (shared by its workers).", "N", show_default=True)] = 20,
    candidates: Annotated[int, _opt("Fastest predicted layouts the study may measure.", "N", show_default=True)] = 48,
    seeds: Annotated[int, _opt("Best predicted layouts measured first.", "N", show_default=True)] = 3,
    sampler: Annotated[str, _opt("What proposes the next layout: tpe, random or none.", "tpe|random|none", show_default=True)] = "tpe",
    seed: Annotated[Optional[int], _opt("Random seed of the sampler.", "N", show_default=False)] = None,
    metric_regex: Annotated[Optional[str], _opt("Regex with one group around the step time in seconds (a group named ms: milliseconds) [default: step_time_s= or step_time_s: and the number].", "REGEX", show_default=False)] = None,
    timeout: Annotated[str, _opt("How long one measurement may run before it is killed, e.g. 900, 15m.", "DURATION", show_default=True)] = "900",
    workers: Annotated[int, _opt("Measurements run at once by this invocation.", "N", show_default=True)] = 1,
    storage: Annotated[Optional[str], _opt("Optuna storage URL (sqlite:///tune.db, postgresql://...) [default: in memory].", "URL", show_default=False)] = None,
    study: Annotated[Optional[str], _opt("Optuna study name [default: derived from the problem].", "NAME", show_default=False)] = None,
    heartbeat: Annotated[str, _opt("Time between heartbeats of a running trial (database storage).", "DURATION", show_default=True)] = "30",
    grace: Annotated[str, _opt("Time without heartbeat after which a trial is failed and retried.", "DURATION", show_default=True)] = "120",
    max_retry: Annotated[int, _opt("Retries of a layout whose worker died.", "N", show_default=True)] = 3,
    workdir: Annotated[Optional[str], _opt("Directory for per-trial logs and configs [default: a new temporary directory].", "DIR", OUTPUT, show_default=False)] = None,
    keep_workdir: Annotated[bool, _opt("Keep the temporary work directory (its trial logs) after the run.", panel=OUTPUT)] = False,
    calibrate: Annotated[bool, _opt("Refit a few efficiency knobs to the measurements.", panel=CALIBRATION)] = False,
    profile_out: Annotated[Optional[str], _opt("Write the refitted profile TOML here (implies --calibrate).", "FILE", CALIBRATION, show_default=False)] = None,
    fmt: FormatOpt = Fmt.table,
) -> None:
    """Measure the best predicted layouts with a real command; report measured vs predicted."""
    if measure is None:
        raise SpecError("missing --measure: the command that runs a short training job, e.g. "
                        "--measure 'torchrun --nproc-per-node 8 pretrain_gpt.py {megatron_args}'")
    from ..tune.command import CommandTemplate
    from ..tune.pool import SAMPLERS
    from ..tune.runner import MetricParser

    template = CommandTemplate.parse(measure)
    metric = MetricParser.compile(metric_regex)
    if sampler not in SAMPLERS:
        raise SpecError(f"`--sampler` = {sampler!r}: choose from {', '.join(SAMPLERS)}")
    if fmt == Fmt.csv:
        raise SpecError("`--format csv` is not available for tune: use table or json")
    day = 86_400
    for flag, value, low, high in (("--trials", trials, 0, MAX_TRIALS), ("--workers", workers, 1, MAX_WORKERS),
                                   ("--candidates", candidates, 1, MAX_TRIALS), ("--seeds", seeds, 0, MAX_TRIALS),
                                   ("--max-retry", max_retry, 0, 1000)):
        check_int(flag, value, low=low, high=high)
    timeout_s = parse_duration(timeout, "--timeout", high_s=30 * day)
    heartbeat_s = parse_duration(heartbeat, "--heartbeat", high_s=day)
    grace_s = parse_duration(grace, "--grace", high_s=7 * day)
    if seed is not None:  # numpy and Optuna seeds are 32-bit
        check_int("--seed", seed, low=0, high=2**32 - 1)
    check_output("--profile-out", profile_out, suffixes=(".toml",))
    if grace_s <= heartbeat_s:
        raise SpecError(f"`--grace` ({grace_s:g} s) must exceed `--heartbeat` ({heartbeat_s:g} s)")
    if workdir:
        _check_workdir(workdir)
    problem.check()
    problem = problem.build()
    sp_space = search.search_space()
    rules = search.rules()
    from ..tune import TuneConfig, tune
    from ..tune.calibrate import write_profile

    err = Console(stderr=True, highlight=False)
    config = TuneConfig(
        problem=problem, template=template, trials=trials, storage=storage, study_name=study,
        metric=metric, timeout_s=timeout_s, workers=workers, seeds=seeds, sampler=sampler,
        seed=seed, heartbeat_interval_s=max(1, round(heartbeat_s)),
        grace_period_s=max(2, round(grace_s)), max_retry=max_retry,
        workdir=Path(workdir) if workdir else None, keep_workdir=keep_workdir,
        env=dict(os.environ),
    )
    try:  # Ctrl-C and SIGTERM (a scheduler ending the job) arrive as KeyboardInterrupt (cli/guard.py)
        result = tune(config, candidates=candidates, space=sp_space, rules=rules,
                      calibrate=calibrate or profile_out is not None,
                      log=lambda s: err.print(f"[dim]{escape(s)}[/dim]", soft_wrap=True))
    except KeyboardInterrupt:
        interrupted("running measurements were stopped; "
                    + (f"their trials are retried by the next worker or after {grace_s:g} s; "
                       "rerun the same command to resume the study" if storage else
                       "the study was in memory, so nothing was kept (use --storage to resume)"))
        raise typer.Exit(130) from None
    if profile_out and result.calibration is not None:
        write_profile(profile_out, result.calibration, problem, result.study_name)
        err.print(f"profile written to {profile_out}")
    if fmt == Fmt.json:
        typer.echo(strict_json(result.to_json()))
    else:
        from .render import make_console

        print_result(result, make_console())
    if result.calibration_refused:
        err.print(f"error: {'--profile-out ' + profile_out + ' not written: ' if profile_out else ''}"
                  f"calibration refused: {result.calibration_refused}", markup=False)
    if result.rows and result.best is None:
        err.print(no_success_message(result.rows, result.workdir), markup=False)
    if result.calibration_refused or (result.rows and result.best is None):
        raise typer.Exit(1)


def _check_workdir(workdir: str) -> None:
    """`--workdir` exists as a directory or can be created (before any work)."""
    from .outputs import short_path

    p = Path(workdir)
    try:
        if p.exists() and not p.is_dir():
            raise SpecError(f"`--workdir` = {short_path(workdir)!r} is a file: give a directory")
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"`--workdir` = {short_path(workdir)!r}: cannot create it "
                        f"({exc.strerror or exc}); give another directory") from None


def no_success_message(rows, workdir: str | None = None) -> str:
    """Why `tune` exits 1: no trial measured a step time; the failures counted by kind, with the
    first detail of each kind, and where the trials' logs are."""
    kinds: dict[str, list] = {}
    for r in rows:
        kinds.setdefault(r.failure or r.state.lower(), []).append(r)
    parts = [f"{len(v)} {k}" + (f" (trial {v[0].number}: {v[0].detail})" if v[0].detail else "")
             for k, v in kinds.items()]
    where = (f"in {workdir}" if workdir else
             "(rerun with --keep-workdir or --workdir DIR to keep them)")
    first = rows[0].number if rows else 0
    hint = (f" Each trial's output.log is {where} (e.g. trial-{first:05d}-*/output.log); a "
            "multi-node --measure command must start every node (e.g. srun inside an "
            "allocation), not one host.")
    if set(kinds) - {"waiting", "running"} == {"implausible"}:
        hint = (" Check that --metric-regex captures the step time in seconds (a group named "
                "ms for milliseconds) and nothing else.")
    return "error: no trial succeeded, so nothing was measured: " + "; ".join(parts) + "." + hint
