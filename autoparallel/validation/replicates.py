"""Twin runs: measured rows that the cost model cannot tell apart, and the error they force.

Two rows are *twins* when everything the planner is given is the same: the model's
architecture (its name aside), GPU, GPU count and node size, sequence length, global batch, the
resolved layout and every stated job setting (`RunCase.job`). Published tables repeat a
recipe across releases, and the same recipe is sometimes measured far apart (Megatron-Bridge's
performance archive lists Qwen3-30B-A3B on 16 H100, PP 2 VP 12 EP 8, GBS 1,024 at 5,113
tokens/s/GPU in container 26.02 and 9,058 in 26.02.01, with the same configuration file).

Any deterministic model gives twins one prediction, so its errors on them cannot all be small.
The least error it can reach on a group with measurements m_i is at the p minimising
sum_i |p / m_i - 1| = sum_i |p - m_i| / m_i: the median of the m_i weighted by 1 / m_i (a
weighted L1 minimum). `floor_errors` gives each row its error at that p (0 for a row with no
twin); their median and p90 bound from below what any model can score on these rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import pandas as pd

from .runs import RunCase


def twin_key(case: RunCase) -> str:
    """A key equal for two cases exactly when the planner is given the same inputs."""
    model = case.model.model_dump(mode="json", exclude={"name"})
    return json.dumps({
        "model": model, "gpu": case.gpu, "n_gpus": case.n_gpus,
        "gpus_per_node": case.gpus_per_node, "seq_len": case.seq_len,
        "global_batch": case.global_batch, "layout": case.layout.resolved(case.n_gpus).slug,
        "job": {k: str(v) for k, v in sorted(case.job.items())},
    }, sort_keys=True, default=str)


def best_constant(measured: Iterable[float]) -> float:
    """The p minimising sum_i |p / m_i - 1|: the median of the m_i weighted by 1 / m_i (the
    smallest m_i at which the cumulative weight reaches half the total)."""
    m = np.sort(np.asarray(list(measured), dtype=np.float64))
    if not len(m) or np.any(~np.isfinite(m)) or np.any(m <= 0):
        raise ValueError("best_constant needs positive, finite measurements")
    w = 1.0 / m
    cum = np.cumsum(w)
    return float(m[np.searchsorted(cum, 0.5 * cum[-1] - 1e-15 * cum[-1])])


def floor_errors(keys: Iterable[str], measured: Iterable[float]) -> np.ndarray:
    """Per row, best_constant(its twin group) / measured - 1 (0 for a row without twins)."""
    frame = pd.DataFrame({"key": list(keys), "m": np.asarray(list(measured), dtype=np.float64)})
    best = frame.groupby("key")["m"].transform(best_constant)
    return (best / frame["m"] - 1.0).to_numpy()


def twin_table(cases: list[RunCase], pred: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per case (in order): row_id, source, arch, model, gpu, twin key, group size,
    measured step, floor error and, when `pred` (`report.predict` records with `row_id` and
    `step_err`) is given, the model's error."""
    keys = [twin_key(c) for c in cases]
    measured = [c.measured_step_s for c in cases]
    out = pd.DataFrame({
        "row_id": [c.row_id for c in cases], "source": [c.source for c in cases],
        "arch": ["moe" if c.model.moe is not None else "dense" for c in cases],
        "model": [c.model.name for c in cases], "gpu": [c.gpu for c in cases],
        "key": keys, "measured_step_s": measured,
    })
    out["twins"] = out.groupby("key")["key"].transform("size")
    out["floor_err"] = floor_errors(keys, measured)
    if pred is not None:
        out = out.merge(pred[["row_id", "step_err"]], on="row_id", how="left")
    return out


def floor_summary(table: pd.DataFrame, by: str = "arch") -> pd.DataFrame:
    """Per `by` group and `all`: rows, rows with a twin, groups of twins, the largest measured
    spread within a group (slowest / fastest), the floor's median and p90 |error|, and (when
    the table has `step_err`) the model's median and p90 |error| on the same rows."""
    rows = []
    for name, g in list(table.groupby(by)) + [("all", table)]:
        twins = g[g["twins"] > 1]
        spread = twins.groupby("key")["measured_step_s"].agg(lambda s: s.max() / s.min())
        rec = {by: name, "rows": len(g), "rows_with_twin": len(twins),
               "twin_groups": int(twins["key"].nunique()),
               "largest_spread": float(spread.max()) if len(spread) else np.nan,
               "floor_median_abs_err": float(g["floor_err"].abs().median()),
               "floor_p90_abs_err": float(g["floor_err"].abs().quantile(0.9))}
        if "step_err" in g:
            rec |= {"model_median_abs_err": float(g["step_err"].abs().median()),
                    "model_p90_abs_err": float(g["step_err"].abs().quantile(0.9))}
        rows.append(rec)
    return pd.DataFrame(rows)
