"""Rich renderings of estimates: memory and time breakdowns side by side."""

from __future__ import annotations

import os

from rich.columns import Columns
from rich.console import Console
from rich.markup import escape
from rich.table import Table

_MEM_PARTS = ("params", "grads", "optimizer", "activations", "embedding_logits", "overhead")

def _bar(frac: float, width: int = 20) -> str:
    n = max(0, min(width, round(frac * width)))
    return "█" * n + "·" * (width - n)

def layout_slug(rec: dict) -> str:
    """The layout's slug (`Layout.slug`) from an estimate record: its `slug` (estimate JSON
    from schema version 5), else rebuilt from its `layout` object."""
    from ..specs.layout import Layout

    if rec.get("slug"):
        return rec["slug"]
    lay = rec["layout"]
    fields = {k: lay[k] for k in ("dp", "tp", "pp", "vp", "cp", "ep", "zero", "recompute", "sp")}
    fields |= {k: lay.get(k) for k in ("cp_comm", "cp_a2a")}
    fields["etp"] = lay.get("etp")
    split = lay.get("stage_layers")
    whole = split and len(split) == lay["pp"] and all(float(x).is_integer() for x in split)
    return Layout(**fields, micro_batch=lay["micro_batch"],
                  stage_layers=[int(x) for x in split] if whole and lay["pp"] > 1 else None,
                  schedule=lay.get("schedule"), recompute_layers=lay.get("recompute_layers"),
                  recompute_group=lay.get("recompute_group"),
                  recompute_modules=lay.get("recompute_modules"),
                  offload_layers=lay.get("offload_layers") or 0,
                  optimizer_offload=lay.get("optimizer_offload") or 0.0).slug

def _two_lines(name: str) -> str:
    """A column header folded onto two lines at its middle space or slash (`tok/s\n/GPU`)."""
    cuts = [i for i, ch in enumerate(name) if ch in " /" and 0 < i < len(name) - 1]
    if not cuts:
        return name
    i = min(cuts, key=lambda j: abs(j - len(name) / 2))
    return name[:i] + "\n" + name[i + (name[i] == " "):]


def fitted_table(headers: list[str], rows: list[list[str]], width: int, *, left: int = 1,
                 title: str | None = None) -> tuple[Table, bool]:
    """A table whose cells are never cut: the first `left` columns left-aligned (names, slugs),
    the others right-aligned (numbers). Headers are folded onto two lines when that makes the
    table fit `width`. Returns (table, fits)."""
    measure = Console(width=10_000)
    table = None
    for fold in (False, True):
        table = Table(show_edge=False, pad_edge=False, title=title, title_justify="left")
        for i, name in enumerate(headers):
            table.add_column(_two_lines(name) if fold else name,
                             justify="left" if i < left else "right", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        if measure.measure(table).maximum <= width:
            return table, True
    return table, False


def stacked_table(headers: list[str], rows: list[list[str]], *, title: str | None = None,
                  lines: list[list[int]] | None = None, bare: frozenset[int] = frozenset()) -> Table:
    """The narrow form of a wide table: the first column, then one cell per row holding the other
    columns as `header value` pairs (columns in `bare`: the value alone), grouped onto `lines`
    (lists of column indices; default one line with all). Values are kept whole (a long slug
    gets a line of its own)."""
    groups = lines or [list(range(1, len(headers)))]
    table = Table(show_edge=False, pad_edge=False, title=title, title_justify="left")
    table.add_column(headers[0], no_wrap=True)
    table.add_column(" / ".join(", ".join(headers[i] for i in g) for g in groups), overflow="fold")
    for row in rows:
        cell = "\n".join("  ".join(row[i] if i in bare else f"{headers[i]} {row[i]}" for i in g)
                         for g in groups)
        table.add_row(row[0], cell)
    return table


def ranked_table(rows: list[tuple[str, str, list[tuple[str, str]]]], width: int) -> Table:
    """A table of layouts that never cuts a layout slug.

    `rows` are (rank, slug, [(column, value), ...]). One line per layout when the columns fit in
    `width` (headers folded onto two lines if that makes them fit); otherwise each layout takes
    two lines inside a two-column table: the full slug, then its numbers labelled by column name.
    Nothing is abbreviated or dropped."""
    names = [c for c, _ in rows[0][2]] if rows else []
    wide, fits = fitted_table(["#", "layout", *names],
                              [[rank, slug, *(v for _, v in values)] for rank, slug, values in rows],
                              width, left=2)
    if fits:
        wide.columns[0].justify = "right"
        return wide
    narrow = Table(show_edge=False, pad_edge=False)
    narrow.add_column("#", justify="right", no_wrap=True)
    narrow.add_column("layout / " + ", ".join(names), overflow="fold")
    room = max(20, width - max(len(r) for r, _, _ in rows) - 3)
    for rank, slug, values in rows:
        narrow.add_row(rank, f"[b]{slug}[/b]\n" + _pack([f"{n} {v}" for n, v in values], room))
    return narrow


def _pack(pairs: list[str], room: int) -> str:
    """Labelled values on as few lines of `room` characters as fit, a pair never split."""
    lines: list[str] = []
    for pair in pairs:
        if lines and len(lines[-1]) + 2 + len(pair) <= room:
            lines[-1] += "  " + pair
        else:
            lines.append(pair)
    return "\n".join(lines)


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
    from ..evaluate import TIME_KEYS

    parts = tuple(k for k in TIME_KEYS if k != "step")
    tt = _breakdown("time per step (s)", "s", tm, parts, tm["step"], "")
    return Columns([mt, tt], padding=(0, 4))


def params_label(counts: dict) -> str:
    """`8.03B params`, or `46.7B params, 12.9B active` for a mixture of experts."""
    total, active = counts["total"], counts["active"]
    text = f"{total / 1e9:.3g}B params"
    if active < total:
        text += f", {active / 1e9:.3g}B active"
    return text


def make_console(stderr: bool = False) -> Console:
    """A console as wide as `COLUMNS` when set (also when piped), else the terminal's width, else
    160 columns (pipes, files, tests)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return Console(stderr=stderr, width=max(int(columns), 40))
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=160)
    return console


def settings_text(changed: dict) -> str:
    """` (--moe-dispatcher deepep, --no-moe-a2a-overlap, --moe-capacity-factor 1.5)`: job
    settings as the flags that set them (`specs.job.job_words`), or '' for none
    (`specs.problem.moe_settings_changed`)."""
    from ..specs.job import flags_text

    return f" ({flags_text(changed)})" if changed else ""


def estimate_settings(rec: dict) -> str:
    """`settings_text` of an estimate record: its MoE settings beyond its stack's defaults."""
    from ..presets import load_stack
    from ..specs.problem import moe_settings_changed

    params = rec["model_params"]
    moe = params["active"] < params["total"]  # a dense model: active = total
    return settings_text(moe_settings_changed(rec["job"], load_stack(rec["job"]["stack"]), moe))


def print_estimate(rec: dict, console: Console | None = None) -> None:
    """Header line, the figures with their error bands, then both breakdowns."""
    from ..search.explain import fit_figure_of, usable_basis_of

    console = console or make_console()
    mem, ts = rec["memory_gib"], rec["time_s"]
    fits = "[green]fits[/green]" if rec["fits"] else "[red]does not fit[/red]"
    risk = ("; [red]memory risk[/red]: the band's upper end exceeds the usable memory"
            if rec["memory_risk"] else "")
    console.print(
        f"[b]{escape(rec['model'])}[/b] ({params_label(rec['model_params'])}) on {rec['n_gpus']} x "
        f"{escape(rec['gpu'])}; {rec['job']['stack']}, {rec['job']['precision']}"
        f"{estimate_settings(rec)}  layout "
        f"[b]{layout_slug(rec)}[/b]  grad_accum {rec['layout']['grad_accum']}"
    )
    console.print(
        f"{fits}: {fit_figure_of(rec)} of {mem['usable']:.1f} usable ({usable_basis_of(rec)}); "
        f"allocated band up to {mem['total_high']:.1f}{risk}"
    )
    band = rec["band"]
    console.print(
        f"step {ts['step']:.3f} s (band {ts['step_low']:.3g}-{ts['step_high']:.3g} s: p10-p90 of "
        f"{band['step_runs']} validation runs, {band['step_level']} level), MFU "
        f"{rec['mfu'] * 100:.1f}%, {rec['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU"
    )
    console.print(breakdown_tables(rec))
