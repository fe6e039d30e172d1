"""Exporters: turn a (problem, layout) pair into a file a launcher can run.

    >>> from autoparallel import Layout, make_problem
    >>> from autoparallel.exporters import render
    >>> p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
    >>> text = render("torchtitan", p, Layout(tp=8, pp=4, vp=5, recompute="selective"))
    >>> "pipeline_parallel_degree = 4" in text
    True

Each target checks first what its launcher can express and refuses (`ExportError`, with every
reason and the targets that can) instead of writing a file that would launch something else.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

import numpy as np

from ..errors import ExportError
from ..specs.layout import Layout
from ..specs.problem import Problem
from ._base import Exporter, Job

CLASSES = {"megatron": ("megatron", "MegatronExporter"),
           "torchtitan": ("torchtitan", "TorchTitanExporter"),
           "deepspeed": ("deepspeed", "DeepSpeedExporter"),
           "nanotron": ("nanotron", "NanotronExporter"),
           "slurm": ("slurm", "SlurmExporter"),
           "megatron-bridge": ("megatron_bridge", "MegatronBridgeExporter")}
"""Target name -> (module of this package, exporter class): a target's module is imported when
the target is first asked for (a `plan` checks one launcher, not five)."""


def exporter_class(target: str) -> type[Exporter]:
    """The exporter class of `target` (a key of `CLASSES`), importing its module."""
    module, name = CLASSES[target]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


class _Registry(Mapping):
    """Target name -> the target's exporter (default form), built on first use."""

    def __init__(self) -> None:
        self._made: dict[str, Exporter] = {}

    def __getitem__(self, target: str) -> Exporter:
        made = self._made.get(target)
        if made is None:
            made = self._made[target] = exporter_class(target)()
        return made

    def __contains__(self, target: object) -> bool:  # without building it
        return target in CLASSES

    def __iter__(self) -> Iterator[str]:
        return iter(CLASSES)

    def __len__(self) -> int:
        return len(CLASSES)


EXPORTERS: Mapping[str, Exporter] = _Registry()
"""Registry: target name -> exporter."""


VERSIONED = ("torchtitan",)
"""Targets whose file form depends on the launcher release (`version`)."""


def get_exporter(target: str, version: str | None = None, **options: str | None) -> Exporter:
    """The exporter registered as `target` (for the launcher release `version`, where the target
    has several forms; default: the current release); `ExportError` naming the known targets or
    the versions otherwise."""
    if target not in EXPORTERS:
        raise ExportError(f"unknown export target {target!r}; choose one of "
                          f"{', '.join(EXPORTERS)}")
    given = {k: v for k, v in options.items() if v is not None}
    if given:
        if target != "slurm":
            raise ExportError(f"{', '.join('--' + k for k in given)} apply to --target slurm "
                              f"only (the #SBATCH lines); {target} writes no batch header")
        return exporter_class("slurm")(**given)
    if version is None:
        return EXPORTERS[target]
    if target not in VERSIONED:
        raise ExportError(f"--target-version applies to {', '.join(VERSIONED)} only; "
                          f"{target} has one form")
    return exporter_class(target)(version)


def targets_for(problem: Problem, layout: Layout) -> list[str]:
    """Names of the targets that can launch `layout` for `problem`."""
    return [name for name, e in EXPORTERS.items() if not e.check(problem, layout)]


def check(target: str, problem: Problem, layout: Layout, version: str | None = None) -> list[str]:
    """Reasons `target` (release `version`, default the current one) cannot launch `layout`
    (empty when it can)."""
    return get_exporter(target, version).check(problem, layout)


def launchable(target: str, problem: Problem, table) -> np.ndarray:
    """Per row of `table` (a `LayoutTable` whose rows pass the hard rules, as `plan`'s survivors
    do): whether `target` can launch it. The target's own reasons are looked for once per row
    distinct on the columns they read (all but the target's `Exporter.ignores`)."""
    from ..cost.distinct_rows import distinct_rows, spread
    from ..layouts import COLUMNS

    exporter = get_exporter(target)
    found = distinct_rows(table, tuple(c for c in COLUMNS if c not in exporter.ignores))
    rows = found[0] if found is not None else np.arange(len(table))
    ok = np.array([not exporter.check(problem, table.row(int(i)), rules_passed=True)
                   for i in rows], dtype=bool)
    return spread(ok, None if found is None else found[1])


def render(target: str, problem: Problem, layout: Layout, version: str | None = None,
           **options: str | None) -> str:
    """The launcher file text of `layout` for `target`.

    Args:
        target: one of `EXPORTERS` (megatron, torchtitan, deepspeed, nanotron, slurm,
            megatron-bridge).
        problem: model, cluster and job.
        layout: the layout; `dp` may be omitted (derived), `sp` defaults to on with TP.
        version: launcher release for targets with several forms (torchtitan: "0.3", the
            default, writes the Python config module; "0.2" / "0.2.2" the TOML).
        options: slurm only: `time`, `partition`, `account`, `qos` #SBATCH settings (written
            only when given).

    Raises:
        ExportError: unknown target, or the target cannot express the layout; the message lists
            every reason and the targets that can launch it.
    """
    exporter = get_exporter(target, version, **options)
    reasons = exporter.check(problem, layout)
    if reasons:
        slug = layout.resolved(problem.cluster.n_gpus).slug
        others = [t for t in targets_for(problem, layout) if t != target]
        can = (f"targets that can launch it: {', '.join(others)}" if others else
               "no target can launch it; change the layout (`autoparallel estimate` checks one)")
        raise ExportError("\n".join([f"{target} cannot launch {slug}:"]
                                    + [f"- {r}" for r in reasons] + [can]))
    return exporter.render(problem, layout)


__all__ = ["EXPORTERS", "Exporter", "Job", "check", "get_exporter", "launchable", "render",
           "targets_for"]
