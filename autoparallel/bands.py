"""Error bands on predictions, from leave-one-source-out (LOSO) validation residuals.

A band says where the *measured* value of a prediction is expected to fall: between the 10th and
90th percentiles of the held-out residuals r = ln(predicted / measured) of the validation runs
most like it (`docs/validation.md`, "Error bands"). For a predicted step time t:

    step_low = t x exp(-p90(r)),   step_high = t x exp(-p10(r))

and for memory, `total_high` = total x exp(-p10(r_mem)). The quantiles come from a small shipped
table, `autoparallel/data/error_bands.csv`, written by `benchmarks/error_bands.py` from the LOSO
predictions (each run predicted by knobs fitted to the *other* sources' runs, so the residuals
are out of sample).

Lookup, most specific first; the band's `level` says which was used:

1. `stack+gpu`: runs of this software stack on this GPU (group);
2. `gpu`: runs of any stack on this GPU;
3. `stack`: runs of this stack on other GPUs, and 4. `global`: every run. At these two levels
   this GPU has no runs, so its efficiency knobs are uncalibrated literature values: the step
   quantiles are doubled in log space (`UNCALIBRATED_WIDEN`); memory quantiles are not (the
   memory ledger has no fitted knobs);
5. `none`: the table has nothing: a stated default (`DEFAULT_STEP_LOG`, `DEFAULT_MEMORY_LOG_P10`).

Within a level, step-time quantiles are split by regime: layouts whose exposed communication
(TP + CP + EP + PP + DP items) is at least `COMM_BOUND_SHARE` of the step are `comm`-bound, the
others `compute`-bound (the held-out H100 residuals of the two differ: p10-p90 of r = -0.40..+0.06
over 97 compute-bound runs, -0.61..+0.29 over 17 communication-bound ones). A regime row needs
`MIN_REGIME_RUNS` runs, else the level's pooled row (regime `*`) is used.

Every band contains its point prediction: p10 is clamped to at most -`MIN_HALF_WIDTH` and p90 to
at least +`MIN_HALF_WIDTH` (a stack whose runs all lie on one side of the prediction gets a
one-sided band, not one that excludes the model's own number).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

BAND_FILE = Path(__file__).parent / "data" / "error_bands.csv"
"""The shipped quantile table (package data)."""
BAND_COLUMNS = ("quantity", "stack", "gpu", "regime", "runs", "p10", "p50", "p90", "sources")
"""Columns of the table: quantity (step | memory), stack and gpu (`*` = any), regime (compute |
comm | `*`), runs behind the row, quantiles of ln(predicted / measured), sources (`;`-joined)."""
ANY = "*"
COMM_ITEMS = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
"""Time items counted as exposed communication."""
COMM_BOUND_SHARE = 0.10
"""Exposed-communication share of the step from which a layout counts as communication-bound
(the 90th percentile of the validation runs' share is 0.14; H100 has 17 runs above 0.10)."""
MIN_REGIME_RUNS = 8
"""Runs a regime-specific row needs; fewer and the pooled row of its level is used."""
MIN_POOLED_RUNS = 5
"""Runs a pooled row needs to be written (with 5 runs p10 / p90 are close to min / max)."""
MIN_HALF_WIDTH = 0.01
"""Smallest half-width of a band in log space (1 %), on each side of the prediction."""
UNCALIBRATED_WIDEN = 2.0
"""Factor on the step-time log quantiles at the `stack` and `global` levels (the GPU has no
runs, its knobs are uncalibrated): the uncalibrated GB200 preset is 47 % slow on its 7 runs,
B200 15 % (docs/validation.md), outside the pooled p10 of calibrated GPUs (-0.36)."""
DEFAULT_STEP_LOG = (-math.log(2.0), math.log(2.0))
"""(p10, p90) of ln(predicted / measured) step time when the table has no row at all: the measured
step anywhere from half to twice the prediction."""
DEFAULT_MEMORY_LOG_P10 = -math.log(1.25)
"""p10 of ln(predicted / measured) memory when the table has no memory row: measured up to 25 %
above the ledger, the bias of the only source that reports memory (nanotron, docs/validation.md)."""
LEVELS = ("stack+gpu", "gpu", "stack", "global", "none")


@dataclass(frozen=True)
class BandRow:
    """One row of the quantile table."""

    quantity: str
    stack: str
    gpu: str
    regime: str
    runs: int
    p10: float
    p50: float
    p90: float
    sources: tuple[str, ...]


@lru_cache(maxsize=4)
def load_bands(path: str | Path | None = None) -> dict[tuple[str, str, str, str], BandRow]:
    """The quantile table keyed by (quantity, stack, gpu, regime); empty when the file is absent."""
    path = Path(path) if path else BAND_FILE
    if not path.exists():
        return {}
    out = {}
    with path.open(newline="", encoding="utf-8") as fh:
        for rec in csv.DictReader(line for line in fh if not line.startswith("#")):
            row = BandRow(rec["quantity"], rec["stack"], rec["gpu"], rec["regime"], int(rec["runs"]),
                          float(rec["p10"]), float(rec["p50"]), float(rec["p90"]),
                          tuple(s for s in rec["sources"].split(";") if s))
            out[(row.quantity, row.stack, row.gpu, row.regime)] = row
    return out


def _candidates(stack: str | None, gpu: str):
    """(level, stack key, gpu key) in lookup order."""
    if stack:
        yield "stack+gpu", stack, gpu
    yield "gpu", ANY, gpu
    if stack:
        yield "stack", stack, ANY
    yield "global", ANY, ANY


def find_row(quantity: str, stack: str | None, gpu: str, regime: str = ANY,
             table: dict | None = None) -> tuple[str, BandRow | None]:
    """(level, row) for one quantity: the most specific level with a row; within a level the
    regime row when it has `MIN_REGIME_RUNS`, else the level's pooled row."""
    table = load_bands() if table is None else table
    for level, s, g in _candidates(stack, gpu):
        row = table.get((quantity, s, g, regime))
        if row is not None and (regime == ANY or row.runs >= MIN_REGIME_RUNS):
            return level, row
        row = table.get((quantity, s, g, ANY))
        if row is not None:
            return level, row
    return "none", None


def exposed_comm_share(time: dict[str, np.ndarray]) -> np.ndarray:
    """Exposed communication / step time, per row."""
    comm = sum(np.asarray(time[k], dtype=float) for k in COMM_ITEMS)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(time["step"] > 0, comm / time["step"], 0.0)


def _log_quantiles(level: str, row: BandRow | None, quantity: str) -> tuple[float, float]:
    """(p10, p90) of ln(pred / meas) actually applied: widened when uncalibrated, clamped."""
    if row is None:
        p10, p90 = DEFAULT_STEP_LOG if quantity == "step" else (DEFAULT_MEMORY_LOG_P10, 0.0)
    else:
        p10, p90 = row.p10, row.p90
        if quantity == "step" and level in ("stack", "global"):
            p10, p90 = UNCALIBRATED_WIDEN * p10, UNCALIBRATED_WIDEN * p90
    return min(p10, -MIN_HALF_WIDTH), max(p90, MIN_HALF_WIDTH)


@dataclass(frozen=True)
class Bands:
    """Bands of every row of an evaluation."""

    step_low: np.ndarray
    """Seconds: the measured step is expected above this for 9 in 10 layouts like this one."""
    step_high: np.ndarray
    """Seconds: ... and below this."""
    memory_total_high: np.ndarray
    """Bytes: the measured peak is expected below this for 9 in 10 runs like this one."""
    comm_bound: np.ndarray
    """Per row: the exposed communication share reaches `COMM_BOUND_SHARE`."""
    comm_share: np.ndarray
    """Exposed communication / step per row."""
    step_basis: dict[str, dict]
    """Per regime: level, stack, gpu, runs, sources, p10, p90 (log quantiles applied)."""
    memory_basis: dict
    """Level, stack, gpu, runs, sources, p10 (log quantile applied)."""

    @property
    def regime(self) -> np.ndarray:
        """`compute` or `comm` per row."""
        return np.where(self.comm_bound, "comm", "compute")

    def basis(self, i: int) -> dict:
        """The band object of row i (what the estimate JSON's `band` carries)."""
        regime = "comm" if self.comm_bound[i] else "compute"
        step = self.step_basis[regime]
        return {
            "regime": regime,
            "exposed_comm_share": float(self.comm_share[i]),
            "step_level": step["level"], "step_runs": step["runs"],
            "step_sources": list(step["sources"]),
            "step_log_p10": step["p10"], "step_log_p90": step["p90"],
            "memory_level": self.memory_basis["level"], "memory_runs": self.memory_basis["runs"],
            "memory_sources": list(self.memory_basis["sources"]),
            "memory_log_p10": self.memory_basis["p10"],
            "note": step["note"],
        }


def _basis(level: str, row: BandRow | None, quantity: str, gpu: str) -> dict:
    p10, p90 = _log_quantiles(level, row, quantity)
    if row is None:
        note = ("no validation residuals at all: default band "
                + ("x0.5-x2 on step time" if quantity == "step" else "+25 % on memory"))
    elif level in ("stack", "global") and quantity == "step":
        note = (f"no measured runs on {gpu}: its efficiency knobs are uncalibrated; "
                f"{level}-level quantiles doubled")
    else:
        note = f"{level}-level leave-one-source-out residuals of {row.runs} runs"
    return {"level": level, "stack": row.stack if row else ANY, "gpu": row.gpu if row else ANY,
            "runs": row.runs if row else 0, "sources": row.sources if row else (),
            "p10": p10, "p90": p90, "note": note}


def step_bases(problem, table: dict | None = None) -> dict[str, dict]:
    """Per regime (`compute`, `comm`): the basis of `problem`'s step-time bands (level, runs,
    sources, the log p10 / p90 applied); the same for every row of the problem."""
    gpu = problem.cluster.gpu.name
    stack = getattr(problem.training, "stack", None)  # the job's software stack, when it has one
    return {r: _basis(*find_row("step", stack, gpu, r, table), "step", gpu)
            for r in ("compute", "comm")}


def memory_basis(problem, table: dict | None = None) -> dict:
    """The basis of `problem`'s memory band (level, runs, sources, the log p10 applied)."""
    gpu = problem.cluster.gpu.name
    stack = getattr(problem.training, "stack", None)
    return _basis(*find_row("memory", stack, gpu, ANY, table), "memory", gpu)


def memory_total_high(problem, memory_total: np.ndarray, table: dict | None = None) -> np.ndarray:
    """Bytes per row: the upper edge of the allocated peak's band, total x exp(-p10), which
    needs no time ledger (`Bands.memory_total_high` is this)."""
    return np.asarray(memory_total, dtype=float) * np.exp(-memory_basis(problem, table)["p10"])


def bands_for(problem, time: dict[str, np.ndarray], memory_total: np.ndarray,
              table: dict | None = None) -> Bands:
    """Step-time and memory bands of every row (vectorised; two table lookups per call). A
    row's band depends on that row alone, so the bands of some rows are those rows' bands."""
    share = exposed_comm_share(time)
    comm = share >= COMM_BOUND_SHARE
    step_basis = step_bases(problem, table)
    lo = np.where(comm, step_basis["comm"]["p90"], step_basis["compute"]["p90"])
    hi = np.where(comm, step_basis["comm"]["p10"], step_basis["compute"]["p10"])
    step = np.asarray(time["step"], dtype=float)
    return Bands(step_low=step * np.exp(-lo), step_high=step * np.exp(-hi),
                 memory_total_high=memory_total_high(problem, memory_total, table),
                 comm_bound=comm, comm_share=share, step_basis=step_basis,
                 memory_basis=memory_basis(problem, table))


__all__ = ["BAND_FILE", "Bands", "COMM_BOUND_SHARE", "bands_for", "exposed_comm_share",
           "find_row", "load_bands", "memory_basis", "memory_total_high", "step_bases"]
