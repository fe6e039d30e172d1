"""Predict measured runs and summarise the errors: per row, per source, overall; worst rows; plot.

Error of a row = predicted / measured - 1 (step time; the same number with the sign flipped, to
first order, for tokens/s/GPU). Utilisation is recomputed with one convention, ours
(`Evaluation.model_flops_per_step`, Megatron causal), from the measured step time:
MFU = model FLOPs per step / (measured step x GPUs x dense BF16 peak).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from ..cost.model_arch import build_arch
from ..evaluate import TIME_KEYS, evaluate
from ..specs.hardware import Profile
from ..units import GiB, TFLOPS
from .memory_definitions import FIGURE
from .runs import RULES, RunCase

TIME_PARTS = tuple(k for k in TIME_KEYS if k != "step")


def top_items(time_s: Mapping[str, float], n: int = 3) -> str:
    """The `n` largest time items of one row as 'item share%, ...'."""
    step = max(time_s["step"], 1e-30)
    parts = sorted(TIME_PARTS, key=lambda k: -time_s[k])[:n]
    return ", ".join(f"{k} {100 * time_s[k] / step:.0f}%" for k in parts)


def predict_case(case: RunCase, profile: Profile | None = None, arch=None) -> dict:
    """Prediction and measurement of one run as a flat record."""
    problem = case.problem(profile)
    ev = evaluate(problem, case.table(), RULES, arch=arch or build_arch(case.model))
    time_s = {k: float(ev.time[k][0]) for k in TIME_KEYS}
    step, meas = time_s["step"], case.measured_step_s
    peak = problem.cluster.gpu.bf16_tflops * TFLOPS * case.n_gpus
    # the figure the run measured (allocated, reserved or nvidia-smi device memory)
    mem = float(ev.memory[FIGURE[case.mem_definition]][0] / GiB)
    tokens = case.seq_len * case.global_batch
    rec = {
        "row_id": case.row_id, "source": case.source, "gpu": case.gpu, "model": case.model.name,
        "stack": case.stack, "precision": case.precision, "profile_basis": problem.profile_basis,
        "arch": "moe" if case.model.moe is not None else "dense",
        "n_gpus": case.n_gpus, "seq_len": case.seq_len, "global_batch": case.global_batch,
        "layout": case.layout.resolved(case.n_gpus).slug,
        "measured_step_s": meas, "predicted_step_s": step, "step_err": step / meas - 1.0,
        "measured_tokens_per_s_per_gpu": tokens / meas / case.n_gpus,
        "predicted_tokens_per_s_per_gpu": tokens / step / case.n_gpus,
        "measured_mfu": ev.model_flops_per_step / (meas * peak),
        "predicted_mfu": float(ev.mfu[0]),
        "measured_mem_gib": case.measured_mem_gib, "predicted_mem_gib": mem,
        "mem_err": (mem / case.measured_mem_gib - 1.0) if case.measured_mem_gib else np.nan,
        "fits": bool(ev.memory["total"][0] <= ev.memory["capacity"][0]),
        "within_usable": bool(ev.fits[0]),
        "top_items": top_items(time_s),
        "measured_from": case.measured_from,
        "assumptions": "; ".join(case.assumptions),
    }
    rec |= {f"time_{k}_s": v for k, v in time_s.items()}
    return rec


def predict(cases: Iterable[RunCase], profiles: Mapping[str, Profile] | None = None) -> pd.DataFrame:
    """One record per case; `profiles` maps a (stack, GPU preset) pair or a GPU preset name to
    the profile its rows use (others keep their stack's profile on their GPU)."""
    profiles = profiles or {}
    return pd.DataFrame([predict_case(c, profiles.get((c.stack, c.gpu), profiles.get(c.gpu)))
                         for c in cases])


def _stats(group: pd.DataFrame) -> dict:
    if not len(group):
        return {"used": 0, "median_abs_err": np.nan, "p90_abs_err": np.nan, "bias": np.nan,
                "mem_rows": 0, "mem_median_abs_err": np.nan, "mem_bias": np.nan, "not_fit": 0,
                "over_usable": 0}
    err = group["step_err"].to_numpy(dtype=float)
    mem = group["mem_err"].dropna().to_numpy(dtype=float)
    a = np.abs(err)
    return {
        "used": len(group),
        "median_abs_err": float(np.median(a)) if len(a) else np.nan,
        "p90_abs_err": float(np.percentile(a, 90)) if len(a) else np.nan,
        "bias": float(np.median(err)) if len(err) else np.nan,
        "mem_rows": len(mem),
        "mem_median_abs_err": float(np.median(np.abs(mem))) if len(mem) else np.nan,
        "mem_bias": float(np.median(mem)) if len(mem) else np.nan,
        "not_fit": int((~group["fits"].astype(bool)).sum()),
        "over_usable": int((~group["within_usable"].astype(bool)).sum()),
    }


def summary(pred: pd.DataFrame, skipped: pd.DataFrame | None = None, by: str = "source") -> pd.DataFrame:
    """Per-group and overall statistics: rows used / skipped, median and p90 |step error|, signed
    bias (median of the signed error), memory error where measured, runs predicted not to fit in
    the GPU's memory (`not_fit`) and above the planner's usable fraction (`over_usable`)."""
    rows = []
    keys = sorted(set(pred[by]) if len(pred) else set())
    skipped_by = skipped.groupby("source").size() if skipped is not None and len(skipped) and by == "source" else {}
    if by == "source" and skipped is not None:
        keys = sorted(set(keys) | set(skipped["source"]))
    for key in keys:
        group = pred[pred[by] == key] if len(pred) else pred.iloc[0:0]
        rows.append({by: key, **_stats(group), "skipped": int(skipped_by.get(key, 0)) if len(skipped_by) else 0})
    n_skip = len(skipped) if skipped is not None else 0
    rows.append({by: "ALL", **_stats(pred), "skipped": n_skip})
    return pd.DataFrame(rows)


def worst(pred: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The `n` rows with the largest |step error|, with their largest cost items."""
    if not len(pred):
        return pred
    order = pred["step_err"].abs().sort_values(ascending=False).index[:n]
    return pred.loc[order, ["row_id", "source", "model", "n_gpus", "layout", "measured_step_s",
                            "predicted_step_s", "step_err", "top_items"]]


def skip_table(skipped: pd.DataFrame) -> pd.DataFrame:
    """Skipped rows counted by reason (and source)."""
    if not len(skipped):
        return pd.DataFrame(columns=["reason", "rows", "sources"])
    g = skipped.groupby("reason")
    return pd.DataFrame({
        "rows": g.size(),
        "sources": g["source"].agg(lambda s: ", ".join(sorted(set(map(str, s))))),
    }).sort_values("rows", ascending=False).reset_index()


def plot(pred: pd.DataFrame, path: str, title: str = "predicted vs measured step time") -> None:
    """Log-log scatter of predicted vs measured step time, one colour per source (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    cmap = plt.get_cmap("tab10")
    for i, (src, g) in enumerate(sorted(pred.groupby("source"), key=lambda kv: kv[0])):
        ax.scatter(g["measured_step_s"], g["predicted_step_s"], s=16, alpha=0.8,
                   color=cmap(i % 10), label=f"{src} ({len(g)})")
    lo = float(min(pred["measured_step_s"].min(), pred["predicted_step_s"].min())) * 0.7
    hi = float(max(pred["measured_step_s"].max(), pred["predicted_step_s"].max())) * 1.4
    xs = np.array([lo, hi])
    ax.plot(xs, xs, "k-", lw=1)
    for f in (0.8, 1.2):
        ax.plot(xs, xs * f, "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title + " (dotted: +-20%)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    from ..output.files import save_figure

    try:
        save_figure(fig, "--plot", path, dpi=120)
    finally:
        plt.close(fig)
