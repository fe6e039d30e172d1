"""Plots (matplotlib, Agg): breakdowns of the top layouts and the Pareto cloud of survivors."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..cost.time import TIME_ITEMS
from ..errors import SpecError
from ..units import GiB

MEM_PARTS = ("params", "grads", "optimizer", "activations", "embedding_logits", "overhead")


def plot_plan(result, path: str | Path, top: int = 8) -> Path:
    """Three panels: memory breakdown and time breakdown of the top layouts (stacked bars), and
    step time vs memory of every fitting layout with the Pareto front."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..frontier import pareto_front

    ev = result.ranked
    k = min(top, len(ev))
    if k == 0:
        raise SpecError("nothing fits, so there is nothing to plot")
    labels = [f"#{i + 1} {ev.table.row(i).slug}" for i in range(k)]
    fig, axes = plt.subplots(1, 3, figsize=(18, 6), gridspec_kw={"width_ratios": [1, 1, 1.2]})
    y = np.arange(k)[::-1]
    for ax, parts, source, scale, unit in (
        (axes[0], MEM_PARTS, ev.memory, 1 / GiB, "GiB per GPU"),
        (axes[1], TIME_ITEMS, ev.time, 1.0, "seconds per step"),
    ):
        left = np.zeros(k)
        for name in parts:
            vals = np.asarray(source[name][:k], dtype=float) * scale
            if np.any(vals > 0):
                ax.barh(y, vals, left=left, label=name)
                left += vals
        ax.set_yticks(y, labels, fontsize=7)
        ax.set_xlabel(unit)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
    frac = result.problem.training.usable_fraction
    usable_line = (result.problem.cluster.gpu.hbm_gib * frac if frac is not None
                   else float(np.min(ev.memory["usable"], initial=np.inf)) / GiB)
    axes[0].axvline(usable_line, color="k", ls="--", lw=1)
    axes[0].set_title("memory breakdown (dashed: usable)")
    axes[1].set_title("time breakdown")
    surv = result.survivors
    mem = surv.memory["total"] / GiB
    step = surv.time["step"]
    ax = axes[2]
    ax.scatter(mem, step, s=4, alpha=0.3, color="tab:gray", label=f"{len(surv):,} fitting layouts")
    front = pareto_front(mem, step)
    ax.plot(mem[front], step[front], "o-", color="tab:red", ms=4, label="Pareto front")
    ax.scatter(mem[:k], step[:k], s=30, color="tab:blue", zorder=3, label=f"top {k}")
    ax.set_xlabel("memory per GPU (GiB)")
    ax.set_ylabel("step time (s)")
    ax.set_yscale("log")
    ax.set_title("step time vs memory")
    ax.legend(fontsize=7)
    d = result.problem.describe()
    fig.suptitle(f"{d['model']} on {d['n_gpus']} x {d['gpu']}, seq {d['seq_len']}, "
                 f"global batch {d['global_batch']}")
    fig.tight_layout()
    from .files import save_figure

    try:
        return save_figure(fig, "--plot", path, dpi=110)
    finally:
        plt.close(fig)
