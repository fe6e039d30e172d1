"""Fit the shipped efficiency profiles: one per (software stack, GPU group) with runs (stacks of
one kernel family, `StackSpec.kernels`, fitted together), and one per
GPU group across every stack (the GPU preset's `[profile]`, the fallback for a stack that has no
runs anywhere). Prints the TOML blocks to paste into `autoparallel/presets/stacks/<stack>.toml`
(`[profile.<gpu>]`, `[profile_notes]`) and `autoparallel/presets/gpus/<gpu>.toml` (`[profile]`),
with the in-sample error of each fit. Every fit starts from the GPU preset's reference
(literature) profile, its attention knobs at what training keeps of the kernel benchmarks
(`attention_prior.derated`). Benchmarks print figures; nothing here is asserted.

    python benchmarks/calibrate_stacks.py [--runs FILE] [--write]

`--write` replaces the fitted-profile tables at the end of each stack preset (everything after
the `MARKER` line) with the new fits, for every GPU preset of the fitted group, and drops the
tables of a stack no longer fitted on any GPU. Fits use the dense runs
(`validation.calibrate.profile_fit_cases`); a (stack, GPU group) without one has no fit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel.data import PUBLISHED_RUNS  # noqa: E402
from autoparallel.output.files import write_whole  # noqa: E402
from autoparallel.presets import list_stacks, load_gpu  # noqa: E402
from autoparallel.attention_prior import derated  # noqa: E402
from autoparallel.validation.calibrate import (  # noqa: E402
    MOE_KNOBS, fit, kernel_family, profile_fit_cases)
from autoparallel.validation.loso import group_of  # noqa: E402
from autoparallel.validation.runs import load_cases, read_runs  # noqa: E402


MARKER = "# ---- fitted profiles (benchmarks/calibrate_stacks.py --write) ----"
STACKS = Path(__file__).resolve().parents[1] / "autoparallel" / "presets" / "stacks"


def _write(stack: str, tables: list[str]) -> None:
    path = STACKS / f"{stack}.toml"
    text = path.read_text(encoding="utf-8").split(MARKER)[0].rstrip() + "\n\n"
    # whole or not at all: a kill or a full disk leaves the shipped file as it was
    write_whole("--write", path, text + MARKER + "\n" + "\n".join(tables))


def moe_knobs(stack: str) -> dict[str, float]:
    """The stack's cross-GPU MoE knobs as its preset has them (any GPU table; all agree)."""
    from autoparallel.presets import load_stack

    out: dict[str, float] = {}
    for knobs in load_stack(stack).profile.values():
        out |= {k: v for k, v in knobs.items() if k in MOE_KNOBS}
    return out


def _kept_lines(stack: str, gpu: str) -> list[str]:
    """What other fits wrote into the stack's table for `gpu`, which the dense fits leave alone:
    the MoE knobs (cross-GPU, `benchmarks/fit_moe.py`) and the GPU's recurrent-scan ceiling
    (`benchmarks/fit_scan_efficiency.py`), as the preset has them."""
    from autoparallel.presets import load_stack

    lines = [f"{k} = {v:.4g}  # fitted across GPUs on the stack's MoE runs (benchmarks/fit_moe.py)"
             for k, v in moe_knobs(stack).items()]
    scan = load_stack(stack).profile.get(gpu, {}).get("scan_efficiency")
    # in the order the other writers keep: the MoE knobs first, then the scan ceiling
    return lines + ([f"scan_efficiency = {scan:.4f}"] if scan is not None else [])


def _extends_member(stack: str, members: list[str]) -> bool:
    """Whether the stack preset `extends` another stack of its kernel family, whose fitted
    tables it then inherits (`presets._extended`) instead of carrying a copy."""
    import tomllib

    raw = tomllib.loads((STACKS / f"{stack}.toml").read_text(encoding="utf-8"))
    return raw.get("extends") in members


def _block(res) -> list[str]:
    lines = []
    for k, v in res.knobs.items():
        note = f"+-{res.std[k]:.2g}" if res.identified(k) else "not identified: near reference"
        lines.append(f"{k} = {v:.4g}  # {note}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(PUBLISHED_RUNS))
    ap.add_argument("--write", action="store_true", help="write the fits into the stack presets")
    args = ap.parse_args()
    tables: dict[str, list[str]] = {}
    notes: dict[str, list[str]] = {}
    t0 = time.time()
    cases, skipped = load_cases(read_runs(args.runs))
    pool = profile_fit_cases(cases)
    groups = sorted({group_of(c.gpu) for c in pool})
    print(f"{len(cases)} usable runs, {len(skipped)} skipped; profiles fitted on the "
          f"{len(pool)} dense runs\n")
    for grp in groups:
        chosen = [c for c in pool if c.gpu in grp]
        ref = derated(load_gpu(grp[0]).reference())  # attention at what training keeps
        res = fit(chosen, ref)
        err = np.median(np.abs(np.expm1(res.residuals)))
        srcs = sorted({c.source for c in chosen})
        print(f"# GPU {'+'.join(grp)}: every stack, {len(chosen)} runs ({', '.join(srcs)}); "
              f"in-sample median |err| {err:.1%}")
        print("[profile]")
        print("\n".join(_block(res)), "\n")
        for family in sorted({kernel_family(c.stack) for c in chosen}):
            mine = [c for c in chosen if kernel_family(c.stack) == family]
            members = sorted(s for s in list_stacks() if kernel_family(s) == family)
            res = fit(mine, ref)
            err = np.median(np.abs(np.expm1(res.residuals)))
            srcs = sorted({c.source for c in mine})
            precs = sorted({c.precision for c in mine})
            stacks = sorted({c.stack for c in mine})
            print(f"# {family} ({', '.join(members)}) on {grp[0]}: {len(mine)} runs of "
                  f"{', '.join(stacks)} ({', '.join(srcs)}; {', '.join(precs)}); in-sample median "
                  f"|err| {err:.1%}")
            note = (f"fitted on {len(mine)} runs ({', '.join(precs)}) of {', '.join(srcs)}"
                    + (f" (kernel family {family}: {', '.join(stacks)})" if len(members) > 1
                       else "") + f"; in-sample median |err| {err:.1%}")
            for g in grp:
                print("\n".join([f'[profile."{g}"]', *_block(res), ""]))
                for stack in members:
                    if _extends_member(stack, members):
                        continue  # inherits the tables of the member it extends
                    tables.setdefault(stack, []).extend(
                        [f'[profile."{g}"]', *_kept_lines(stack, g), *_block(res), ""])
                    notes.setdefault(stack, []).append(f'"{g}" = "{note}"')
    print(f"({time.time() - t0:.0f} s)")
    if args.write:
        for path in sorted(STACKS.glob("*.toml")):
            stack = path.stem
            if stack in tables:
                _write(stack, tables[stack] + ["[profile_notes]", *notes[stack], ""])
            elif MARKER in path.read_text(encoding="utf-8"):
                _write(stack, [])
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
