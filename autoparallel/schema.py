"""JSON Schemas of the inputs (from the pydantic specs) and of the JSON outputs (from pydantic
models that mirror them). `SCHEMA_VERSION` changes whenever an output schema changes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from .errors import SpecError
from .specs import GPUSpec, Layout, ModelSpec, Profile

SCHEMA_VERSION = "1"


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LayoutOut(_Out):
    dp: int
    tp: int
    pp: int
    vp: int
    cp: int
    ep: int
    zero: int
    recompute: str
    sp: bool
    micro_batch: int
    grad_accum: int


class MemoryOut(_Out):
    """Per-GPU memory of the most-loaded pipeline stage, GiB (2^30 bytes)."""

    params: float
    grads: float
    optimizer: float
    model_states: float
    activations: float
    embedding_logits: float
    overhead: float
    total: float
    capacity: float
    usable: float


class TimeOut(_Out):
    """Seconds per training step of the pacing stage."""

    compute: float
    recompute: float
    tp_comm: float
    cp_comm: float
    ep_comm: float
    pp_comm: float
    dp_comm: float
    bubble: float
    optimizer: float
    step: float


class EstimateOut(_Out):
    """Output of `autoparallel estimate --format json`."""

    model: str
    gpu: str
    n_gpus: int
    layout: LayoutOut
    memory_gib: MemoryOut
    fits: bool
    time_s: TimeOut
    mfu: float
    tokens_per_s_per_gpu: float
    model_flops_per_step: float


class RankedOut(EstimateOut):
    rank: int


class PlanOut(_Out):
    """Output of `autoparallel plan --format json`."""

    schema_version: str
    problem: dict
    n_layouts: int
    n_valid: int
    n_fit: int
    search_s: float
    ranked: list[RankedOut]


_SCHEMAS = {
    "estimate": EstimateOut, "plan": PlanOut, "model": ModelSpec, "gpu": GPUSpec,
    "profile": Profile, "layout": Layout,
}


def schema_for(what: str) -> dict:
    """JSON Schema of `what` (estimate, plan, model, gpu, profile, layout)."""
    if what not in _SCHEMAS:
        raise SpecError(f"`schema` {what!r} unknown; choose one of {', '.join(_SCHEMAS)}")
    schema = _SCHEMAS[what].model_json_schema()
    schema["$comment"] = f"autoparallel schema version {SCHEMA_VERSION}"
    return schema
