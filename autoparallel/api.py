"""Python API for launchers and tuning loops: plan, estimate and export without the command line.

Every function takes the problem either as a `Problem` (from `make_problem`) or as keyword
arguments (`model=`, `gpu=`, `gpus=`, `seq_len=`, `global_batch=`, plus the optional
`make_problem` keywords), and a layout as a `Layout`, a slug
(`"dp2-tp8-pp4-vp5-cp1-ep1-z1-rselective-sp-mb1"`) or a dict of axes.

    >>> import autoparallel as ap
    >>> report = ap.plan(model="llama3-8b", gpu="h100", gpus=8, seq_len=4096, global_batch=64, top=3)
    >>> report.frame["rank"].tolist()
    [1, 2, 3]
    >>> script = ap.export("megatron", report.problem, report.layout(1))
    >>> script.startswith("#!/usr/bin/env bash")
    True

Errors are the package's own: `SpecError` (bad input), `ExportError` (a launcher cannot express
the layout; the message lists why and which targets can), `InfeasibleError` (nothing fits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .errors import InfeasibleError, SpecError, format_validation_error
from .problem import LEGACY_NAMES, make_problem
from .specs.job import JOB_FIELDS
from .specs.layout import Layout
from .specs.problem import Problem

if TYPE_CHECKING:  # imported lazily: `import autoparallel` stays light for the CLI
    import pandas as pd

    from .schema import EstimateOut, PlanOut
    from .search.plan import PlanResult

PROBLEM_OPTIONS = ("gpus_per_node",) + JOB_FIELDS + tuple(LEGACY_NAMES)
"""Optional keywords passed to `make_problem` besides model, gpu, gpus, seq_len, global_batch."""


def problem_of(problem: Problem | None = None, *, model=None, gpu=None, gpus: int | None = None,
               seq_len: int | None = None, global_batch: int | None = None,
               **options: Any) -> Problem:
    """`problem` itself, or a `Problem` built from keyword arguments (give one or the other).

    Raises:
        SpecError: both or neither given, a missing or unknown keyword, or an invalid value.
    """
    named = {"model": model, "gpu": gpu, "gpus": gpus, "seq_len": seq_len,
             "global_batch": global_batch}
    unknown = sorted(set(options) - set(PROBLEM_OPTIONS))
    if unknown:
        raise SpecError(f"unknown problem keyword(s) {', '.join(unknown)}; known: "
                        f"{', '.join(list(named) + list(PROBLEM_OPTIONS))}")
    given = [k for k, v in named.items() if v is not None] + list(options)
    if problem is not None:
        if given:
            raise SpecError(f"give a Problem or problem keywords, not both (got {', '.join(given)})")
        if not isinstance(problem, Problem):
            raise SpecError(f"`problem` must be a Problem (from make_problem), got "
                            f"{type(problem).__name__}")
        return problem
    missing = [k for k, v in named.items() if v is None]
    if missing:
        raise SpecError(f"missing problem keyword(s) {', '.join(missing)} (or pass a Problem)")
    return make_problem(model, gpu, gpus, seq_len, global_batch, **options)


def layout_of(layout: Layout | str | Mapping | None) -> Layout:
    """A `Layout` from a `Layout`, a slug string or a dict of axes.

    Raises:
        SpecError: missing or malformed layout, naming the field.
    """
    if isinstance(layout, Layout):
        return layout
    if layout is None:
        raise SpecError("missing layout: give a Layout, a slug such as "
                        "'dp2-tp8-pp4-vp5-cp1-ep1-z1-rselective-sp-mb1' or a dict of axes")
    if isinstance(layout, str):
        return Layout.read_slug(layout, "layout")
    try:
        if isinstance(layout, Mapping):
            return Layout.model_validate(dict(layout))
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, "layout")) from None
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    raise SpecError(f"`layout` must be a Layout, a slug or a dict, got {type(layout).__name__}")


@dataclass(frozen=True)
class PlanReport:
    """What `plan` returns: the ranked layouts three ways, plus the full search result."""

    problem: Problem
    """The problem that was planned."""
    out: PlanOut
    """The plan JSON as a typed model (`autoparallel schema plan`; `.model_dump()` for a dict)."""
    frame: pd.DataFrame
    """One row per ranked layout, fastest first, in the sweep CSV columns (`SWEEP_COLUMNS`)."""
    layouts: tuple[Layout, ...]
    """Ranked layouts (dp and sp resolved), fastest first; empty when nothing fits."""
    result: PlanResult
    """The search result itself (counts, rejections, survivors, Optuna study)."""

    def layout(self, rank: int = 1) -> Layout:
        """The layout ranked `rank` (1 = fastest).

        Raises:
            InfeasibleError: nothing fits. SpecError: no such rank.
        """
        if not self.layouts:
            from .search.explain import nothing_fits_message

            raise InfeasibleError(nothing_fits_message(self.result))
        if not 1 <= rank <= len(self.layouts):
            raise SpecError(f"rank {rank}: this plan holds ranks 1 to {len(self.layouts)}")
        return self.layouts[rank - 1]

    def export(self, target: str, rank: int = 1) -> str:
        """The launcher file of the layout ranked `rank` (see `export`)."""
        return export(target, self.problem, self.layout(rank))


def plan(problem: Problem | None = None, *, top: int = 10, space=None, rules=None,
         **problem_args: Any) -> PlanReport:
    """Rank the fitting layouts of a problem, fastest first.

    Args:
        problem: a `Problem`, or None with `problem_args` (model=, gpu=, gpus=, seq_len=,
            global_batch=, and optional `make_problem` keywords).
        top: how many ranked layouts to keep.
        space: a `SearchSpace` narrowing the axes (default: everything).
        rules: the active rules (default: `rules.active_rules()`).

    Returns:
        A `PlanReport`; `report.layout(1)` is the fastest layout, `report.frame` a DataFrame.
    """
    from .schema import PlanOut
    from .search.plan import plan as search

    if top < 1:
        raise SpecError(f"`top` = {top}: must be at least 1")
    prob = problem_of(problem, **problem_args)
    result = search(prob, space, top=top, rules=rules)
    layouts = tuple(result.ranked.table.row(i) for i in range(len(result.ranked)))
    return PlanReport(problem=prob, out=PlanOut.model_validate(result.to_json()),
                      frame=result.to_frame(), layouts=layouts, result=result)


def estimate(problem: Problem | None = None, layout: Layout | str | Mapping | None = None,
             rules=None, **problem_args: Any) -> dict:
    """Memory (GiB) and time (s) of one layout as the estimate JSON dict
    (`autoparallel schema estimate`). `estimate(problem, layout, rules=None)` is the historical
    call of `autoparallel.evaluate.estimate`, kept as is.

    Raises:
        SpecError: bad problem or layout, or a layout that breaks a rule other than memory (not
            fitting is `fits: false`, not an error).
    """
    from .evaluate import estimate as one

    return one(problem_of(problem, **problem_args), layout_of(layout), rules)


def estimate_out(problem: Problem | None = None, layout: Layout | str | Mapping | None = None, *,
                 rules=None, **problem_args: Any) -> EstimateOut:
    """`estimate` as the typed `EstimateOut` model (attribute access, `.model_dump_json()`)."""
    from .schema import EstimateOut

    return EstimateOut.model_validate(estimate(problem, layout, rules=rules, **problem_args))


def export(target: str, problem: Problem | None = None,
           layout: Layout | str | Mapping | None = None, **problem_args: Any) -> str:
    """The launcher file text of `layout` for `target` (megatron, torchtitan, deepspeed,
    nanotron, slurm, megatron-bridge); write it to a file or run it.

    Raises:
        ExportError: unknown target, or the target cannot express the layout (the message lists
            every reason and the targets that can).
    """
    from .exporters import render

    return render(target, problem_of(problem, **problem_args), layout_of(layout))


def capacity(model, tokens, seq_len: int, global_batch, gpu, gpus, *, price=None,
             deadline=None, rank_by: str = "time", **options: Any) -> pd.DataFrame:
    """Days, GPU-hours, cost and energy to train `tokens` per GPU kind and count, with bands:
    the rows of `autoparallel capacity --format json` as a DataFrame.

    Args:
        model: preset name or file. tokens: '15T' or a number. seq_len: tokens per sequence.
        global_batch: sequences (int) or tokens with a K/M/B suffix in binary units ('16M').
        gpu: a preset name or a list ('h100' or ['h100', 'b200']).
        gpus: a count, a list of counts, or a string '512,1024' / '512:4096:x2'.
        price: {gpu: price per GPU-hour}. deadline: '30d' etc.; adds a boolean column
            `meets_deadline` (days_high within it) and `df.attrs["smallest_n_gpus"]`.
        rank_by: 'time' or 'robust' (how each row's layout is chosen).
        options: `Assumptions` fields (mtbf_gpu_hours, ckpt_write_s, ckpt_restore_s,
            power_fraction, node_overhead, pue) and `make_problem` keywords.
    """
    import dataclasses

    import pandas as pd

    from .capacity_model import (Assumptions, capacity_rows, parse_counts, parse_duration,
                           smallest_meeting)

    kinds = [gpu] if isinstance(gpu, str) else list(gpu)
    kinds = [k.strip() for g in kinds for k in g.split(",") if k.strip()]
    counts = parse_counts(gpus if isinstance(gpus, str) else
                          ",".join(str(n) for n in ([gpus] if isinstance(gpus, int) else gpus)))
    names = {f.name for f in dataclasses.fields(Assumptions)}
    a = Assumptions(**{k: options.pop(k) for k in list(options) if k in names})
    unknown = sorted(set(options) - set(PROBLEM_OPTIONS) - {"tp_comm_overlap"})
    if unknown:
        raise SpecError(f"unknown capacity keyword(s) {', '.join(unknown)}; known: "
                        f"{', '.join(sorted(names | set(PROBLEM_OPTIONS)))}")
    rows = capacity_rows(model, tokens, seq_len, global_batch, kinds, counts, prices=price,
                         assumptions=a, rank_by=rank_by, **options)
    frame = pd.DataFrame(rows)
    if deadline is not None:
        days = parse_duration(deadline)
        frame["meets_deadline"] = frame["fits"] & (frame.get("days_high", float("inf")) <= days)
        frame.attrs["smallest_n_gpus"] = smallest_meeting(rows, days)
    return frame


__all__ = ["PROBLEM_OPTIONS", "capacity", "PlanReport", "estimate", "estimate_out", "export", "layout_of",
           "plan", "problem_of"]
