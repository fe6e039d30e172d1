"""Regret of `plan` against the tuned recipes experts publish (Megatron-Bridge / NeMo DGX-Cloud
performance tables in the shipped runs).

For every such recipe (a measured run: model, GPUs, batch, precision and the layout NVIDIA tuned),
plan the same problem and report:

- the recipe's **rank** among the layouts `plan` finds fitting (`-` when the cost model says the
  recipe does not fit), and whether it is in the top 1 % or the top 10;
- **optimism** = predicted step of plan's #1 / measured step of the recipe - 1: negative when the
  planner promises a layout faster than what the experts measured. Part of it is the model's
  error on this stack and GPU, part the winner's curse: the #1 of thousands of noisy estimates is
  the one the model underestimated most;
- the same with the winner's curse corrected two ways: **shrunk**, #1's prediction divided by
  exp(p50) of the leave-one-source-out residuals ln(predicted / measured) of its stack and GPU
  (`autoparallel/data/error_bands.csv`, the band's median: the stack's typical error removed);
  **upper**, the layouts ranked by their band's upper edge (`time_s.step_high`, p90 of the
  measured time) and that edge taken as the claim;
- the recipe's own prediction error (its predicted / measured step - 1).

Prints the table and the median optimism of each kind; benchmarks print figures, nothing is
asserted. The stack is the row's (Megatron-Bridge and NeMo rows map to `megatron-core`) unless
`--stack` names another; every job setting (`JobSpec`) can be overridden for all rows, e.g.

    python benchmarks/regret.py                                   # megatron-core, as mapped
    python benchmarks/regret.py --grad-dtype bf16 --tp-comm-overlap   # NeMo perf-recipe settings
    python benchmarks/regret.py --stack megatron-bridge           # once that preset exists
    python benchmarks/regret.py --gpus h100 --limit 5 --output regret.csv
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel.bands import find_row  # noqa: E402
from autoparallel.data import PUBLISHED_RUNS  # noqa: E402
from autoparallel.errors import AutoParallelError  # noqa: E402
from autoparallel.evaluate import evaluate  # noqa: E402
from autoparallel.layouts import LayoutTable  # noqa: E402
from autoparallel.problem import make_problem  # noqa: E402
from autoparallel.search.plan import plan  # noqa: E402
from autoparallel.specs.job import JobSpec  # noqa: E402
from autoparallel.specs.layout import Layout  # noqa: E402
from autoparallel.validation.runs import (  # noqa: E402
    RULES, _least_recompute_that_fits, load_cases, read_runs)

RECIPE_SOURCES = ("megatron_bridge_perf", "nemo_perf_2407")
"""Sources whose rows are expert-tuned performance recipes (published_runs README)."""
OVERRIDABLE = tuple(f for f in JobSpec.model_fields if f not in ("stack", "precision"))
"""Job settings `--<field>` may set for every row (the precision stays the row's)."""


def _job_options(ap: argparse.ArgumentParser) -> None:
    """One option per `JobSpec` field, named as the CLI names it (`--grad-dtype`, ...)."""
    for name in OVERRIDABLE:
        field = JobSpec.model_fields[name]
        flag = (field.json_schema_extra or {}).get("cli", "--" + name.replace("_", "-"))
        first = flag.split("/")[0]
        if "bool" in str(field.annotation):
            ap.add_argument(first, dest=name, action=argparse.BooleanOptionalAction,
                            default=None, help=f"override {name} for every row")
        else:
            ap.add_argument(first, dest=name, default=None, help=f"override {name} for every row")


def recipe_problem(case, stack: str | None, overrides: dict):
    """The recipe's problem with its stated job settings, `stack` and `overrides` over them."""
    job = dict(case.job) | ({"stack": stack} if stack else {}) | overrides
    return make_problem(case.model, case.gpu, case.n_gpus, case.seq_len, case.global_batch,
                        gpus_per_node=case.gpus_per_node, **job)


def recipe_layout(case, problem):
    """The recipe's layout; where the row leaves recompute open (Megatron-Bridge tables do), the
    least recompute (none, selective, full) that `plan`'s own fit rule accepts, so the recipe is
    ranked as the planner could have proposed it; when none does, the least that fits the GPU's
    memory, as validation infers it (the run ran), which `plan` then reports as not fitting."""
    lay = case.layout
    if not any(a.startswith("recompute not stated") for a in case.assumptions):
        return lay
    fields = lay.model_dump(exclude={"recompute", "recompute_layers", "recompute_group",
                                     "recompute_modules"})
    options = [Layout(**fields, recompute=r) for r in ("none", "selective", "full")]
    ev = evaluate(problem, LayoutTable.from_layouts(options, case.n_gpus, case.model.n_layers),
                  RULES)
    fitting = np.flatnonzero(ev.fits)
    if len(fitting):
        return options[int(fitting[0])]
    return Layout(**fields, recompute=_least_recompute_that_fits(problem, fields))


def _p50(problem, regime: str) -> float:
    """Median ln(predicted / measured) of the stack's runs on this GPU (error_bands.csv)."""
    _, row = find_row("step", problem.training.stack, problem.cluster.gpu.name, regime)
    return row.p50 if row is not None else 0.0


def regret_row(case, stack: str | None, overrides: dict, top_share: float) -> dict:
    """One recipe against `plan` on its problem (module docstring)."""
    problem = recipe_problem(case, stack, overrides)
    layout = recipe_layout(case, problem)
    res = plan(problem, top=1, keep=0)
    # the recipe ran: the rules it disproves for itself are relaxed, as in validation
    ev = evaluate(problem, LayoutTable.from_layouts([layout], case.n_gpus, case.model.n_layers),
                  RULES)
    rec_step = float(ev.time["step"][0])
    fits = bool(ev.fits[0])
    steps = res.survivors.time["step"] if res.survivors is not None else np.zeros(0)
    n_fit = int(len(steps))
    rank = int(np.count_nonzero(steps < rec_step * (1 - 1e-9))) + 1 if fits else None
    out = {
        "row_id": case.row_id, "source": case.source, "model": case.model.name, "gpu": case.gpu,
        "n_gpus": case.n_gpus, "precision": case.precision, "stack": problem.training.stack,
        "recipe": layout.resolved(case.n_gpus).slug, "measured_s": case.measured_step_s,
        "recipe_pred_s": rec_step, "recipe_err": rec_step / case.measured_step_s - 1.0,
        "recipe_fits": fits, "rank": rank, "n_fit": n_fit,
        "top": bool(rank is not None and (rank <= 10 or rank <= math.ceil(top_share * n_fit))),
    }
    if not n_fit:
        return out | {"best": "-", "best_s": np.nan, "optimism": np.nan, "optimism_shrunk": np.nan,
                      "optimism_upper": np.nan}
    best = res.ranked
    best_s = float(best.time["step"][0])
    regime = str(best.bands().regime[0])
    shrunk = best_s / math.exp(_p50(problem, regime))
    upper = float(np.min(res.band_high))
    return out | {
        "best": best.table.row(0).slug, "best_s": best_s,
        "optimism": best_s / case.measured_step_s - 1.0,
        "optimism_shrunk": shrunk / case.measured_step_s - 1.0,
        "optimism_upper": upper / case.measured_step_s - 1.0,
    }


_MOE: set[str] = set()
"""Model names of the MoE recipes seen (filled as rows are scored)."""


def _is_moe(name: str) -> bool:
    return name in _MOE


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(PUBLISHED_RUNS), help="runs CSV (default: the shipped one)")
    ap.add_argument("--sources", default=",".join(RECIPE_SOURCES),
                    help="source keys of the tuned recipes")
    ap.add_argument("--gpus", default=None, help="only these GPU presets (comma-separated)")
    ap.add_argument("--dense", action="store_true", help="dense models only")
    ap.add_argument("--stack", default=None, help="stack preset for every row (default: the row's)")
    ap.add_argument("--top-share", type=float, default=0.01,
                    help="a recipe ranks 'top' within this share of the fitting layouts (or 10)")
    ap.add_argument("--limit", type=int, default=None, help="first N recipes only")
    ap.add_argument("--output", default=None, help="write the table to this CSV")
    _job_options(ap)
    args = ap.parse_args()
    overrides = {k: getattr(args, k) for k in OVERRIDABLE if getattr(args, k) is not None}
    sources = {s.strip() for s in args.sources.split(",") if s.strip()}
    gpus = {g.strip() for g in args.gpus.split(",")} if args.gpus else None

    t0 = time.time()
    cases, _ = load_cases(read_runs(args.runs))
    cases = [c for c in cases if c.source in sources and (gpus is None or c.gpu in gpus)
             and not (args.dense and c.model.moe is not None)]
    cases = cases[: args.limit] if args.limit else cases
    rows = []
    for case in cases:
        if case.model.moe is not None:
            _MOE.add(case.model.name)
        try:
            rows.append(regret_row(case, args.stack, overrides, args.top_share))
        except AutoParallelError as exc:
            rows.append({"row_id": case.row_id, "source": case.source, "model": case.model.name,
                         "gpu": case.gpu, "error": str(exc).splitlines()[0][:100]})
    frame = pd.DataFrame(rows)
    label = args.stack or "the rows' stacks"
    print(f"{len(frame)} tuned recipes ({', '.join(sorted(sources))}), stack {label}"
          + (f", overrides {overrides}" if overrides else "") + f"; {time.time() - t0:.0f} s\n")
    show = frame.copy()
    for col in ("recipe_err", "optimism", "optimism_shrunk", "optimism_upper"):
        if col in show:
            show[col] = show[col].map(lambda v: "-" if pd.isna(v) else f"{v:+.1%}")
    for col in ("measured_s", "recipe_pred_s", "best_s"):
        if col in show:
            show[col] = show[col].map(lambda v: "-" if pd.isna(v) else f"{v:.3g}")
    if "rank" in show:
        show["rank"] = [("-" if pd.isna(r) else f"{int(r)}/{int(n)}")
                        for r, n in zip(show["rank"], show["n_fit"])]
    cols = [c for c in ("row_id", "model", "gpu", "n_gpus", "precision", "recipe", "measured_s",
                        "recipe_pred_s", "recipe_err", "rank", "top", "best", "best_s",
                        "optimism", "optimism_shrunk", "optimism_upper", "error") if c in show]
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 48)
    print(show[cols].to_string(index=False), "\n")
    ok = frame.dropna(subset=["optimism"]) if "optimism" in frame else frame.iloc[0:0]
    fit = int(frame.get("recipe_fits", pd.Series(dtype=bool)).fillna(False).sum())
    top = int(frame.get("top", pd.Series(dtype=bool)).fillna(False).sum())
    print(f"recipes predicted to fit: {fit} of {len(frame)}; in the top "
          f"{args.top_share:.0%} (or top 10) of plan: {top} of {len(frame)}")
    for col, what in (("optimism", "plan's #1 as predicted"),
                      ("optimism_shrunk", "#1 shrunk by the stack's median residual"),
                      ("optimism_upper", "#1 by the band's upper edge")):
        if len(ok):
            print(f"median optimism, {what}: {ok[col].median():+.1%} "
                  f"(p10 {ok[col].quantile(0.1):+.1%}, p90 {ok[col].quantile(0.9):+.1%}; "
                  f"{len(ok)} recipes)")
    if len(ok):
        print(f"median recipe error (its predicted / measured - 1): {ok['recipe_err'].median():+.1%}")
        ok = ok.assign(kind=np.where(ok["model"].map(_is_moe), "moe", "dense"))
        groups = ok.groupby(["gpu", "kind"]).agg(
            recipes=("row_id", "size"), fit=("recipe_fits", "sum"), top=("top", "sum"),
            optimism=("optimism", "median"), shrunk=("optimism_shrunk", "median"),
            upper=("optimism_upper", "median"), recipe_err=("recipe_err", "median"))
        for col in ("optimism", "shrunk", "upper", "recipe_err"):
            groups[col] = groups[col].map(lambda v: f"{v:+.1%}")
        print("\nper GPU and model kind (medians)")
        print(groups.to_string())
    if args.output:
        frame.to_csv(args.output, index=False)
        print(f"table -> {args.output}")


if __name__ == "__main__":
    main()
