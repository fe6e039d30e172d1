"""Measured per-GPU memory (autoparallel/data/memory_runs.csv) against the three figures.

Each run is compared with the figure its `mem_definition` names: `allocated`
(`torch.cuda.max_memory_allocated`), `reserved` (`max_memory_reserved`, TorchTitan's printed
memory) or `device` (`nvidia-smi`; FlagPerf's monitor samples nvidia-smi). OOM reports are checked
for the verdict only: a run that died must be predicted not to fit, a run that ran must be
predicted to fit (the default rule, `cost.memory.memory_ledger`). Rows go through the same
mapping as the step-time validation (`runs.case_from_row`, memory mode), FP16 kept (memory is
the same as BF16). A measured peak below the weights and optimizer states of every parameter
sharded over all the job's GPUs (`plausible.least_state_bytes`) is not this job's memory: the
row is skipped with that reason.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..errors import AutoParallelError
from ..evaluate import evaluate
from ..units import GiB
from .modelspec import RowSkip
from .plausible import least_state_bytes
from .memory_definitions import FIGURE, definition, figure_key
from .runs import RULES, case_from_row

BELOW_STATE = "below the least model state its GPUs can hold (not this job's memory)"
"""Skip reason of a row whose measured peak is below `plausible.least_state_bytes`."""


def _job_from_row(row) -> dict:
    """bf16-true training (Lightning: the optimizer state in bf16, ~8 bytes/parameter)."""
    text = " ".join(str(row.get(c) or "") for c in ("precision", "mem_definition", "framework",
                                                     "notes", "model")).lower()
    return {"optimizer_dtype": "bf16"} if "bf16-true" in text else {}


def memory_records(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(records, skipped): one record per usable row with measured and predicted memory (GiB)
    and the fit verdicts; skipped rows with their reason."""
    out, skipped = [], []
    for rec in frame.to_dict("records"):
        rec = {k: (None if v == "" else v) for k, v in rec.items()}
        rid, src = rec.get("row_id"), rec.get("source_key") or "runs"
        status = str(rec.get("run_status") or "ok").strip().lower()
        oom = status == "oom"
        kind = definition(str(rec.get("mem_definition") or ""), status)
        if kind is None and not oom:
            skipped.append((rid, src, "memory definition not stated"))
            continue
        gpu = str(rec.get("gpu") or "")
        if re.search(r"\ba800\b", gpu, re.I) and "80" in gpu:
            # A800 = A100 80GB with NVLink capped at 400 GB/s: the same memory (NVIDIA A800
            # datasheet); step-time validation skips it, the memory check may not
            rec["gpu"] = "A100 80GB (A800)"
        try:
            case = case_from_row(rec, allow_fp16=True, memory=True)
            extra = _job_from_row(rec)
            if extra:
                case = case.__class__(**{**case.__dict__, "job": case.job | extra})
            problem = case.problem()
            ev = evaluate(problem, case.table(), RULES)
        except RowSkip as exc:
            skipped.append((rid, src, str(exc)))
            continue
        except (AutoParallelError, ValueError) as exc:
            skipped.append((rid, src, "invalid row: " + str(exc).splitlines()[0][:80]))
            continue
        measured = case.measured_mem_gib
        if kind == "reserved" and rec.get("mem_reserved_max_gb"):
            measured = float(rec["mem_reserved_max_gb"])  # GiB in the file
        if measured and not oom and measured * GiB < least_state_bytes(
                problem, case.layout.optimizer_offload):
            skipped.append((rid, src, BELOW_STATE))
            continue
        # the stage the figure was taken on (rank 0: the first stage), else the most loaded one
        predicted = float(ev.memory[figure_key(kind, rec.get("mem_definition") or "")][0]) / GiB \
            if kind else np.nan
        stages = _stage_errors(rec, ev, kind, measured / float(rec.get("peak_mem_gb") or 1.0)) \
            if kind and measured else {}
        out.append({
            "row_id": rid, "source": src, "definition": kind or "oom", "oom": oom,
            "moe": case.model.moe is not None, "stack": case.stack, "gpu": case.gpu,
            "layout": case.layout.resolved(case.n_gpus).slug,
            "measured_gib": measured if not oom or kind else np.nan,
            "predicted_gib": predicted,
            "mem_err": (predicted / measured - 1.0) if (measured and kind and not oom) else np.nan,
            "allocated_gib": float(ev.memory["total"][0]) / GiB,
            "reserved_gib": float(ev.memory["reserved"][0]) / GiB,
            "device_gib": float(ev.memory["device"][0]) / GiB,
            "usable_gib": float(ev.memory["usable"][0]) / GiB,
            "predicted_fit": bool(ev.fits[0]),
            "assumptions": "; ".join(case.assumptions),
        } | stages)
    return pd.DataFrame(out), pd.DataFrame(skipped, columns=["row_id", "source", "reason"])


PER_STAGE = re.compile(r"per-PP-stage memory[^:]*:\s*([\d.]+(?:\s*/\s*[\d.]+)+)", re.I)
"""Notes that list the memory of every pipeline stage, first to last (FlagPerf's PaddleNLP runs)."""
STAGE_KEYS = ("first", "middle", "last")


def _stage_errors(rec: dict, ev, kind: str, unit: float) -> dict:
    """Per-stage errors where the row's notes list each stage's memory: the ledger's first stage
    against rank 0, its most loaded middle stage against rank 1 (1F1B holds the most micro-batches
    there) and its last against rank pp-1; `unit` converts the notes' unit to GiB like the row's
    peak figure."""
    m = PER_STAGE.search(str(rec.get("notes") or ""))
    if not m:
        return {}
    measured = [float(x) * unit for x in m.group(1).split("/")]
    if len(measured) < 3:
        return {}
    figure = FIGURE[kind]
    out = {}
    for key, rank in zip(STAGE_KEYS, (0, 1, len(measured) - 1)):
        pred = float(ev.memory[f"{key}.{'allocated' if figure == 'total' else figure}"][0]) / GiB
        out[f"{key}_stage_err"] = pred / measured[rank] - 1.0
    return out


def stage_summary(records: pd.DataFrame) -> dict | None:
    """Median and largest |error| over the per-stage comparisons (`_stage_errors`), or None."""
    cols = [f"{k}_stage_err" for k in STAGE_KEYS if f"{k}_stage_err" in records]
    if not cols:
        return None
    errs = records[cols].stack().dropna()
    if not len(errs):
        return None
    return {"runs": int(records[cols[0]].notna().sum()), "stages": len(errs),
            "median_abs_err": float(errs.abs().median()), "max_abs_err": float(errs.abs().max())}


def memory_summary(records: pd.DataFrame) -> pd.DataFrame:
    """Per source and definition, then `all` (dense rows only, OOM rows excluded from the errors):
    rows, median |error|, p90 |error|, bias (median signed error), OOM reports predicted to fit,
    runs that ran predicted not to fit."""
    rows = []
    dense = records[~records["moe"]] if len(records) else records
    groups = list(dense.groupby(["source", "definition"])) + [(("all", "all"), dense)]
    for (src, kind), g in groups:
        err = g["mem_err"].dropna()
        ran = g[~g["oom"]]
        rows.append({
            "source": src, "definition": kind, "rows": len(err),
            "median_abs_err": float(err.abs().median()) if len(err) else np.nan,
            "p90_abs_err": float(err.abs().quantile(0.9)) if len(err) else np.nan,
            "bias": float(err.median()) if len(err) else np.nan,
            "oom_reports": int(g["oom"].sum()),
            "oom_predicted_fit": int((g["oom"] & g["predicted_fit"]).sum()),
            "ran": len(ran), "ran_predicted_not_fit": int((~ran["predicted_fit"]).sum()),
        })
    return pd.DataFrame(rows)
