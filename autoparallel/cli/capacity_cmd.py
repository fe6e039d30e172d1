"""`autoparallel capacity`: days, GPU-hours, cost and energy to train a token budget, per GPU
kind and count, each with its error band."""

from __future__ import annotations

import math
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ..output.files import strict_json
from ..capacity_model import (CKPT_RESTORE_S, CKPT_WRITE_S, MTBF_GPU_HOURS, NODE_OVERHEAD,
                               POWER_FRACTION, PUE, Assumptions)
from ..errors import SpecError
from ..limits import MAX_GPUS
from ..values import format_duration
from . import command
from .options import PROBLEM, Fmt, FormatOpt, GpusPerNode, JobOptions, PlotOpt, with_options

GOODPUT = "Goodput and energy"


def _opt(flag: str, help_text: str, panel: str = "Capacity", metavar: str | None = None, **kw):
    return typer.Option(flag, help=help_text, rich_help_panel=panel, metavar=metavar, **kw)


def _band(mid, lo, hi, fmt: str) -> str:
    if mid is None or not math.isfinite(mid):
        return "-"
    return f"{mid:{fmt}} ({lo:{fmt}}-{hi:{fmt}})"


def print_capacity(out: dict, console: Console) -> None:
    from .render import ranked_table

    job = out["job"]
    console.print(f"[b]{job['model']}[/b]: {job['tokens']:.3g} tokens, seq {job['seq_len']}, "
                  f"global batch {job['global_batch']} sequences ({job['global_batch_tokens']:,} "
                  "tokens); figures: mid (p10-p90 band)")
    rows = []
    for r in out["rows"]:
        label = f"{r['gpu']} x{r['n_gpus']:,}"
        if not r["fits"]:
            rows.append((label, "nothing fits", [("days", "-")]))
            continue
        cost = (_band(r["cost"] / 1e6, r["cost_low"] / 1e6, r["cost_high"] / 1e6, ".2f") + "M"
                if r["cost"] is not None else "-")
        energy = (_band(r["energy_mwh"], r["energy_mwh_low"], r["energy_mwh_high"], ",.0f")
                  if r["energy_mwh"] is not None else "-")
        rows.append((label, r["layout"], [
            ("Mtok/s", _band(r["tokens_per_s"] / 1e6, r["tokens_per_s_low"] / 1e6,
                             r["tokens_per_s_high"] / 1e6, ".2f")),
            ("days", _band(r["days"], r["days_low"], r["days_high"], ".1f")),
            ("goodput", f"{r['goodput']:.1%}"),
            ("M GPU-h", _band(r["gpu_hours"] / 1e6, r["gpu_hours_low"] / 1e6,
                              r["gpu_hours_high"] / 1e6, ".2f")),
            ("cost", cost), ("MWh", energy)]))
    t = ranked_table(rows, console.width) if rows else Table()
    console.print(t)
    a = out["assumptions"]
    console.print(f"[dim]goodput: per-GPU MTBF {a['mtbf_gpu_hours']:,.0f} h, checkpoint write "
                  f"{a['ckpt_write_s']:.0f} s every sqrt(2 x write x job MTBF), restart "
                  f"{a['ckpt_restore_s']:.0f} s; energy: TDP x {a['power_fraction']:.2f} x "
                  f"(1 + {a['node_overhead']:.2f} host) x PUE {a['pue']:.2f}[/dim]")
    if out["deadline"]:
        d = out["deadline"]
        for gpu, n in d["smallest_n_gpus"].items():
            verdict = (f"{n:,} GPUs" if n is not None else
                       _more_gpus(out["rows"], gpu, d["days"]))
            console.print(f"deadline {format_duration(d['days'] * 86400.0)} at the slow end of "
                          f"the band, {gpu}: "
                          f"[b]{verdict}[/b]")


def _more_gpus(rows: list[dict], gpu: str, deadline_days: float) -> str:
    """What the counts given say about the count a deadline needs: from the largest count that
    fits, scaled linearly (the best case: more GPUs never scale better than linearly)."""
    fitting = [r for r in rows if r["gpu"] == gpu and r["fits"] and math.isfinite(r["days_high"])]
    if not fitting:
        return "none of the counts given fits this model; give larger counts"
    r = max(fitting, key=lambda r: r["n_gpus"])
    need = math.ceil(r["n_gpus"] * r["days_high"] / deadline_days)
    said = (f"none of the counts given; the largest, {r['n_gpus']:,}, takes "
            f"{r['days_high']:.1f} days, so at least {need:,} GPUs (linear scaling, the best case)")
    if need > MAX_GPUS:  # a range to try would be refused (`--gpus` bound)
        return (f"{said}: more than the {MAX_GPUS:,} GPUs a job may have, so no count meets "
                "this deadline; give a later --deadline, fewer --tokens or a faster GPU")
    return f"{said}: try --gpus {r['n_gpus']}:{min(max(need * 2, r['n_gpus'] * 2), MAX_GPUS)}:x2"


@command("capacity")
@with_options(job=JobOptions)
def capacity_command(
    job: JobOptions,
    model: Annotated[str, _opt("--model", "Model: a preset name, a TOML/JSON file or a Hugging Face config.json.", PROBLEM, "NAME|FILE")],
    seq_len: Annotated[str, _opt("--seq-len", "Tokens per sequence, e.g. 8192 or 8K.", PROBLEM, "N")],
    global_batch: Annotated[str, _opt("--global-batch", "Sequences per step (2048), or tokens with a suffix (16M = 2^24 tokens).", PROBLEM, "N")],
    gpu: Annotated[str, _opt("--gpu", "GPU kinds, comma-separated: h100,h200,b200.", PROBLEM, "LIST")],
    gpus: Annotated[str, _opt("--gpus", "GPU counts: 512,1024, 16K or a range 512:4096:x2 (or :+512).", PROBLEM, "LIST")],
    tokens: Annotated[str, _opt("--tokens", "Token budget: 15T, 2.5B, 300M (decimal) or a number.", metavar="N")],
    gpus_per_node: GpusPerNode = None,
    price: Annotated[Optional[str], _opt("--price", "Price per GPU-hour per kind: h100=2.1,b200=3.5 (no built-in prices).", metavar="LIST", show_default=False)] = None,
    deadline: Annotated[Optional[str], _opt("--deadline", "Smallest count per GPU kind that trains within this (30d, 720h, 4w) at the slow end of the band.", metavar="DURATION", show_default=False)] = None,
    rank_by: Annotated[str, _opt("--rank-by", "Layout per row: time (fastest) or robust (see plan).", metavar="time|robust")] = "time",
    mtbf: Annotated[float, _opt("--mtbf", "Mean time between interruptions per GPU, hours (Llama 3 report).", GOODPUT, "HOURS")] = MTBF_GPU_HOURS,
    ckpt_write: Annotated[float, _opt("--ckpt-write", "Seconds a checkpoint stalls training (assumed).", GOODPUT, "SECONDS")] = CKPT_WRITE_S,
    ckpt_restore: Annotated[float, _opt("--ckpt-restore", "Seconds from an interruption to training again (assumed).", GOODPUT, "SECONDS")] = CKPT_RESTORE_S,
    power_fraction: Annotated[float, _opt("--power-fraction", "Average GPU power / TDP (Llama 3 model card: 1.0).", GOODPUT, "FLOAT")] = POWER_FRACTION,
    node_overhead: Annotated[float, _opt("--node-overhead", "Host power per watt of GPU power (DGX H100).", GOODPUT, "FLOAT")] = NODE_OVERHEAD,
    pue: Annotated[float, _opt("--pue", "Data-centre PUE (Google fleet 2023).", GOODPUT, "FLOAT")] = PUE,
    fmt: FormatOpt = Fmt.table,
    plot: PlotOpt = None,
) -> None:
    """Days, GPU-hours, cost and energy to train a token budget, per GPU kind and count, with
    error bands and goodput (interruptions, checkpoints, restarts)."""
    from ..capacity_model import (capacity_json, capacity_rows, parse_counts, parse_duration,
                                   parse_prices, plot_capacity)
    from ..limits import MAX_SEQ_LEN
    from ..search.robust import RANK_BY
    from ..values import parse_count, parse_global_batch, parse_tokens
    from .outputs import check_output

    if rank_by not in RANK_BY:
        raise SpecError(f"`--rank-by` = {rank_by!r}: choose {' or '.join(RANK_BY)}")
    check_output("--plot", plot, plot=True)
    kinds = list(dict.fromkeys(g.strip() for g in gpu.split(",") if g.strip()))  # once each
    counts = parse_counts(gpus)
    prices = parse_prices(price, kinds)
    days = parse_duration(deadline) if deadline else None
    seq_len = parse_count(seq_len, "--seq-len", high=MAX_SEQ_LEN)
    parse_tokens(tokens)
    parse_global_batch(global_batch, seq_len)
    a = Assumptions(mtbf_gpu_hours=mtbf, ckpt_write_s=ckpt_write, ckpt_restore_s=ckpt_restore,
                    power_fraction=power_fraction, node_overhead=node_overhead, pue=pue)
    rows = capacity_rows(model, tokens, seq_len, global_batch, kinds, counts, prices=prices,
                         assumptions=a, rank_by=rank_by, gpus_per_node=gpus_per_node,
                         **job.job())
    from ..presets import load_model

    out = capacity_json(rows, model=load_model(model).name, tokens=parse_tokens(tokens),
                        seq_len=seq_len, global_batch=parse_global_batch(global_batch, seq_len),
                        assumptions=a, rank_by=rank_by, deadline_days=days)
    if fmt == Fmt.json:
        typer.echo(strict_json(out))
    elif fmt == Fmt.csv:
        import pandas as pd

        typer.echo(pd.DataFrame(rows).to_csv(index=False), nl=False)
    else:
        from .render import make_console

        print_capacity(out, make_console())
    if plot:
        plot_capacity(rows, plot, title=f"{out['job']['model']}, {out['job']['tokens']:.3g} tokens")
        Console(stderr=True).print(f"plot written to {plot}")
