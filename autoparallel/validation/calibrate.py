"""Fit `Profile` knobs to measured runs: robust least squares on log step time, within physical
bounds, plus leave-one-source-out (LOSO) errors.

Residual of a run: ln(predicted step) - ln(measured step). `scipy.optimize.least_squares`
(trust-region reflective, bounds) minimises sum rho(r^2) with a robust loss (default `soft_l1`,
scale 0.1 = 10 % error), so that a few runs the model cannot explain do not drag the knobs.
A weak Gaussian prior pulls each knob towards its reference value (`Profile` default / GPU
preset, reference §6-§8) with the width in `KNOBS`: knobs the data cannot identify stay where
the hardware literature puts them instead of wandering to a bound. `prior_weight=0` turns it off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from ..cost.model_arch import build_arch
from ..cost.time import time_ledger
from ..errors import SpecError
from ..specs.hardware import Profile
from .runs import RunCase

KNOBS: dict[str, tuple[float, float, float]] = {
    # name: (lower bound, upper bound, prior width); efficiencies never above 1
    "gemm_efficiency": (0.2, 1.0, 0.25),
    "fp8_gemm_efficiency": (0.2, 1.0, 0.25),
    "fp4_gemm_efficiency": (0.2, 1.0, 0.25),
    "gemm_overhead_us": (0.0, 100.0, 20.0),
    "attention_efficiency": (0.05, 1.0, 0.25),
    "cudnn_attention_efficiency": (0.05, 1.0, 0.25),
    "hbm_efficiency": (0.2, 1.0, 0.25),
    "elementwise_factor": (0.0, 10.0, 2.0),
    "scaleup_efficiency": (0.1, 1.0, 0.3),
    "nic_efficiency": (0.05, 1.0, 0.3),
    "dp_overlap": (0.0, 1.0, 0.5),
    "ep_overlap": (0.0, 1.0, 0.5),
    "step_overhead_ms": (0.0, 5000.0, 500.0),
    "latency_base_us": (0.0, 500.0, 50.0),
    "moe_host_overhead_us": (0.0, 20000.0, 2000.0),
    "grouped_gemm_expert_us": (0.0, 200.0, 20.0),
    "moe_dropless_imbalance": (1.0, 3.0, 0.3),
}
"""Knobs `calibrate` may fit: physical bounds and the prior width."""

MOE_KNOBS = ("moe_host_overhead_us", "grouped_gemm_expert_us")
"""The MoE knobs, fitted across GPUs on a stack's MoE runs (`benchmarks/fit_moe.py`, which writes
them at the top of each profile table of the stack preset), not per GPU with the others."""
DEFAULT_KNOBS = ("gemm_efficiency", "fp8_gemm_efficiency", "fp4_gemm_efficiency",
                 "attention_efficiency", "cudnn_attention_efficiency", "elementwise_factor",
                 "step_overhead_ms")
"""Fitted by default: the knobs the shared runs identify (standard error from the runs alone well
below the prior width, `Fit.identified`, on both the H100 and the A100 runs). The collective
bandwidths, overlaps, per-GEMM overhead and latencies are not identified by them (errors of
0.3-60 in their own units when fitted) and keep their hardware-measured reference values. The
MoE knobs (host time of dynamic-shape layers, per-expert grouped-GEMM tail) are fitted once per
stack across GPUs (`benchmarks/fit_moe.py`), not per GPU; `--knobs` may still name them."""


def kernel_family(stack: str) -> str:
    """The group of stacks fitted together with `stack` (`StackSpec.kernels`, else the stack)."""
    from ..presets import load_stack

    return load_stack(stack).kernels or stack


def profile_fit_cases(cases):
    """The runs the shipped profiles are fitted on (`benchmarks/calibrate_stacks.py`, and each
    leave-one-source-out fold): dense models. The fitted knobs are the dense kernels'
    efficiencies and per-step costs; MoE runs' errors are dominated by the expert dispatch the
    time model does not price yet (docs/validation.md), which fitting those knobs would absorb
    and carry into every dense prediction on the GPU. MoE runs are predicted with the dense fit;
    a (stack family, GPU) with no dense run has no fit and takes the nearest GPU's
    (`problem.stack_profile`: B300's MoE-only Megatron-Bridge runs take GB300's)."""
    return [c for c in cases if c.model.moe is None]


@dataclass(frozen=True)
class Fit:
    """Result of one calibration."""

    profile: Profile
    knobs: dict[str, float]
    n_runs: int
    cost: float
    residuals: np.ndarray
    """ln(predicted / measured) per run at the fitted knobs."""
    success: bool
    std: dict[str, float]
    """Standard error of each knob from the runs alone (Gauss-Newton, (J^T J)^-1 of the data
    residuals at the solution): a knob whose error is not well below its prior width is not
    identified by these runs and stays near its reference value."""

    def identified(self, name: str) -> bool:
        """Whether the runs pin `name` to better than half its prior width."""
        return self.std[name] < 0.5 * KNOBS[name][2]


class _Model:
    """The runs, prepared once: problem, arch and table per run; evaluates the time ledger only
    (the knobs do not move the memory ledger)."""

    def __init__(self, cases: Sequence[RunCase], base: Profile):
        self.cases = list(cases)
        self.base = base
        self.items = [(c.problem(base), build_arch(c.model), c.table()) for c in self.cases]
        self.log_meas = np.log([c.measured_step_s for c in self.cases])

    def log_pred(self, profile: Profile) -> np.ndarray:
        out = np.empty(len(self.items))
        for i, (problem, arch, table) in enumerate(self.items):
            p = problem.model_copy(update={"profile": profile})
            with np.errstate(divide="ignore", invalid="ignore"):
                out[i] = np.log(time_ledger(p, arch, table)["step"][0])
        return out


def _profile(base: Profile, names: Sequence[str], x: np.ndarray) -> Profile:
    return base.model_copy(update={k: float(v) for k, v in zip(names, x)})


def _used(model: _Model, base: Profile, names: Sequence[str]) -> tuple[str, ...]:
    """The knobs at least one run depends on (e.g. no A100 run uses cuDNN attention): the others
    are left out of the fit and keep their reference values."""
    f0 = model.log_pred(base)
    used = []
    for k in names:
        lo, hi = KNOBS[k][0], KNOBS[k][1]
        x = float(np.clip(getattr(base, k), lo, hi))
        step = 0.01 * (hi - lo) * (1 if x + 0.01 * (hi - lo) <= hi else -1)
        f1 = model.log_pred(base.model_copy(update={k: x + step}))
        if np.nanmax(np.abs(f1 - f0)) > 1e-9:
            used.append(k)
    if not used:
        raise SpecError(f"none of the knobs {', '.join(names)} changes the predicted step time "
                        "of these runs")
    return tuple(used)


def _standard_errors(model, base, names, x, resid, lo, hi) -> dict[str, float]:
    """Gauss-Newton standard errors of the knobs from the runs alone: sigma^2 (J^T J)^-1, with J
    the forward-difference Jacobian of ln(predicted step) and sigma the robust (MAD) scale of the
    residuals; correlated knobs that the runs cannot tell apart get large errors."""
    f0 = model.log_pred(_profile(base, names, x))
    cols = []
    for i in range(len(x)):
        h = 1e-3 * (hi[i] - lo[i])
        xi = np.array(x, dtype=float)
        xi[i] = xi[i] + h if xi[i] + h <= hi[i] else xi[i] - h
        cols.append((model.log_pred(_profile(base, names, xi)) - f0) / (xi[i] - x[i]))
    jac = np.nan_to_num(np.stack(cols, axis=1))
    finite = resid[np.isfinite(resid)]
    sigma = 1.4826 * float(np.median(np.abs(finite - np.median(finite)))) if len(finite) else 1.0
    jtj = jac.T @ jac
    cov = np.linalg.pinv(jtj) * max(sigma, 1e-6) ** 2
    dead = np.diag(jtj) < 1e-20  # the runs do not depend on this knob at all
    return {k: float("inf") if dead[i] else float(np.sqrt(max(cov[i, i], 0.0)))
            for i, k in enumerate(names)}


def check_knobs(names: Sequence[str]) -> tuple[str, ...]:
    """Validate knob names (SpecError naming the unknown ones)."""
    unknown = [k for k in names if k not in KNOBS]
    if unknown:
        raise SpecError(f"unknown knob(s) {', '.join(unknown)}; calibratable knobs: "
                        f"{', '.join(KNOBS)}")
    if not names:
        raise SpecError("no knobs to fit")
    return tuple(dict.fromkeys(names))


def fit(cases: Sequence[RunCase], base: Profile, knobs: Sequence[str] = DEFAULT_KNOBS,
        loss: str = "soft_l1", f_scale: float = 0.1, prior_weight: float = 1.0,
        max_nfev: int = 200) -> Fit:
    """Fit `knobs` of `base` to `cases` (all of one GPU kind, or one chip in several memory
    sizes); the start point and the prior centre are `base`'s values."""
    names = check_knobs(knobs)
    if not cases:
        raise SpecError("no usable runs to calibrate on")
    model = _Model(cases, base)
    names = _used(model, base, names)
    lo = np.array([KNOBS[k][0] for k in names])
    hi = np.array([KNOBS[k][1] for k in names])
    width = np.array([KNOBS[k][2] for k in names])
    x0 = np.clip([getattr(base, k) for k in names], lo, hi)
    centre = x0.copy()
    w = np.sqrt(prior_weight) if prior_weight > 0 else 0.0

    def residuals(x):
        r = model.log_pred(_profile(base, names, x)) - model.log_meas
        r = np.where(np.isfinite(r), r, 10.0)
        return np.concatenate([r, w * (x - centre) / width]) if w else r

    sol = least_squares(residuals, x0, bounds=(lo, hi), loss=loss, f_scale=f_scale,
                        x_scale=width, max_nfev=max_nfev, diff_step=1e-3)
    values = {k: float(v) for k, v in zip(names, sol.x)}
    prof = _profile(base, names, sol.x)
    resid = model.log_pred(prof) - model.log_meas
    std = _standard_errors(model, base, names, sol.x, resid, lo, hi)
    return Fit(profile=prof, knobs=values, n_runs=len(cases), cost=float(sol.cost),
               residuals=resid, success=bool(sol.success), std=std)


def toml_text(result: Fit, gpus: Sequence[str], runs_path: str, sources: Sequence[str],
              loso: dict | None = None, stack: str | None = None) -> str:
    """The calibrated profile as TOML: `gpu` (and `stack` when fitted on one stack's runs), a `[profile]` table (every knob, fitted ones
    commented), and a `[fit]` table with what it was fitted on."""
    lines = [
        "# Efficiency profile fitted by `autoparallel calibrate` (robust least squares on log step",
        f"# time) to {result.n_runs} measured runs of {', '.join(gpus)} from {runs_path}.",
        f"# Sources: {', '.join(sources)}.",
        f'gpu = "{gpus[0]}"',
    ] + ([f'stack = "{stack}"'] if stack else []) + [
        "",
        "[profile]",
    ]
    for name, value in result.profile.model_dump().items():
        note = ""
        if name in result.knobs:
            note = (f"  # fitted, +-{result.std[name]:.2g}" if result.identified(name)
                    else "  # fitted but not identified by these runs (stays near its reference)")
        lines.append(f"{name} = {value:.6g}{note}")
    lines += ["", "[fit]", f"runs = {result.n_runs}", f"converged = {str(result.success).lower()}",
              f"in_sample_median_abs_err = {float(np.median(np.abs(np.expm1(result.residuals)))):.4f}"]
    if loso:
        for key, value in loso.items():
            lines.append(f"{key} = {value:.4f}")
    return "\n".join(lines) + "\n"
