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


def profiles_from_files(paths: Sequence[str | Path]) -> dict[str, Profile]:
    """GPU preset -> profile, from calibrated profile files. A file with a `gpu` key (a name or a
    list) applies to that GPU group; a file without one applies to every GPU. Knobs a file does
    not set keep the GPU preset's values."""
    out: dict[str, Profile] = {}
    for path in paths:
        data = read_table(Path(path))
        gpus = data.get("gpu")
        if gpus is None:
            targets = list_gpus()
        else:
            names = [gpus] if isinstance(gpus, str) else list(gpus)
            targets = sorted({g for n in names for g in group_of(load_gpu(str(n)).name)})
        for g in targets:
            out[g] = load_profile(path, base=load_gpu(g).default_profile())
    return out


def fit_group(cases: Sequence[RunCase], gpus: Sequence[str], knobs=DEFAULT_KNOBS, **kw):
    """Fit one profile to the runs of `gpus`, starting from (and pulled towards) the first
    preset's reference (uncalibrated) profile."""
    chosen = [c for c in cases if c.gpu in gpus]
    if not chosen:
        raise SpecError(f"no usable runs on {', '.join(gpus)} to calibrate on")
    return fit(chosen, load_gpu(gpus[0]).reference(), knobs=knobs, **kw), chosen


def loso_predictions(cases: Sequence[RunCase], gpus: Sequence[str] | None = None,
                     knobs=DEFAULT_KNOBS, **kw) -> tuple[pd.DataFrame, dict]:
    """Held-out predictions of every case on `gpus` (default: every GPU group with runs), plus the
    knobs fitted per (group, held-out source), each starting from the preset's reference
    (uncalibrated) profile. A source that is the group's only one is predicted with that
    reference profile (column `heldout_fit` = False)."""
    gpus = list(gpus) if gpus else sorted({c.gpu for c in cases})
    groups = sorted({group_of(g) for g in gpus})
    frames, fitted = [], {}
    for grp in groups:
        chosen = [c for c in cases if c.gpu in grp and c.gpu in gpus]
        for src in sorted({c.source for c in chosen}):
            held = [c for c in chosen if c.source == src]
            rest = [c for c in chosen if c.source != src]
            if rest:
                res = fit(rest, load_gpu(grp[0]).reference(), knobs=knobs, **kw)
                profiles: Mapping[str, Profile] = {g: res.profile for g in grp}
                fitted[(grp[0], src)] = res.knobs
            else:
                profiles = {g: load_gpu(g).reference() for g in grp}
            frame = predict(held, profiles)
            frame["heldout_fit"] = bool(rest)
            frames.append(frame)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), fitted
