"""autoparallel: plan data x tensor x pipeline x context x expert parallelism for LLM training.

Public API (problems as a `Problem` or as keywords model=, gpu=, gpus=, seq_len=, global_batch=):
    make_problem(model, gpu, n_gpus, seq_len, global_batch, ...) -> Problem
    plan(problem | **kw, top=10) -> PlanReport     # ranked layouts: .layout(1), .frame, .out
    estimate(problem, layout) -> dict              # one layout, the estimate JSON schema
    estimate_out(problem, layout) -> EstimateOut   # the same, typed
    export(target, problem, layout) -> str         # launcher file (megatron, torchtitan, ...)
    evaluate(problem, table) -> Evaluation         # many layouts at once (numpy)
"""

from ._startup import guard_startup as _guard_startup

_guard_startup()  # Ctrl-C while the command starts: one line, exit 130 (only as the command)

from .errors import AutoParallelError, ExportError, InfeasibleError, SpecError
from .evaluate import Evaluation, evaluate
from .layouts import LayoutTable
from .presets import list_gpus, list_models, load_gpu, load_model
from .problem import make_problem
from .specs import ClusterSpec, GPUSpec, Layout, ModelSpec, Problem, Profile, Recompute, TrainingSpec
from .api import PlanReport, capacity, estimate, estimate_out, export, plan  # noqa: E402  (needs the above)

__version__ = "0.1.0"

__all__ = [
    "AutoParallelError", "ClusterSpec", "Evaluation", "ExportError", "GPUSpec", "InfeasibleError",
    "Layout", "LayoutTable", "ModelSpec", "PlanReport", "Problem", "Profile", "Recompute",
    "SpecError", "TrainingSpec", "capacity", "estimate", "estimate_out", "evaluate", "export", "list_gpus",
    "list_models", "load_gpu", "load_model", "make_problem", "plan",
]
