"""autoparallel: plan data x tensor x pipeline x context x expert parallelism for LLM training.

Public API (problems as a `Problem` or as keywords model=, gpu=, gpus=, seq_len=, global_batch=):
    make_problem(model, gpu, n_gpus, seq_len, global_batch, ...) -> Problem
    plan(problem | **kw, top=10) -> PlanReport     # ranked layouts: .layout(1), .frame, .out
    estimate(problem, layout) -> dict              # one layout, the estimate JSON schema
    estimate_out(problem, layout) -> EstimateOut   # the same, typed
    export(target, problem, layout) -> str         # launcher file (megatron, torchtitan, ...)
    evaluate(problem, table) -> Evaluation         # many layouts at once (numpy)

The names are imported on first use (PEP 562), so that `import autoparallel` and the command
line's start-up load only what is used.
"""

from __future__ import annotations

import importlib
import sys
import types

from ._startup import guard_startup as _guard_startup

_guard_startup()  # Ctrl-C while the command starts: one line, exit 130 (only as the command)

__version__ = "0.1.0"

_EXPORTS = {
    "AutoParallelError": "errors", "ExportError": "errors", "InfeasibleError": "errors",
    "SpecError": "errors",
    "Evaluation": "evaluate", "evaluate": "evaluate",
    "LayoutTable": "layouts",
    "list_gpus": "presets", "list_models": "presets", "load_gpu": "presets",
    "load_model": "presets",
    "make_problem": "problem",
    "ClusterSpec": "specs", "GPUSpec": "specs", "Layout": "specs", "ModelSpec": "specs",
    "Problem": "specs", "Profile": "specs", "Recompute": "specs", "TrainingSpec": "specs",
    "PlanReport": "api", "capacity": "api", "estimate": "api", "estimate_out": "api",
    "export": "api", "plan": "api",
}
"""Public name -> the submodule that defines it."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autoparallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """`autoparallel.evaluate` stays the function although a submodule has the same name:
    importing `autoparallel.evaluate` binds the submodule on the package, which this setter
    ignores (the eager `from .evaluate import evaluate` used to rebind it the same way)."""

    @property
    def evaluate(self):
        from .evaluate import evaluate

        return evaluate

    @evaluate.setter
    def evaluate(self, value) -> None:
        pass


sys.modules[__name__].__class__ = _Package
