"""Rich renderings of estimates: memory and time breakdowns side by side."""

from __future__ import annotations

from rich.columns import Columns
from rich.console import Console
from rich.table import Table

from ..evaluate import TIME_KEYS

_MEM_PARTS = ("params", "grads", "optimizer", "activations", "embedding_logits", "overhead")
_TIME_PARTS = tuple(k for k in TIME_KEYS if k != "step")

def _bar(frac: float, width: int = 20) -> str:
    n = max(0, min(width, round(frac * width)))
    return "█" * n + "·" * (width - n)

def layout_slug(rec: dict) -> str:
    lay = rec["layout"]
    sp = "-sp" if lay["sp"] else ""
    return (f"dp{lay['dp']}-tp{lay['tp']}-pp{lay['pp']}-vp{lay['vp']}-cp{lay['cp']}-ep{lay['ep']}"
            f"-z{lay['zero']}-r{lay['recompute']}{sp}-mb{lay['micro_batch']}")

def _breakdown(title: str, unit: str, values: dict, parts, total: float, footer: str) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    table.add_column("item")
    table.add_column(unit, justify="right")
    table.add_column("share")
    fmt = ".2f" if unit == "GiB" else ".3f"
    for k in parts:
        table.add_row(k, f"{values[k]:{fmt}}", _bar(values[k] / max(total, 1e-12)))
    table.add_row("[b]total[/b]", f"[b]{total:{fmt}}[/b]", footer)
    return table


def breakdown_tables(rec: dict) -> Columns:
    """Memory (GiB) and time (s) breakdowns of one estimate record."""
    mem, tm = rec["memory_gib"], rec["time_s"]
    mt = _breakdown("memory per GPU (GiB)", "GiB", mem, _MEM_PARTS, mem["total"],
                    f"of {mem['usable']:.1f} usable ({mem['capacity']:.0f} HBM)")
    tt = _breakdown("time per step (s)", "s", tm, _TIME_PARTS, tm["step"], "")
    return Columns([mt, tt], padding=(0, 4))


def params_label(counts: dict) -> str:
    """`8.03B params`, or `46.7B params, 12.9B active` for a mixture of experts."""
    total, active = counts["total"], counts["active"]
    text = f"{total / 1e9:.3g}B params"
    if active < total:
        text += f", {active / 1e9:.3g}B active"
    return text


def make_console(stderr: bool = False) -> Console:
    """A console 160 columns wide when not writing to a terminal (pipes, files, tests)."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=160)
    return console


def print_estimate(rec: dict, console: Console | None = None) -> None:
    """Header line plus both breakdowns."""
    console = console or make_console()
    fits = "[green]fits[/green]" if rec["fits"] else "[red]does not fit[/red]"
    console.print(
        f"[b]{rec['model']}[/b] ({params_label(rec['model_params'])}) on {rec['n_gpus']} x {rec['gpu']}  layout [b]{layout_slug(rec)}[/b]"
        f"  grad_accum {rec['layout']['grad_accum']}"
    )
    console.print(
        f"{fits}: {rec['memory_gib']['total']:.1f} GiB of {rec['memory_gib']['usable']:.1f} usable;"
        f" step {rec['time_s']['step']:.3f} s, MFU {rec['mfu'] * 100:.1f}%,"
        f" {rec['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU"
    )
    console.print(breakdown_tables(rec))

