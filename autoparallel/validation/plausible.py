"""Physical plausibility of measurements and of fitted knobs.

- A step cannot be faster than the model's FLOPs at the GPUs' peak: `implied_mfu` = model FLOPs
  per step / (step x n_gpus x peak), with the peak the job's linear GEMMs run at (BF16, or the
  FP8 / FP4 peak of a low-precision recipe: the fastest any kernel of the step can run). Above 1
  (100 % MFU), the number measured is not one training step of this job: a unit (ms read as
  s), a micro-batch's time, one rank's share, or a number that is not a step time.
- A measured memory peak cannot be below the model state the job holds under the most sharded
  layout of its GPUs (`least_state_bytes`): the weights and optimizer states of every parameter
  over every GPU. Below it, the figure is not this job's memory (the memory check skips the row).
- A fitted knob pinned at its physical bound (an efficiency at 1, an overhead at 0) means the
  fit wanted to go further: the measurements are outside what the model can explain with
  physical knobs, and the profile would promise what no run achieves.
- Measured / predicted times in a constant ratio across layouts point at something outside the
  layout (the same factor for every layout), not at a mis-priced axis.
- A step time read from a job's output (`tune`) becomes a trial result only when it could be a
  measurement (`implausible`): a finite positive number, no faster than the 100 % MFU floor
  (`fastest_step_s`), and at most `MAX_OVER_PREDICTION` times the prediction (far beyond the cost
  model's errors, docs/validation.md: a unit mix-up, a millisecond count read as seconds, or the
  regex caught another number). Otherwise the trial FAILs with reason `implausible`, the number
  kept in its detail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

RATIO_MIN_RUNS = 3
"""Measurements needed before a constant ratio is reported."""
RATIO_SPREAD = 0.10
"""Largest max/min - 1 of the measured / predicted ratios that counts as constant."""
RATIO_FAR = 1.5
"""A constant ratio is reported when it lies beyond x1.5 or /1.5 (the error bands' span)."""
PINNED_TOL = 1e-3
"""A knob within this share of its range from a bound counts as pinned there."""
MAX_OVER_PREDICTION = 100.0
"""A measured step more than this many times the predicted one is not taken as a measurement."""


def peak_flops(problem) -> tuple[float, str]:
    """(FLOP/s per GPU, name) of the fastest tensor-core peak the job's precision uses."""
    from ..specs.precision import RECIPES
    from ..units import TFLOPS

    gpu = problem.cluster.gpu
    peak = RECIPES[problem.training.precision].peak
    tflops = {"fp8": gpu.fp8_tflops, "fp4": gpu.fp4_tflops}.get(peak) or gpu.bf16_tflops
    return tflops * TFLOPS, (peak if peak in ("fp8", "fp4") else "bf16").upper()


def model_flops_per_step(problem) -> float:
    """Model FLOPs of one optimizer step (6ND plus attention, no recompute), as MFU counts them."""
    from ..cost.model_arch import build_arch

    tr = problem.training
    return float(tr.global_batch * build_arch(problem.model).model_flops_per_sequence(tr.seq_len))


def implied_mfu(problem, step_s: float) -> float:
    """Model FLOPs per step / (step x n_gpus x the precision's peak): 1 = every GPU at peak."""
    peak, _ = peak_flops(problem)
    return model_flops_per_step(problem) / (step_s * problem.cluster.n_gpus * peak)


def fastest_step_s(problem) -> float:
    """The step time at 100 % MFU of the precision's peak: no measurement can be below it."""
    peak, _ = peak_flops(problem)
    return model_flops_per_step(problem) / (problem.cluster.n_gpus * peak)


def least_state_bytes(problem, optimizer_offload: float = 0.0) -> float:
    """The fewest bytes of model state one GPU of `problem` can hold under any layout of its
    GPUs: every parameter's weight (2 bytes, the ledger's `params`; 1 where a low-precision recipe
    keeps only the quantised weight, `fp8_param_gather`) and its optimizer state
    (`TrainingSpec.optimizer_bytes`: 12 with fp32 master weights and moments, 4 with bf16 moments;
    less the share `optimizer_offload` keeps in host memory), sharded over every GPU of the job
    (ZeRO-3 across all of them, the most any layout shards). Gradients and activations can be
    freed, sharded or recomputed; these stay through the step. A measured peak below it is not
    this job's: another GPU count, an offload the row does not state, or a unit."""
    from ..cost.model_arch import build_arch

    tr = problem.training
    weight = 1.0 if tr.fp8_param_gather and tr.precision not in ("bf16", "fp16") else 2.0
    per_param = weight + tr.optimizer_bytes * (1.0 - optimizer_offload)
    return per_param * build_arch(problem.model).n_params / problem.cluster.n_gpus


def faster_than_peak(problem, measured: Sequence[tuple[str, float]]) -> list[str]:
    """One line (empty list when none) on the (label, step seconds) measurements faster than
    the peak allows: how many, the first three with their implied MFU, what to check."""
    floor = fastest_step_s(problem)
    _, name = peak_flops(problem)
    bad = [(label, t) for label, t in measured if t is not None and 0 < t < floor]
    if not bad:
        return []
    shown = ", ".join(f"{label} {t:.4g} s ({implied_mfu(problem, t):.0%} MFU)"
                      for label, t in bad[:3]) + (", ..." if len(bad) > 3 else "")
    return [f"{len(bad)} of {len(measured)} measurement(s) are faster than the {name} peak "
            f"allows (at least {floor:.4g} s per step for this job's model FLOPs): {shown}; "
            "not steps of this job: check the metric's unit (a group named ms for "
            "milliseconds), that one step covers the whole global batch on every GPU, and the "
            "GPU count"]


def pinned(values: dict[str, float], bounds: dict[str, tuple[float, float]]) -> list[str]:
    """Lines for the knobs of `values` within `PINNED_TOL` of a bound of `bounds`."""
    out = []
    for name, v in values.items():
        if name not in bounds:
            continue
        lo, hi = bounds[name]
        tol = PINNED_TOL * (hi - lo)
        side = "upper" if v >= hi - tol else "lower" if v <= lo + tol else None
        if side:
            bound = hi if side == "upper" else lo
            out.append(f"{name} = {v:.4g} is pinned at its {side} bound {bound:g}: the fit "
                       f"wanted it {'higher' if side == 'upper' else 'lower'}, so the "
                       "measurements are "
                       f"{'faster' if _faster(name, side) else 'slower'} than physical knobs "
                       "explain; check the measurements before using this profile")
    return out


def _faster(name: str, side: str) -> bool:
    """Whether a knob pinned at `side` means the runs were faster than the model allows (an
    efficiency or overlap at its top, an overhead or latency at zero)."""
    higher_is_faster = name.endswith(("efficiency", "overlap"))
    return (side == "upper") == higher_is_faster


def constant_ratio(pairs: Sequence[tuple[float, float]]) -> str | None:
    """A hint when measured / predicted is about the same far-from-1 factor for every layout
    ((measured, predicted) seconds pairs), else None."""
    ratios = [m / p for m, p in pairs if m and p and m > 0 and p > 0]
    if len(ratios) < RATIO_MIN_RUNS:
        return None
    lo, hi = min(ratios), max(ratios)
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    if hi / lo - 1 > RATIO_SPREAD or 1 / RATIO_FAR < geo < RATIO_FAR:
        return None
    slower = geo > 1
    hints = (["the metric's unit (seconds; a group named ms for milliseconds)",
              "that a step covers the whole global batch (not a micro-batch or one GPU's share)",
              "the GPU count and kind, their clocks and power limits",
              "logging, evaluation or checkpointing inside the timed step"]
             if slower else
             ["the metric's unit (seconds, not milliseconds)",
              "that the command runs the global batch and model asked for"])
    return (f"every measurement is about x{geo:.3g} the prediction (the {len(ratios)} ratios "
            f"span {lo:.3g}-{hi:.3g}): one factor for every layout points outside the layout; "
            f"check {'; '.join(hints)}")


def implausible(step_s: float, *, fastest_s: float, predicted_s: float | None) -> str | None:
    """Why `step_s` cannot be a measured step time, or None when it can (see the module
    docstring)."""
    if step_s is None or not isinstance(step_s, (int, float)) or math.isnan(step_s):
        return f"the step time read is not a number ({step_s!r})"
    if math.isinf(step_s):
        return f"the step time read is infinite ({step_s!r})"
    if step_s <= 0:
        return f"the step time read is {step_s:g} s; a step takes time"
    if fastest_s > 0 and step_s < fastest_s:
        return (f"{step_s:.4g} s per step is faster than the GPUs' peak allows "
                f"({fastest_s:.4g} s at 100 % MFU; MFU would be {fastest_s / step_s:.0%})")
    if predicted_s and step_s > MAX_OVER_PREDICTION * predicted_s:
        return (f"{step_s:.4g} s per step is {step_s / predicted_s:.3g} x the prediction "
                f"({predicted_s:.4g} s): a unit mix-up (milliseconds read as seconds?) or "
                "another number matched --metric-regex")
    return None


__all__ = ["MAX_OVER_PREDICTION", "constant_ratio", "faster_than_peak", "fastest_step_s",
           "implausible", "implied_mfu", "peak_flops", "pinned"]
