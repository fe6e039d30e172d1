"""`tune --calibrate`: refit a few efficiency knobs of the `Profile` to the measured step times.

The fit is the one of `autoparallel calibrate` (`validation.calibrate.fit`: least squares on
log step time within physical bounds, a prior at the current values so that knobs the
measurements cannot tell apart stay put), run on this study's measurements as run cases. Unlike a
calibration on published runs it must never make the profile worse on the layouts it measured:
if the refit's RMS log error is higher than the current profile's, the current one is kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..specs.hardware import Profile
from ..specs.layout import Layout
from ..specs.problem import Problem

KNOBS = ("gemm_efficiency", "attention_efficiency", "scaleup_efficiency", "nic_efficiency",
         "step_overhead_ms")
"""Knobs the refit moves; with `attention = "cudnn"` the job's attention knob,
`cudnn_attention_efficiency`, takes the place of `attention_efficiency`."""


def knobs_for(problem: Problem) -> tuple[str, ...]:
    """`KNOBS` with the attention knob the job's attention kernel uses."""
    if problem.training.attention == "cudnn":
        return tuple("cudnn_attention_efficiency" if k == "attention_efficiency" else k
                     for k in KNOBS)
    return KNOBS


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


def _cases(problem: Problem, measured: list[tuple[Layout, float]]):
    from ..validation.runs import RunCase

    c, tr = problem.cluster, problem.training
    return [RunCase(row_id=f"trial{i}", source="tune", gpu=c.gpu, model=problem.model,
                    n_gpus=c.n_gpus, gpus_per_node=c.gpus_per_node, seq_len=tr.seq_len,
                    global_batch=tr.global_batch, layout=lay, measured_step_s=float(t),
                    measured_from="tune",
                    job={k: v for k, v in problem.job_settings().items()
                         if v is not None and k != "profile"} | {"stack": problem.stack})
            for i, (lay, t) in enumerate(measured)]


def fit_profile(problem: Problem, measured: list[tuple[Layout, float]],
                prior_weight: float = 0.05) -> Calibration:
    """Refit `knobs_for(problem)` of `problem.profile` to (layout, step seconds) pairs.

    Raises:
        ValueError: fewer than two measurements.
    """
    from ..validation.calibrate import _Model, fit

    if len(measured) < 2:
        raise ValueError(f"calibration needs at least 2 measured layouts, got {len(measured)}")
    base = problem.profile
    cases = _cases(problem, measured)
    res = fit(cases, base, knobs=knobs_for(problem), loss="linear", prior_weight=prior_weight)
    after = float(np.sqrt(np.mean(res.residuals ** 2)))
    model = _Model(cases, base)
    before = float(np.sqrt(np.mean((model.log_pred(base) - model.log_meas) ** 2)))
    prof = res.profile
    if not after <= before:  # keep the promise of never being worse on the measurements
        prof, after = base, before
    fitted = {k: float(getattr(prof, k)) for k in res.knobs}
    return Calibration(prof, fitted, len(measured), before, after)


def pinned_knobs(cal: Calibration) -> list[str]:
    """Warnings for the refitted knobs that ended at a physical bound (`validation.plausible`)."""
    from ..validation.calibrate import KNOBS as BOUNDS
    from ..validation.plausible import pinned

    return pinned(cal.fitted, {k: (lo, hi) for k, (lo, hi, _) in BOUNDS.items()})


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
