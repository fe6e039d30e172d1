"""Fit the scan kernel efficiency (`Profile.scan_efficiency`) on the measured hybrid runs, one
value per GPU (never per row or source), and print in-sample and held-out errors.

    python benchmarks/fit_scan_efficiency.py          # figures
    python benchmarks/fit_scan_efficiency.py --write  # also write the fits into the
                                                      # megatron-bridge and megatron-core presets

Held out: leave-one-source-out (each source's rows predicted with the knob fitted on the other
sources' rows of that GPU, or the default where no other source measured it), and
leave-one-GPU-out (each GPU's rows with the median of the other GPUs' fits), the figure for a
GPU the fit has not seen. The knob is a golden-section search on the median |log error|.

The knob is the scan's compute ceiling; its HBM traffic is a floor of its own (`cost.ssm_mixer.
scan_time`). Where a GPU's runs are explained by that floor (the fit does no better than the
default), no value is written for it and the default applies."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoparallel.evaluate import evaluate  # noqa: E402
from autoparallel.output.files import write_whole  # noqa: E402
from autoparallel.specs.hardware import Profile  # noqa: E402
from autoparallel.validation.calibrate import MOE_KNOBS  # noqa: E402
from autoparallel.validation.runs import load_cases, read_runs  # noqa: E402

LO, HI = 0.02, 1.0


def hybrid_cases():
    frame = read_runs(ROOT / "autoparallel" / "data" / "published_runs.csv")
    cases, skipped = load_cases(frame)
    return [c for c in cases if c.model.layers is not None], skipped


def predict(case, eff: float | None) -> float:
    p = case.problem()
    if eff is not None:
        p = case.problem(profile=p.profile.model_copy(update={"scan_efficiency": eff}))
    return float(evaluate(p, case.table()).time["step"][0])


def loss(cases, eff) -> float:
    return float(np.median([abs(np.log(predict(c, eff) / c.measured_step_s)) for c in cases]))


GRID = 17
"""Points of the coarse log-spaced scan over [LO, HI] before the golden-section refinement: the
median |log error| is not unimodal in the knob (with the memory floor, B300's runs have a flat
region above ~0.08 and their best value near 0.023), and golden-section search alone lands in
whichever basin its first two probes favour."""


def fit(cases) -> float:
    """The knob minimising the median |log error| over [LO, HI]: a log-spaced scan of `GRID`
    points, then a golden-section search between the best point's neighbours (log scale). Ties
    keep the largest knob (on a flat, memory-bound region: the default applies, see `main`)."""
    grid = np.linspace(np.log(LO), np.log(HI), GRID)
    losses = [loss(cases, np.exp(x)) for x in grid]
    best = min(range(GRID), key=lambda i: (losses[i], -i))
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, GRID - 1)]
    g = (np.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = loss(cases, np.exp(c)), loss(cases, np.exp(d))
    for _ in range(14):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = loss(cases, np.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = loss(cases, np.exp(d))
    x = float(np.exp((a + b) / 2))
    return x if loss(cases, x) <= losses[best] else float(np.exp(grid[best]))


def summary(errs) -> str:
    e = np.abs(np.asarray(errs))
    return f"n {len(e)}, median |err| {np.median(e):.1%}, p90 {np.quantile(e, 0.9):.1%}"


def with_scan_line(text: str, gpu: str, line: str) -> str:
    """A stack preset's `text` with `line` (a `scan_efficiency = ...` line, or "" for none) as
    the scan ceiling of its `[profile."<gpu>"]` table: after the header and the MoE knobs
    (`benchmarks/fit_moe.py`), where the other writers keep it; a scan line already there is
    replaced, not duplicated."""
    return re.sub(r'(\[profile\."' + re.escape(gpu) + r'"\]\n(?:(?:' + "|".join(MOE_KNOBS)
                  + r') = [^\n]*\n)*)(scan_efficiency = [^\n]*\n)?',
                  lambda m: m.group(1) + line, text, count=1)


def main(write: bool = False) -> dict:
    cases, skipped = hybrid_cases()
    by_gpu: dict[str, list] = {}
    for c in cases:
        by_gpu.setdefault(c.gpu, []).append(c)
    default = Profile().scan_efficiency
    fits = {g: fit(cs) for g, cs in sorted(by_gpu.items())}
    # memory-bound: the fitted ceiling changes nothing against the default's (flat loss)
    bound = {g for g, cs in by_gpu.items() if loss(cs, default) <= loss(cs, fits[g]) + 1e-9}
    print(f"hybrid runs scored: {len(cases)}")
    base = [predict(c, None) / c.measured_step_s - 1 for c in cases]
    print(f"before the fit (scan_efficiency as the stack/GPU has it): {summary(base)}")
    ins, loso, logo, fam = [], [], [], {}
    for g, cs in by_gpu.items():
        others = [fits[o] for o in fits if o != g]
        for c in cs:
            e_in = predict(c, fits[g]) / c.measured_step_s - 1
            rest = [x for x in cs if x.source != c.source]
            e_so = predict(c, fit(rest) if rest else default) / c.measured_step_s - 1
            e_go = predict(c, float(np.median(others)) if others else default) / c.measured_step_s - 1
            ins.append(e_in), loso.append(e_so), logo.append(e_go)
            family = re.sub(r"-\w+$", "", c.model.name) if "nemotron-3" not in c.model.name \
                else c.model.name
            fam.setdefault(family, []).append((e_in, e_so, e_go))
        note = " (memory-bound: not identified, the default applies)" if g in bound else ""
        print(f"  {g:6s} scan_efficiency {fits[g]:.3f} ({len(cs)} runs){note}")
    print(f"in sample: {summary(ins)}")
    print(f"leave-one-source-out: {summary(loso)}")
    print(f"leave-one-GPU-out: {summary(logo)}")
    for f, rows in fam.items():
        a = np.array(rows)
        print(f"  {f}: in sample {summary(a[:, 0])}; LOSO {summary(a[:, 1])}; "
              f"LOGO {summary(a[:, 2])}")
    if write:
        for stack in ("megatron-bridge", "megatron-core"):
            path = ROOT / "autoparallel" / "presets" / "stacks" / f"{stack}.toml"
            text = path.read_text()
            for g, v in fits.items():
                head = f'[profile."{g}"]\n'
                if head not in text:
                    continue
                line = "" if g in bound else f"scan_efficiency = {v:.4f}\n"
                text = with_scan_line(text, g, line)
            write_whole("--write", path, text)  # whole or not at all
            print(f"wrote {path.name}")
    return fits


if __name__ == "__main__":
    main(write="--write" in sys.argv)
