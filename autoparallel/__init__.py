"""autoparallel: plan data x tensor x pipeline x context x expert parallelism for LLM training.

Public API:
    make_problem(model, gpu, n_gpus, seq_len, global_batch, ...) -> Problem
    estimate(problem, layout) -> dict           # one layout, the estimate JSON schema
    evaluate(problem, table) -> Evaluation      # many layouts at once (numpy)
"""

from .errors import AutoParallelError, ExportError, InfeasibleError, SpecError
from .evaluate import Evaluation, estimate, evaluate
from .layouts import LayoutTable
from .presets import list_gpus, list_models, load_gpu, load_model
from .problem import make_problem
from .specs import ClusterSpec, GPUSpec, Layout, ModelSpec, Problem, Profile, Recompute, TrainingSpec

__version__ = "0.1.0"

__all__ = [
    "AutoParallelError", "ClusterSpec", "Evaluation", "ExportError", "GPUSpec", "InfeasibleError",
    "Layout", "LayoutTable", "ModelSpec", "Problem", "Profile", "Recompute", "SpecError",
    "TrainingSpec", "estimate", "evaluate", "list_gpus", "list_models", "load_gpu", "load_model",
    "make_problem",
]
