"""`autoparallel tune`: measure the best predicted layouts with a real launcher command, learn
from the measurements (Optuna), and report measured vs predicted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..output.files import strict_json
from ..errors import SpecError
from ..limits import MAX_TRIALS, MAX_WORKERS, check_float, check_int
from .guard import interrupted
from .outputs import check_output
from ..tune import TuneConfig, TuneResult, tune
from ..tune.calibrate import write_profile
from ..tune.command import CommandTemplate
from ..tune.pool import SAMPLERS
from ..tune.runner import DEFAULT_METRIC_REGEX, MetricParser
from . import app
from .options import Fmt, ProblemOptions, SearchOptions, with_options
from .render import make_console



def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_result(res: TuneResult, console: Console) -> None:
    """Measured vs predicted for every trial (fastest measured first), then the best layout."""
    table = Table(show_edge=False, title=f"study {res.study_name!r}: {len(res.rows)} trials, "
                  f"{res.measured_now} measured now, {res.n_candidates} candidates",
                  title_justify="left")
    for col in ("trial", "layout", "pred rank", "predicted s", "measured s", "error", "result"):
        table.add_column(col, justify="left" if col in ("layout", "result") else "right")
    order = sorted(res.rows, key=lambda r: (r.measured_s is None, r.measured_s or 0, r.number))
    for r in order:
        result = "ok" if r.state == "COMPLETE" else (r.failure or r.state.lower())
        if r.retry_of is not None:
            result += f" (retry of {r.retry_of})"
        table.add_row(str(r.number), r.layout or "-", _fmt(r.predicted_rank, "d"),
                      _fmt(r.predicted_s, ".4g"), _fmt(r.measured_s, ".4g"),
                      "-" if r.error_pct is None else f"{r.error_pct:+.1f}%", result)
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
    if res.storage:
        console.print(f"[dim]browse: optuna-dashboard {res.storage}[/dim]")


@app.command("tune")
@with_options(problem=ProblemOptions, search=SearchOptions)
def tune_command(
    problem: ProblemOptions,
    search: SearchOptions,
    measure: Annotated[Optional[str], typer.Option(help="Command that runs a short training job, with placeholders such as {megatron_args}, {tp}, {layout} (see README, Tuning).", show_default=False)] = None,
    trials: Annotated[int, typer.Option(help="Layouts this invocation measures (shared by its workers).")] = 20,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL (sqlite:///tune.db, postgresql://...); in memory when omitted.", show_default=False)] = None,
    study: Annotated[Optional[str], typer.Option(help="Optuna study name (default derived from the problem).", show_default=False)] = None,
    metric_regex: Annotated[Optional[str], typer.Option(help=f"Regex with one group around the step time in seconds (a group named ms: milliseconds). Default {DEFAULT_METRIC_REGEX!r}.", show_default=False)] = None,
    timeout: Annotated[float, typer.Option(help="Seconds one measurement may run before it is killed (failed: timeout).")] = 900.0,
    workers: Annotated[int, typer.Option(help="Measurements run at once by this invocation.")] = 1,
    candidates: Annotated[int, typer.Option(help="Fastest predicted layouts the study may measure.")] = 48,
    seeds: Annotated[int, typer.Option(help="Analytically best layouts enqueued first.")] = 3,
    sampler: Annotated[str, typer.Option(help="tpe, random, or none: what proposes the next layout (the learned correction of the prediction orders them in every case; see README, Tuning).")] = "tpe",
    seed: Annotated[Optional[int], typer.Option(help="Random seed of the sampler.", show_default=False)] = None,
    heartbeat: Annotated[int, typer.Option(help="Seconds between heartbeats of a running trial (database storage).")] = 30,
    grace: Annotated[int, typer.Option(help="Seconds without heartbeat after which a trial is failed and retried.")] = 120,
    max_retry: Annotated[int, typer.Option(help="Retries of a layout whose worker died.")] = 3,
    workdir: Annotated[Optional[str], typer.Option(help="Directory for per-trial logs and configs (default: a new temporary directory).", show_default=False)] = None,
    calibrate: Annotated[bool, typer.Option(help="Refit a few efficiency knobs to the measurements.")] = False,
    profile_out: Annotated[Optional[str], typer.Option(help="Write the refitted profile TOML here (implies --calibrate).", show_default=False)] = None,
    fmt: Annotated[Fmt, typer.Option("--format", help="table or json.")] = Fmt.table,
) -> None:
    """Measure the best predicted layouts with a real command; report measured vs predicted."""
    if measure is None:
        raise SpecError("missing --measure: the command that runs a short training job, e.g. "
                        "--measure 'torchrun --nproc-per-node 8 pretrain_gpt.py {megatron_args}'")
    template = CommandTemplate.parse(measure)
    metric = MetricParser.compile(metric_regex)
    if sampler not in SAMPLERS:
        raise SpecError(f"`--sampler` = {sampler!r}: choose from {', '.join(SAMPLERS)}")
    if fmt == Fmt.csv:
        raise SpecError("`--format csv` is not available for tune: use table or json")
    day = 86_400
    for flag, value, low, high in (("--trials", trials, 0, MAX_TRIALS), ("--workers", workers, 1, MAX_WORKERS),
                                   ("--candidates", candidates, 1, MAX_TRIALS), ("--seeds", seeds, 0, MAX_TRIALS),
                                   ("--heartbeat", heartbeat, 1, day), ("--grace", grace, 1, 7 * day),
                                   ("--max-retry", max_retry, 0, 1000)):
        check_int(flag, value, low=low, high=high)
    check_float("--timeout", timeout, high=30 * day)
    if seed is not None:  # numpy and Optuna seeds are 32-bit
        check_int("--seed", seed, low=0, high=2**32 - 1)
    check_output("--profile-out", profile_out, suffixes=(".toml",))
    if grace <= heartbeat:
        raise SpecError(f"`--grace` ({grace} s) must exceed `--heartbeat` ({heartbeat} s)")
    problem = problem.build()
    sp_space = search.search_space()
    rules = search.rules()
    if workdir:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    err = Console(stderr=True, highlight=False)
    config = TuneConfig(
        problem=problem, template=template, trials=trials, storage=storage, study_name=study,
        metric=metric, timeout_s=timeout, workers=workers, seeds=seeds, sampler=sampler,
        seed=seed, heartbeat_interval_s=heartbeat, grace_period_s=grace, max_retry=max_retry,
        workdir=Path(workdir) if workdir else None, env=dict(os.environ),
    )
    try:  # Ctrl-C and SIGTERM (a scheduler ending the job) arrive as KeyboardInterrupt (cli/guard.py)
        result = tune(config, candidates=candidates, space=sp_space, rules=rules,
                      calibrate=calibrate or profile_out is not None,
                      log=lambda s: err.print(f"[dim]{s}[/dim]", soft_wrap=True))
    except KeyboardInterrupt:
        interrupted("running measurements were stopped; "
                    + (f"their trials are retried by the next worker or after {grace} s; rerun "
                       "the same command to resume the study" if storage else
                       "the study was in memory, so nothing was kept (use --storage to resume)"))
        raise typer.Exit(130) from None
    if profile_out and result.calibration is not None:
        write_profile(profile_out, result.calibration, problem, result.study_name)
        err.print(f"profile written to {profile_out}")
    if fmt == Fmt.json:
        typer.echo(strict_json(result.to_json()))
    else:
        print_result(result, make_console())
    if result.rows and result.best is None:
        err.print(no_success_message(result.rows))
        raise typer.Exit(1)


def no_success_message(rows) -> str:
    """Why `tune` exits 1: no trial measured a step time; the failures counted by kind, with the
    first detail of each kind."""
    kinds: dict[str, list] = {}
    for r in rows:
        kinds.setdefault(r.failure or r.state.lower(), []).append(r)
    parts = [f"{len(v)} {k}" + (f" (trial {v[0].number}: {v[0].detail})" if v[0].detail else "")
             for k, v in kinds.items()]
    hint = (" Check one trial's output.log in --workdir; a multi-node --measure command must "
            "start every node (e.g. srun inside an allocation), not one host.")
    if set(kinds) - {"waiting", "running"} == {"implausible"}:
        hint = (" Check that --metric-regex captures the step time in seconds (a group named "
                "ms for milliseconds) and nothing else.")
    return "error: no trial succeeded, so nothing was measured: " + "; ".join(parts) + "." + hint
