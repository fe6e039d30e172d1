"""`tune --calibrate`: refit a few efficiency knobs of the `Profile` to the measured step times.

The fit (scipy.optimize.least_squares, trust-region reflective, bounded):

- parameters: each efficiency knob in `KNOBS` as a factor on its current value (bounded so the
  knob stays in (0.02, 1]), and `step_overhead_ms` as milliseconds (bounded to [0, median
  measured step]);
- residuals: log(predicted / measured) of every measured layout — relative errors, so long and
  short steps weigh the same — plus a prior term per knob, sqrt(`prior_weight`) x log(factor)
  (and x overhead / median step), which keeps knobs the measurements cannot tell apart near
  their current values.

Since the fit starts at the current profile and never increases the cost, the refitted profile's
RMS error on the measurements is at most the current one. It is a small, local refit of one
job's measurements, not a general calibration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..cost.arch import build_arch
from ..evaluate import evaluate
from ..layouts import LayoutTable
from ..specs.hardware import Profile
from ..specs.layout import Layout
from ..specs.problem import Problem

KNOBS = ("gemm_efficiency", "attention_efficiency", "scaleup_efficiency", "nic_efficiency")
"""Efficiency knobs the refit moves (plus `step_overhead_ms`); with `attention = "cudnn"` the
job's attention knob, `cudnn_attention_efficiency`, takes the place of `attention_efficiency`."""


def knobs_for(problem: Problem) -> tuple[str, ...]:
    """`KNOBS` with the attention knob the job's attention kernel uses."""
    if problem.training.attention == "cudnn":
        return tuple("cudnn_attention_efficiency" if k == "attention_efficiency" else k
                     for k in KNOBS)
    return KNOBS
MIN_EFFICIENCY = 0.02


@dataclass(frozen=True)
class Calibration:
    """A refitted profile and how well it and the starting profile match the measurements."""

    profile: Profile
    fitted: dict[str, float]
    """Knob -> refitted value."""
    n_measurements: int
    rms_log_error_before: float
    rms_log_error_after: float

    def to_json(self) -> dict:
        return {"fitted": self.fitted, "n_measurements": self.n_measurements,
                "rms_log_error_before": self.rms_log_error_before,
                "rms_log_error_after": self.rms_log_error_after}


def _predict_s(problem: Problem, arch, table: LayoutTable, profile: Profile) -> np.ndarray:
    ev = evaluate(problem.model_copy(update={"profile": profile}), table, arch=arch)
    return np.asarray(ev.time["step"], dtype=float)


def fit_profile(problem: Problem, measured: list[tuple[Layout, float]],
                prior_weight: float = 0.05) -> Calibration:
    """Refit `knobs_for(problem)` and `step_overhead_ms` of `problem.profile` to (layout, step
    seconds) pairs.

    Raises:
        ValueError: fewer than two measurements.
    """
    from scipy.optimize import least_squares

    if len(measured) < 2:
        raise ValueError(f"calibration needs at least 2 measured layouts, got {len(measured)}")
    arch = build_arch(problem.model)
    table = LayoutTable.from_layouts([lay for lay, _ in measured], problem.cluster.n_gpus)
    y = np.log(np.array([t for _, t in measured], dtype=float))
    base = problem.profile
    knobs = knobs_for(problem)
    start = np.array([getattr(base, k) for k in knobs])
    median_ms = float(np.median(np.exp(y))) * 1e3
    w = np.sqrt(prior_weight)

    def profile_at(x: np.ndarray) -> Profile:
        moved = {k: float(min(1.0, v)) for k, v in zip(knobs, start * x[:-1])}
        return base.model_copy(update=moved | {"step_overhead_ms": float(x[-1])})

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = _predict_s(problem, arch, table, profile_at(x))
        fit = np.log(np.maximum(pred, 1e-12)) - y
        prior = w * np.append(np.log(x[:-1]), (x[-1] - base.step_overhead_ms) / median_ms)
        return np.concatenate([fit, prior])

    x0 = np.append(np.ones(len(knobs)), base.step_overhead_ms)
    lower = np.append(MIN_EFFICIENCY / start, 0.0)
    upper = np.append(1.0 / start, max(median_ms, base.step_overhead_ms + 1e-9))
    sol = least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale="jac")
    n = len(measured)
    before = float(np.sqrt(np.mean(residuals(x0)[:n] ** 2)))
    after = float(np.sqrt(np.mean(residuals(sol.x)[:n] ** 2)))
    prof = profile_at(sol.x)
    if after > before:  # keep the promise of never being worse on the measurements
        prof, after = base, before
    fitted = {k: float(getattr(prof, k)) for k in (*knobs, "step_overhead_ms")}
    return Calibration(prof, fitted, n, before, after)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(float(v)) if isinstance(v, float) else str(v)
    return json.dumps(str(v))  # JSON string escapes are valid TOML basic-string escapes


def write_profile(path: str | Path, cal: Calibration, problem: Problem, study: str) -> Path:
    """Write the refitted profile as TOML (`[profile]` knobs, `[meta]` provenance); readable
    by `--profile` and `autoparallel.presets.load_profile`."""
    lines = [f"# autoparallel tune --calibrate: {', '.join(cal.fitted)} refitted to "
             f"{cal.n_measurements} measured step times of study {study!r}",
             f"# RMS log error on those measurements: {cal.rms_log_error_before:.4f} -> "
             f"{cal.rms_log_error_after:.4f}", "", "[profile]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in cal.profile.model_dump().items()]
    d = problem.describe()
    lines += ["", "[meta]", f"study = {_toml_value(study)}"]
    lines += [f"{k} = {_toml_value(d[k])}"
              for k in ("model", "gpu", "n_gpus", "seq_len", "global_batch")]
    lines += [f"n_measurements = {cal.n_measurements}",
              f"rms_log_error_before = {cal.rms_log_error_before!r}",
              f"rms_log_error_after = {cal.rms_log_error_after!r}",
              f"fitted = [{', '.join(_toml_value(k) for k in cal.fitted)}]"]
    out = Path(path)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out
