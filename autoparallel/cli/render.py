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
    """The layout's slug (`Layout.slug`) from an estimate record."""
    from ..specs.layout import Layout

    lay = rec["layout"]
    fields = {k: lay[k] for k in ("dp", "tp", "pp", "vp", "cp", "ep", "zero", "recompute", "sp")}
    split = lay.get("stage_layers")
    whole = split and len(split) == lay["pp"] and all(float(x).is_integer() for x in split)
    return Layout(**fields, micro_batch=lay["micro_batch"],
                  stage_layers=[int(x) for x in split] if whole and lay["pp"] > 1 else None,
                  schedule=lay.get("schedule")).slug

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
        f"[b]{rec['model']}[/b] on {rec['n_gpus']} x {rec['gpu']}  layout [b]{layout_slug(rec)}[/b]"
        f"  grad_accum {rec['layout']['grad_accum']}"
    )
    console.print(
        f"{fits}: {rec['memory_gib']['total']:.1f} GiB of {rec['memory_gib']['usable']:.1f} usable;"
        f" step {rec['time_s']['step']:.3f} s, MFU {rec['mfu'] * 100:.1f}%,"
        f" {rec['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU"
    )
    console.print(breakdown_tables(rec))

