"""Profiles from files, and leave-one-source-out (LOSO) predictions.

LOSO: for each GPU group (one chip, possibly in several memory sizes, e.g. A100 40GB + 80GB) and
each source with runs on it, the knobs are fitted on every *other* source's runs of that group
and the held-out source is predicted with them. The errors so obtained say how the model does
on runs it has not seen, which is what the shipped profiles are for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..errors import SpecError
from ..presets import list_gpus, load_gpu, load_profile, read_table
from ..problem import gpu_nearness
from ..attention_prior import derated
from .calibrate import DEFAULT_KNOBS, fit, kernel_family, profile_fit_cases
from .report import predict
from .runs import RunCase

_CHIPS = (("a100-40gb", "a100-80gb"), ("b200", "gb200"), ("b300", "gb300"))
GPU_GROUPS: dict[str, tuple[str, ...]] = {g: chip for chip in _CHIPS for g in chip}
"""Presets that share one chip, so one set of efficiency knobs is fitted to their runs together:
A100 40GB and 80GB (only HBM differs); B200 and GB200, B300 and GB300 (the HGX part and the Grace
superchip's of one Blackwell / Blackwell Ultra GPU: same SMs, NVLink 5 and HBM; the superchip's
higher TDP and clocks are in its BF16/FP8/FP4 peaks, and the knobs are fractions of those)."""


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
    (and pulled towards) the first preset's reference (uncalibrated) profile, its attention
    knobs at what training keeps of the kernel benchmarks (`attention_prior.derated`)."""
    chosen = [c for c in cases if c.gpu in gpus and (stack is None or c.stack == stack)]
    if not chosen:
        on = f" of stack {stack}" if stack else ""
        raise SpecError(f"no usable runs{on} on {', '.join(gpus)} to calibrate on")
    return fit(chosen, derated(load_gpu(gpus[0]).reference()), knobs=knobs, **kw), chosen




def _nearest_group(target: tuple[str, ...], candidates) -> tuple[str, ...]:
    """The candidate GPU group nearest to `target`, as the shipped profiles resolve it
    (`problem.gpu_nearness`)."""
    gpu = load_gpu(target[0])
    return min(candidates, key=lambda g: gpu_nearness(gpu, load_gpu(g[0])))


def loso_predictions(cases: Sequence[RunCase], gpus: Sequence[str] | None = None,
                     knobs=DEFAULT_KNOBS, **kw) -> tuple[pd.DataFrame, dict]:
    """Held-out predictions of every case on `gpus` (default: every GPU with runs), plus the knobs
    of every fit made, keyed by (GPU group, held-out source, stack).

    Each source's runs are predicted by the profile the shipped presets would give them, rebuilt
    without that source (column `heldout_fit`), from the dense runs of the other sources
    (`calibrate.profile_fit_cases`):
    1. "stack": the same stack (its kernel family, `StackSpec.kernels`) fitted on the *other*
       sources' runs on this GPU group;
    2. "stack@<gpu>": else the same stack fitted on the other sources' runs of the nearest GPU
       group with such runs (its software knobs carried over as fractions of this GPU's peaks,
       as `problem.stack_profile` does for a GPU a stack has no runs on);
    3. "gpu": else every stack's other sources' runs on this GPU group, fitted together;
    4. "reference": else the GPU preset's reference (literature) profile.
    Every fit starts from the reference profile of the GPU it is fitted on, never from a shipped,
    already-calibrated one, its attention knobs derated by what the *other* sources' long-sequence
    runs keep of the kernel benchmarks (`attention_prior.kept(exclude=source)`)."""
    from ..specs.stack import STACK_KNOBS

    gpus = list(gpus) if gpus else sorted({c.gpu for c in cases})
    target_groups = sorted({group_of(g) for g in gpus})
    cache: dict = {}

    def fit_of(subset, grp, key, held_out):
        if key not in cache:
            base = derated(load_gpu(grp[0]).reference(), exclude=held_out)
            cache[key] = fit(subset, base, knobs=knobs, **kw)
        return cache[key]

    pool = profile_fit_cases(cases)  # what a shipped profile is fitted on (dense runs)
    frames, fitted = [], {}
    for grp in target_groups:
        chosen = [c for c in cases if c.gpu in grp and c.gpu in gpus]
        for src in sorted({c.source for c in chosen}):
            # the attention prior without the held-out source's long-sequence measurement
            reference = derated(load_gpu(grp[0]).reference(), exclude=src)
            rest = [c for c in pool if c.source != src]
            for stack in sorted({c.stack for c in chosen if c.source == src}):
                held = [c for c in chosen if c.source == src and c.stack == stack]
                family = kernel_family(stack)  # stacks fitted together (StackSpec.kernels)
                same = [c for c in rest if kernel_family(c.stack) == family and c.gpu in grp]
                mine_by = {}
                for c in rest:
                    if kernel_family(c.stack) == family:
                        mine_by.setdefault(group_of(c.gpu), []).append(c)
                others = set(mine_by) - {grp}
                rest_here = [c for c in rest if c.gpu in grp]
                if same:
                    res = fit_of(same, grp, ("stack", grp, src, family), src)
                    prof, basis = res.profile, "stack"
                elif others:
                    near = _nearest_group(grp, others)
                    mine = mine_by[near]
                    res = fit_of(mine, near, ("stack", near, src, family), src)
                    update = {k: v for k, v in res.knobs.items() if k in STACK_KNOBS}
                    prof, basis = reference.model_copy(update=update), f"stack@{near[0]}"
                elif rest_here:
                    res = fit_of(rest_here, grp, ("gpu", grp, src), src)
                    prof, basis = res.profile, "gpu"
                else:
                    res, prof, basis = None, reference, "reference"
                if res is not None:
                    fitted[(grp[0], src, stack)] = res.knobs
                frame = predict(held, {(stack, g): prof for g in grp})
                frame["heldout_fit"] = basis
                frames.append(frame)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), fitted
