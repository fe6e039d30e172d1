"""Profiles from files, and leave-one-source-out (LOSO) predictions.

LOSO: for each GPU group (one chip, possibly in several memory sizes, e.g. A100 40GB + 80GB) and
each source with runs on it, the knobs are fitted on every *other* source's runs of that group
and the held-out source is predicted with them. The errors so obtained say how the model does
on runs it has not seen, which is what the shipped profiles are for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from ..errors import SpecError
from ..presets import list_gpus, load_gpu, load_profile, read_table
from ..specs.hardware import Profile
from .calibrate import DEFAULT_KNOBS, fit
from .report import predict
from .runs import RunCase

GPU_GROUPS: dict[str, tuple[str, ...]] = {"a100-40gb": ("a100-40gb", "a100-80gb"),
                                          "a100-80gb": ("a100-40gb", "a100-80gb")}
"""Presets that share one chip (same SMs, clocks, NVLink and NICs; only HBM differs), so one
set of efficiency knobs is fitted to their runs together."""


def group_of(gpu: str) -> tuple[str, ...]:
    """The presets calibrated together with `gpu`."""
    return GPU_GROUPS.get(gpu, (gpu,))


def profiles_from_files(paths: Sequence[str | Path]) -> dict:
    """GPU preset (or (stack, GPU preset)) -> profile, from calibrated profile files. A file with
    a `gpu` key (a name or a list) applies to that GPU group; a file without one applies to every
    GPU; a file with a `stack` key only to that stack's runs. Knobs a file does not set keep the
    GPU preset's values."""
    out: dict = {}
    for path in paths:
        data = read_table(Path(path))
        gpus = data.get("gpu")
        if gpus is None:
            targets = list_gpus()
        else:
            names = [gpus] if isinstance(gpus, str) else list(gpus)
            targets = sorted({g for n in names for g in group_of(load_gpu(str(n)).name)})
        stack = data.get("stack")
        for g in targets:
            out[(stack, g) if stack else g] = load_profile(path, base=load_gpu(g).default_profile())
    return out


def fit_group(cases: Sequence[RunCase], gpus: Sequence[str], knobs=DEFAULT_KNOBS,
              stack: str | None = None, **kw):
    """Fit one profile to the runs of `gpus` (of one `stack`, or of every stack), starting from
    (and pulled towards) the first preset's reference (uncalibrated) profile."""
    chosen = [c for c in cases if c.gpu in gpus and (stack is None or c.stack == stack)]
    if not chosen:
        on = f" of stack {stack}" if stack else ""
        raise SpecError(f"no usable runs{on} on {', '.join(gpus)} to calibrate on")
    return fit(chosen, load_gpu(gpus[0]).reference(), knobs=knobs, **kw), chosen


def loso_predictions(cases: Sequence[RunCase], gpus: Sequence[str] | None = None,
                     knobs=DEFAULT_KNOBS, **kw) -> tuple[pd.DataFrame, dict]:
    """Held-out predictions of every case on `gpus` (default: every GPU group with runs), plus the
    knobs fitted per (group, held-out source, stack).

    For each GPU group and each source, the held-out source's runs of each stack are predicted by
    the profile the shipped presets would give them, rebuilt without that source: a fit to the
    *other* sources' runs of the same stack on the group (column `heldout_fit` = "stack"); where
    the stack has no other source there, a fit to every other source's runs on the group, all
    stacks together ("gpu"); where the group has no other source, the preset's reference
    (literature) profile ("reference"). Every fit starts from the reference profile, never from a
    shipped, already-calibrated one."""
    gpus = list(gpus) if gpus else sorted({c.gpu for c in cases})
    groups = sorted({group_of(g) for g in gpus})
    frames, fitted = [], {}
    for grp in groups:
        chosen = [c for c in cases if c.gpu in grp and c.gpu in gpus]
        reference = load_gpu(grp[0]).reference()
        for src in sorted({c.source for c in chosen}):
            rest = [c for c in chosen if c.source != src]
            gpu_fit = None
            for stack in sorted({c.stack for c in chosen if c.source == src}):
                held = [c for c in chosen if c.source == src and c.stack == stack]
                same = [c for c in rest if c.stack == stack]
                if same:
                    res = fit(same, reference, knobs=knobs, **kw)
                    basis = "stack"
                elif rest:
                    gpu_fit = gpu_fit or fit(rest, reference, knobs=knobs, **kw)
                    res, basis = gpu_fit, "gpu"
                else:
                    res, basis = None, "reference"
                prof = res.profile if res else reference
                if res:
                    fitted[(grp[0], src, stack)] = res.knobs
                profiles: Mapping = {(stack, g): prof for g in grp}
                frame = predict(held, profiles)
                frame["heldout_fit"] = basis
                frames.append(frame)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), fitted
