"""`autoparallel estimate`: memory and time of one layout (or of every row of a CSV)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..errors import SpecError
from ..evaluate import estimate
from ..specs.layout import CpComm, Layout, Recompute
from . import app
from .outputs import check_output
from .options import Fmt, ProblemOptions, with_problem_options
from .render import print_estimate


@app.command("estimate")
@with_problem_options
def estimate_command(
    problem: ProblemOptions,
    dp: Annotated[Optional[int], typer.Option(help="Data-parallel degree (default: derived).", show_default=False)] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel degree.")] = 1,
    vp: Annotated[int, typer.Option(help="Virtual stages per pipeline rank (interleaving).")] = 1,
    cp: Annotated[int, typer.Option(help="Context-parallel degree.")] = 1,
    cp_comm: Annotated[Optional[CpComm], typer.Option(help="Context-parallel form with cp > 1: ring (K, V around a ring; Megatron --cp-comm-type p2p), a2a (Ulysses), allgather, a2a+ring (hierarchical, with --cp-a2a); default ring.", show_default=False)] = None,
    cp_a2a: Annotated[Optional[int], typer.Option(help="With --cp-comm a2a+ring: ranks per all-to-all group, a divisor of cp (the ring spans cp / cp-a2a).", show_default=False)] = None,
    ep: Annotated[int, typer.Option(help="Expert-parallel degree.")] = 1,
    zero: Annotated[int, typer.Option(help="ZeRO stage 0-3 (1 = distributed optimizer).")] = 1,
    recompute: Annotated[Recompute, typer.Option(help="Activation recomputation.")] = Recompute.NONE,
    sp: Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="Sequence parallelism (default: on when tp > 1).", show_default=False)] = None,
    micro_batch: Annotated[int, typer.Option(help="Sequences per micro-batch.")] = 1,
    stage_layers: Annotated[Optional[str], typer.Option(help="Layers per pipeline stage, first to last, e.g. 7,8x14,7 (default: even).", show_default=False)] = None,
    schedule: Annotated[Optional[str], typer.Option(help="Pipeline schedule: 1f1b, interleaved, zb-h1, zbv, dualpipe, dualpipev (default: 1f1b, interleaved with vp > 1).", show_default=False)] = None,
    recompute_num_layers: Annotated[Optional[int], typer.Option(help="With --recompute full: fully recompute only the first N layers of each model chunk (Megatron --recompute-method block); default: every layer.", show_default=False)] = None,
    recompute_modules: Annotated[Optional[str], typer.Option(help="With --recompute selective: modules re-run, comma-separated (Megatron --recompute-modules) [core_attn].", show_default=False)] = None,
    recompute_group: Annotated[Optional[int], typer.Option(help="With --recompute full: uniform checkpoint groups of N layers (Megatron --recompute-method uniform) [1].", show_default=False)] = None,
    offload_layers: Annotated[Optional[int], typer.Option(help="Activation offload of the first N layers of each stage (Megatron-Core --cpu-offloading-num-layers) [0].", show_default=False)] = None,
    optimizer_offload: Annotated[Optional[float], typer.Option(help="Share of the optimizer state offloaded to the host (Megatron --optimizer-offload-fraction) [0].", show_default=False)] = None,
    fmt: Annotated[Fmt, typer.Option("--format", help="table or json.")] = Fmt.table,
    input: Annotated[Optional[str], typer.Option("--input", help="Batch mode: CSV of layouts to score.", show_default=False)] = None,
    output: Annotated[Optional[str], typer.Option("--output", help="Batch mode: CSV to write (default stdout).", show_default=False)] = None,
) -> None:
    """Memory per GPU and time per step of one layout, each as a breakdown."""
    check_output("--output", output)
    if input is not None:
        from ..batch import read_layouts_csv, score_frame

        scored = score_frame(read_layouts_csv(input), profile=problem.profile)
        if output:
            scored.to_csv(output, index=False)
            bad = int((scored["error"] != "").sum())
            Console(stderr=True).print(
                f"scored {len(scored) - bad} of {len(scored)} rows -> {output}"
                + (f" ({bad} with an error; see the `error` column)" if bad else "")
            )
        else:
            typer.echo(scored.to_csv(index=False), nl=False)
        return
    if fmt == Fmt.csv:
        raise SpecError("`--format csv` is for batch mode (--input); use table or json")
    problem = problem.build()
    try:
        from ..specs.layout import parse_stage_layers

        layout = Layout(dp=dp, tp=tp, pp=pp, vp=vp, cp=cp, cp_comm=cp_comm, cp_a2a=cp_a2a,
                        ep=ep, zero=zero, recompute=recompute,
                        sp=sp, micro_batch=micro_batch, schedule=schedule,
                        recompute_layers=recompute_num_layers, recompute_group=recompute_group,
                        recompute_modules=recompute_modules.split(",") if recompute_modules else None,
                        offload_layers=offload_layers or 0,
                        optimizer_offload=optimizer_offload or 0.0,
                        stage_layers=parse_stage_layers(stage_layers) if stage_layers else None)
    except ValueError as exc:
        from ..errors import format_validation_error

        raise SpecError(format_validation_error(exc, "layout")) from None
    rec = estimate(problem, layout)
    if fmt == Fmt.json:
        typer.echo(json.dumps(rec, indent=2))
    else:
        print_estimate(rec)
