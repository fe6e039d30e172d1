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
                        POWER_FRACTION, PUE, Assumptions, capacity_json, capacity_rows,
                        parse_counts, parse_duration, parse_global_batch, parse_prices,
                        parse_tokens, plot_capacity)
from ..errors import SpecError
from ..search.robust import RANK_BY
from . import app
from .options import Fmt, JobOptions, with_options
from .render import ranked_table
from .render import make_console


def _band(mid, lo, hi, fmt: str) -> str:
    if mid is None or not math.isfinite(mid):
        return "-"
    return f"{mid:{fmt}} ({lo:{fmt}}-{hi:{fmt}})"


def print_capacity(out: dict, console: Console) -> None:
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
                       "none of the counts given (try more GPUs)")
            console.print(f"deadline {d['days']:.0f} days at the slow end of the band, {gpu}: "
                          f"[b]{verdict}[/b]")


@app.command("capacity")
@with_options(job=JobOptions)
def capacity_command(
    job: JobOptions,
    model: Annotated[str, typer.Option("--model", help="Preset name, model TOML/JSON, or Hugging Face config.json.")],
    tokens: Annotated[str, typer.Option("--tokens", help="Token budget: 15T, 2.5B, 300M (decimal) or a number.")],
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.")],
    global_batch: Annotated[str, typer.Option("--global-batch", help="Sequences per step (2048), or tokens with a K/M/B suffix in binary units (16M = 2^24 tokens = 2048 x 8192).")],
    gpu: Annotated[str, typer.Option("--gpu", help="Comma-separated GPU presets: h100,h200,b200,mi300x.")],
    gpus: Annotated[str, typer.Option("--gpus", help="GPU counts: 512,1024 or a range 512:4096:x2 (or :+512).")],
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node.")] = 8,
    price: Annotated[Optional[str], typer.Option("--price", help="Price per GPU-hour per kind: h100=2.1,b200=3.5 (no built-in prices).", show_default=False)] = None,
    deadline: Annotated[Optional[str], typer.Option("--deadline", help="Smallest count per GPU kind that trains within this (30d, 720h, 4w) at the slow end of the band.", show_default=False)] = None,
    mtbf: Annotated[float, typer.Option("--mtbf", help="Mean time between interruptions per GPU, hours (default: Llama 3 report, 419 in 54 days on 16,384 H100).")] = MTBF_GPU_HOURS,
    ckpt_write: Annotated[float, typer.Option("--ckpt-write", help="Seconds a checkpoint stalls training (assumed).")] = CKPT_WRITE_S,
    ckpt_restore: Annotated[float, typer.Option("--ckpt-restore", help="Seconds from an interruption to training again (assumed).")] = CKPT_RESTORE_S,
    power_fraction: Annotated[float, typer.Option("--power-fraction", help="Average GPU power / TDP (1.0: Llama 3 model card convention).")] = POWER_FRACTION,
    node_overhead: Annotated[float, typer.Option("--node-overhead", help="Host power per watt of GPU power (DGX H100: 10.2 kW max, 8 x 700 W GPUs).")] = NODE_OVERHEAD,
    pue: Annotated[float, typer.Option("--pue", help="Data-centre PUE (Google fleet 2023: 1.10).")] = PUE,
    rank_by: Annotated[str, typer.Option("--rank-by", help="Layout per row: time (fastest) or robust (see plan).")] = "time",
    fmt: Annotated[Fmt, typer.Option("--format", help="table, json or csv.")] = Fmt.table,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write a PNG of days (with bands) against GPU count per GPU kind.", show_default=False)] = None,
) -> None:
    """Days, GPU-hours, cost and energy to train a token budget, per GPU kind and count, with
    error bands and goodput (interruptions, checkpoints, restarts)."""
    if rank_by not in RANK_BY:
        raise SpecError(f"`--rank-by` = {rank_by!r}: choose {' or '.join(RANK_BY)}")
    kinds = [g.strip() for g in gpu.split(",") if g.strip()]
    counts = parse_counts(gpus)
    prices = parse_prices(price, kinds)
    days = parse_duration(deadline) if deadline else None
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
        print_capacity(out, make_console())
    if plot:
        plot_capacity(rows, plot, title=f"{out['job']['model']}, {out['job']['tokens']:.3g} tokens")
        Console(stderr=True).print(f"plot written to {plot}")
