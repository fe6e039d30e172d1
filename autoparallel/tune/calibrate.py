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
        SpecError: a degenerate fit, with the reason: fewer than two distinct measured layouts,
            a step time that is not a positive finite number, or a prediction or fit whose error
            is not finite.
    """
    from ..errors import SpecError
    from ..validation.calibrate import _Model, fit

    bad = [t for _, t in measured if not (isinstance(t, (int, float)) and np.isfinite(t) and t > 0)]
    if bad:
        raise SpecError(f"`--calibrate`: cannot fit to step times that are not positive finite "
                        f"numbers ({', '.join(repr(t) for t in bad[:3])})")
    distinct = {lay.slug for lay, _ in measured}
    if len(distinct) < 2:
        raise SpecError(f"`--calibrate` needs at least 2 distinct measured layouts to fit "
                        f"anything; the study has {len(distinct)}")
    base = problem.profile
    cases = _cases(problem, measured)
    model = _Model(cases, base)
    with np.errstate(all="ignore"):
        before = float(np.sqrt(np.mean((model.log_pred(base) - model.log_meas) ** 2)))
    if not np.isfinite(before):
        raise SpecError("`--calibrate`: the current profile's predictions of the measured "
                        "layouts are not finite numbers, so there is no error to reduce")
    try:
        res = fit(cases, base, knobs=knobs_for(problem), loss="linear", prior_weight=prior_weight)
    except ValueError as exc:
        raise SpecError(f"`--calibrate`: the fit failed ({exc})") from None
    after = float(np.sqrt(np.mean(res.residuals ** 2)))
    if not np.isfinite(after):
        raise SpecError("`--calibrate`: the refit's error is not a finite number (a degenerate "
                        "fit); the profile is left as it is")
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
    from ..output.files import write_whole

    return write_whole("--profile-out", path, "\n".join(lines) + "\n")
