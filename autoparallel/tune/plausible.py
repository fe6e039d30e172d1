"""Which measured step times are measurements at all.

A step time read from a job's output becomes a trial result only when it could be one. It is
implausible (the trial FAILs with reason `implausible`, the number is kept in its detail) when:

- it is not a finite number (`nan`, `inf`), zero or negative;
- it is faster than the GPUs' peak allows: the model FLOPs of one step
  (`Arch.model_flops_per_sequence`, Megatron's causal convention, the least any layout computes;
  recomputation only adds) over every GPU of the job at the tensor-core peak of the job's
  precision (FP8 / FP4 peak for those recipes, else BF16), i.e. an MFU above 100 %;
- it exceeds the prediction `MAX_OVER_PREDICTION` times: far beyond the cost model's errors
  (validation p90 is a few tens of percent, docs/validation.md), it is a unit mix-up (a
  millisecond count read as seconds) or the regex caught another number.
"""

from __future__ import annotations

import math

from ..specs.problem import Problem

MAX_OVER_PREDICTION = 100.0
"""A measured step more than this many times the predicted one is not taken as a measurement."""


def fastest_possible_s(problem: Problem) -> float:
    """The least time one training step can take: model FLOPs per step over the job's GPUs at
    their peak (MFU = 100 %), seconds (`validation.plausible.fastest_step_s`, the floor
    `calibrate` and the warnings use too)."""
    from ..validation.plausible import fastest_step_s

    return fastest_step_s(problem)


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
