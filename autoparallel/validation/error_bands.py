"""Build the error-band table (`autoparallel/data/error_bands.csv`) from leave-one-source-out
predictions, and check its coverage.

Input: the frame of `loso_predictions` (one held-out prediction per run, `report.predict`
columns). Residual r = ln(predicted / measured), for step time and, where a run reports it, peak
memory. Rows are written per (stack, GPU) and their fallbacks (GPU alone, stack alone, all runs),
with step-time rows split by regime (see `autoparallel.bands`). The frame gets a `stack` column
when the run mapping provides one; until then every run counts as stack `*`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..bands import (ANY, BAND_COLUMNS, COMM_BOUND_SHARE, MIN_POOLED_RUNS, MIN_REGIME_RUNS,
                     BandRow, bands_for)
from .loso import group_of

QUANTILES = (10, 50, 90)
"""Percentiles written to the table."""


def residual_frame(pred: pd.DataFrame) -> pd.DataFrame:
    """Per run: gpu, stack, source, regime, comm share, step and memory log residuals."""
    time = {k: pred[f"time_{k}_s"].to_numpy(dtype=float)
            for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "step")}
    from ..bands import exposed_comm_share

    share = exposed_comm_share(time)
    stack = pred["stack"] if "stack" in pred.columns else pd.Series(ANY, index=pred.index)
    out = pd.DataFrame({
        "row_id": pred["row_id"], "source": pred["source"], "gpu": pred["gpu"],
        "stack": stack.fillna(ANY).astype(str),
        "comm_share": share,
        "regime": np.where(share >= COMM_BOUND_SHARE, "comm", "compute"),
        "measured_step_s": pred["measured_step_s"], "predicted_step_s": pred["predicted_step_s"],
        "r_step": np.log(pred["predicted_step_s"] / pred["measured_step_s"]),
        "r_memory": np.log(pred["predicted_mem_gib"] / pred["measured_mem_gib"].astype(float)),
    })
    return out


def _row(quantity: str, stack: str, gpu: str, regime: str, r: pd.Series, sources) -> BandRow:
    q = np.percentile(r.to_numpy(dtype=float), QUANTILES)
    return BandRow(quantity, stack, gpu, regime, int(len(r)), *(round(float(x), 4) for x in q),
                   tuple(sorted(set(sources))))


def memory_residual_frame(records: pd.DataFrame) -> pd.DataFrame:
    """The memory runs' log residuals (`memory_check.memory_records`, dense rows with a measured
    figure) in `residual_frame`'s columns, step columns empty: pooled into the memory quantiles
    by `band_rows(res, memory=...)`."""
    dense = records[~records["moe"] & records["mem_err"].notna()]
    return pd.DataFrame({
        "row_id": dense["row_id"], "source": dense["source"], "gpu": dense["gpu"],
        "stack": dense["stack"].astype(str), "r_step": np.nan,
        "r_memory": np.log1p(dense["mem_err"].astype(float)),
    })


def band_rows(res: pd.DataFrame, memory: pd.DataFrame | None = None) -> list[BandRow]:
    """Quantile rows for every key with enough runs (pooled: `MIN_POOLED_RUNS`; per regime:
    `MIN_REGIME_RUNS`). A GPU key is written for every preset of its group (A100 40GB + 80GB).
    `memory` (`memory_residual_frame`) adds the dedicated memory runs to the memory quantiles."""
    rows: list[BandRow] = []
    res = pd.concat([res, memory], ignore_index=True) if memory is not None and len(memory) \
        else res.copy()
    res["group"] = res["gpu"].map(lambda g: group_of(g))
    keys = [(ANY, None)]  # (stack, gpu group); None = any GPU
    keys += [(ANY, g) for g in sorted(set(res["group"]))]
    stacks = sorted(s for s in set(res["stack"]) if s != ANY)
    keys += [(s, None) for s in stacks]
    keys += [(s, g) for s in stacks for g in sorted(set(res.loc[res["stack"] == s, "group"]))]
    for stack, grp in keys:
        sel = res if stack == ANY else res[res["stack"] == stack]
        if grp is not None:
            sel = sel[sel["group"] == grp]
        gpus = grp if grp is not None else (ANY,)
        for quantity, col in (("step", "r_step"), ("memory", "r_memory")):
            have = sel[sel[col].notna()]
            if len(have) < MIN_POOLED_RUNS:
                continue
            for gpu in gpus:
                rows.append(_row(quantity, stack, gpu, ANY, have[col], have["source"]))
                if quantity == "step":
                    for regime, part in have.groupby("regime"):
                        if len(part) >= MIN_REGIME_RUNS:
                            rows.append(_row(quantity, stack, gpu, str(regime), part[col],
                                             part["source"]))
    return rows


def write_table(rows: list[BandRow], path, header: str = "") -> None:
    """The rows as the shipped CSV (comment lines first)."""
    lines = [f"# {line}" for line in header.splitlines()]
    lines.append(",".join(BAND_COLUMNS))
    for r in rows:
        lines.append(",".join([r.quantity, r.stack, r.gpu, r.regime, str(r.runs), f"{r.p10:.4f}",
                               f"{r.p50:.4f}", f"{r.p90:.4f}", ";".join(r.sources)]))
    from ..output.files import write_whole

    write_whole("--output", path, "\n".join(lines) + "\n")  # whole or not at all


def table_of(rows: list[BandRow]) -> dict:
    """The rows keyed as `bands.load_bands` keys them."""
    return {(r.quantity, r.stack, r.gpu, r.regime): r for r in rows}


class _Case:
    """The two attributes `bands_for` reads from a problem."""

    def __init__(self, gpu: str, stack: str):
        self.cluster = type("C", (), {"gpu": type("G", (), {"name": gpu})()})()
        self.training = type("T", (), {"stack": None if stack == ANY else stack})()


def inside(res: pd.DataFrame, table: dict) -> np.ndarray:
    """Whether each run's measured step lies within the band `table` gives its prediction."""
    ok = np.zeros(len(res), dtype=bool)
    for i, rec in enumerate(res.itertuples(index=False)):
        pred = rec.predicted_step_s
        time = {k: np.array([0.0]) for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm")}
        time["dp_comm"] = np.array([rec.comm_share * pred])
        time["step"] = np.array([pred])
        b = bands_for(_Case(rec.gpu, rec.stack), time, np.array([1.0]), table)
        ok[i] = b.step_low[0] <= rec.measured_step_s <= b.step_high[0]
    return ok


def coverage(res: pd.DataFrame, rows: list[BandRow]) -> pd.DataFrame:
    """Per run, inside the shipped band (`inside_shipped`, quantiles estimated on all runs,
    this one included) and inside a band whose quantiles were estimated without the run's own
    source (`inside_nested`: the honest figure; the run's GPU may then fall back to a wider
    level)."""
    out = res.copy()
    out["inside_shipped"] = inside(res, table_of(rows))
    nested = np.zeros(len(res), dtype=bool)
    for src in sorted(set(res["source"])):
        mask = (res["source"] == src).to_numpy()
        others = band_rows(res[~mask])
        nested[mask] = inside(res[mask], table_of(others))
    out["inside_nested"] = nested
    return out


def memory_coverage(res: pd.DataFrame, memory: pd.DataFrame, rows: list[BandRow]) -> dict:
    """Share of memory residuals (the step-time runs that report memory, `res`, and the memory
    runs, `memory`) at or above their band's p10, the side `total_high` covers (measured <=
    total x exp(-p10)): with the shipped quantiles, and nested (quantiles without the run's own
    source)."""
    from ..bands import find_row

    def low(table: dict, gpu: str, stack: str) -> float:
        _, row = find_row("memory", stack, gpu, ANY, table)  # the shipped lookup order
        return row.p10 if row is not None else -np.inf

    runs = pd.concat([res[res["r_memory"].notna()], memory], ignore_index=True)
    shipped = table_of(rows)
    ok_shipped = [r.r_memory >= low(shipped, r.gpu, r.stack) for r in runs.itertuples()]
    nested_tables = {src: table_of(band_rows(res[res["source"] != src],
                                             memory[memory["source"] != src]))
                     for src in set(runs["source"])}
    ok_nested = [r.r_memory >= low(nested_tables[r.source], r.gpu, r.stack)
                 for r in runs.itertuples()]
    return {"runs": len(runs), "covered_shipped": float(np.mean(ok_shipped)),
            "covered_nested": float(np.mean(ok_nested))}


def coverage_summary(cov: pd.DataFrame, by: str) -> pd.DataFrame:
    """Share of runs inside the band per `by` value and overall (target 80 %: p10-p90)."""
    rows = []
    for key, g in list(cov.groupby(by)) + [("ALL", cov)]:
        rows.append({by: key, "runs": len(g), "inside_shipped": float(g["inside_shipped"].mean()),
                     "inside_nested": float(g["inside_nested"].mean())})
    return pd.DataFrame(rows)
