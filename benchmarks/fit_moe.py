"""Fit the MoE knobs across GPUs and report the MoE runs per model family: in sample, leave one
family out (the knobs refitted without the family, which is then predicted) and with the
knobs at their reference values (what a held-out source sees: no other source has MoE runs on
its stack). Prints the figures of docs/validation.md "Mixtures of experts".

The MoE knobs (`Profile.moe_host_overhead_us`, `grouped_gemm_expert_us`) are software
properties of a stack's MoE layer, not of a GPU, so one value per kernel family (the stacks that
run the same MoE code: megatron-core and megatron-bridge, both Megatron-Core's MoE layer;
`validation.calibrate.kernel_family`) is fitted over all its MoE runs, every GPU together, on
top of each GPU's dense knobs (the shipped per-(stack, GPU) profiles); `--write` puts the values
into every `[profile."<gpu>"]` table of each stack of the family.

    python benchmarks/fit_moe.py [--stack megatron-core] [--write]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel.cost.model_arch import build_arch  # noqa: E402
from autoparallel.cost.time import time_ledger  # noqa: E402
from autoparallel.data import PUBLISHED_RUNS  # noqa: E402
from autoparallel.output.files import write_whole  # noqa: E402
from autoparallel.presets import list_stacks  # noqa: E402
from autoparallel.validation.calibrate import KNOBS, MOE_KNOBS, kernel_family  # noqa: E402
from autoparallel.validation.runs import load_cases, read_runs  # noqa: E402

STACKS = Path(__file__).resolve().parents[1] / "autoparallel" / "presets" / "stacks"
FAMILIES = (("deepseek", r"deepseek"), ("qwen3-235b", r"235b"), ("qwen3-30b", r"30b"),
            ("gpt-oss", r"gpt[ _-]?oss"), ("kimi-k2", r"kimi"))


def family(name: str) -> str:
    low = name.lower()
    return next((f for f, pat in FAMILIES if re.search(pat, low)), low)


class Model:
    def __init__(self, cases):
        self.cases = cases
        self.items = [(c.problem(), build_arch(c.model), c.table()) for c in cases]
        self.log_meas = np.log([c.measured_step_s for c in cases])

    def log_pred(self, x, names=MOE_KNOBS, idx=None) -> np.ndarray:
        idx = range(len(self.items)) if idx is None else idx
        out = []
        for i in idx:
            p, arch, t = self.items[i]
            prof = p.profile.model_copy(update=dict(zip(names, map(float, x))))
            q = p.model_copy(update={"profile": prof})
            with np.errstate(divide="ignore", invalid="ignore"):
                out.append(np.log(time_ledger(q, arch, t)["step"][0]))
        return np.array(out)


def fit(model: Model, idx, x0, prior=1.0):
    lo = np.array([KNOBS[k][0] for k in MOE_KNOBS])
    hi = np.array([KNOBS[k][1] for k in MOE_KNOBS])
    width = np.array([KNOBS[k][2] for k in MOE_KNOBS])
    centre = np.array(x0, dtype=float)

    def res(x):
        r = model.log_pred(x, idx=idx) - model.log_meas[idx]
        return np.concatenate([np.where(np.isfinite(r), r, 10.0), prior * (x - centre) / width])

    sol = least_squares(res, centre, bounds=(lo, hi), loss="soft_l1", f_scale=0.1,
                        x_scale=width, diff_step=1e-3, max_nfev=100)
    return sol.x


def report(label, err, fams):
    a = np.abs(err)
    rows = [f"{label}: {len(err)} runs, median |err| {np.median(a):.1%}, p90 "
            f"{np.quantile(a, 0.9):.1%}, bias {np.median(err):+.1%}, max {a.max():.1%}"]
    for f in sorted(set(fams)):
        m = np.array([x == f for x in fams])
        rows.append(f"  {f:12s} {m.sum():3d} runs  median |err| {np.median(a[m]):6.1%}  "
                    f"p90 {np.quantile(a[m], 0.9):6.1%}  bias {np.median(err[m]):+6.1%}")
    print("\n".join(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", default="megatron-core")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    cases, _ = load_cases(read_runs(PUBLISHED_RUNS))
    members = sorted(s for s in list_stacks() if kernel_family(s) == kernel_family(args.stack))
    cases = [c for c in cases if c.model.moe is not None and c.stack in members]
    model = Model(cases)
    fams = [family(c.model.name) for c in cases]
    ref = model.items[0][0].profile.__class__()  # Profile defaults: the reference values
    x_ref = [getattr(ref, k) for k in MOE_KNOBS]
    every = np.arange(len(cases))
    x_all = fit(model, every, x_ref)
    by_stack = ", ".join(f"{sum(c.stack == m for c in cases)} {m}" for m in members)
    print(f"{len(cases)} MoE runs of kernel family {kernel_family(args.stack)} ({by_stack}); fitted "
          + ", ".join(f"{k} = {v:.4g}" for k, v in zip(MOE_KNOBS, x_all)))
    report("in sample", np.expm1(model.log_pred(x_all) - model.log_meas), fams)
    held = np.empty(len(cases))
    for f in sorted(set(fams)):
        test = np.array([i for i, x in enumerate(fams) if x == f])
        train = np.array([i for i, x in enumerate(fams) if x != f])
        x = fit(model, train, x_ref) if len(train) else np.array(x_ref)
        held[test] = model.log_pred(x, idx=test) - model.log_meas[test]
    report("leave one family out", np.expm1(held), fams)
    report("reference MoE knobs (no MoE run seen)", np.expm1(model.log_pred(x_ref) - model.log_meas),
           fams)
    for stack in members if args.write else ():
        path = STACKS / f"{stack}.toml"
        text = path.read_text(encoding="utf-8")
        for k, v in zip(MOE_KNOBS, x_all):
            text = re.sub(rf"^{k} = .*\n", "", text, flags=re.M)
        note = "  # fitted across GPUs on the stack's MoE runs (benchmarks/fit_moe.py)"
        lines = "".join(f"{k} = {v:.4g}{note}\n" for k, v in zip(MOE_KNOBS, x_all))
        text = re.sub(r'(\[profile\."[^"]+"\]\n)', lambda m: m.group(1) + lines, text)
        write_whole("--write", path, text)  # whole or not at all
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
