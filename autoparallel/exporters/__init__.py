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

from ..errors import ExportError
from ..specs.layout import Layout
from ..specs.problem import Problem
from ._base import Exporter, Job
from .deepspeed import DeepSpeedExporter
from .megatron import MegatronExporter
from .nanotron import NanotronExporter
from .slurm import SlurmExporter
from .torchtitan import TorchTitanExporter

EXPORTERS: dict[str, Exporter] = {
    e.name: e for e in (MegatronExporter(), TorchTitanExporter(), DeepSpeedExporter(),
                        NanotronExporter(), SlurmExporter())
}
"""Registry: target name -> exporter."""


def get_exporter(target: str) -> Exporter:
    """The exporter registered as `target`; `ExportError` naming the known targets otherwise."""
    try:
        return EXPORTERS[target]
    except KeyError:
        raise ExportError(f"unknown export target {target!r}; choose one of "
                          f"{', '.join(EXPORTERS)}") from None


def targets_for(problem: Problem, layout: Layout) -> list[str]:
    """Names of the targets that can launch `layout` for `problem`."""
    return [name for name, e in EXPORTERS.items() if not e.check(problem, layout)]


def check(target: str, problem: Problem, layout: Layout) -> list[str]:
    """Reasons `target` cannot launch `layout` (empty when it can)."""
    return get_exporter(target).check(problem, layout)


def render(target: str, problem: Problem, layout: Layout) -> str:
    """The launcher file text of `layout` for `target`.

    Args:
        target: one of `EXPORTERS` (megatron, torchtitan, deepspeed, nanotron, slurm).
        problem: model, cluster and job.
        layout: the layout; `dp` may be omitted (derived), `sp` defaults to on with TP.

    Raises:
        ExportError: unknown target, or the target cannot express the layout; the message lists
            every reason and the targets that can launch it.
    """
    exporter = get_exporter(target)
    reasons = exporter.check(problem, layout)
    if reasons:
        slug = layout.resolved(problem.cluster.n_gpus).slug
        others = [t for t in targets_for(problem, layout) if t != target]
        can = (f"targets that can launch it: {', '.join(others)}" if others else
               "no target can launch it; change the layout (`autoparallel estimate` checks one)")
        raise ExportError("\n".join([f"{target} cannot launch {slug}:"]
                                    + [f"- {r}" for r in reasons] + [can]))
    return exporter.render(problem, layout)


__all__ = ["EXPORTERS", "Exporter", "Job", "check", "get_exporter", "render", "targets_for"]
