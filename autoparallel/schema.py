"""JSON Schemas of the inputs (from the pydantic specs) and of the JSON outputs (from pydantic
models that mirror them). `SCHEMA_VERSION` changes whenever an output schema changes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from .errors import SpecError
from .specs import GPUSpec, Layout, ModelSpec, Profile

SCHEMA_VERSION = "3"
"""Version of the output schemas (`estimate`, `plan`). Version 2: field descriptions with units
and a typed `problem` object in the plan output. Version 3: `model_params` (total and active
parameter counts) in both. `tests/golden/schema/v<N>.json` freezes each
version; changing an output model needs a new version and a new golden file."""


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class LayoutOut(_Out):
    """One layout, every axis explicit."""

    dp: int
    """Data-parallel degree."""
    tp: int
    """Tensor-parallel degree."""
    pp: int
    """Pipeline-parallel degree."""
    vp: int
    """Virtual pipeline stages (model chunks) per pipeline rank."""
    cp: int
    """Context-parallel degree."""
    ep: int
    """Expert-parallel degree (carved out of dp x cp)."""
    zero: int
    """ZeRO stage 0-3 over dp x cp (1 = distributed optimizer)."""
    recompute: str
    """Activation recomputation: none, selective or full."""
    sp: bool
    """Sequence parallelism with TP."""
    micro_batch: int
    """Sequences per micro-batch."""
    grad_accum: int
    """Micro-batches per optimizer step per data-parallel replica (global batch / (dp x micro_batch))."""


class MemoryOut(_Out):
    """Per-GPU memory of the most-loaded pipeline stage, GiB (2^30 bytes)."""

    params: float
    """bf16 parameters held by one GPU (after TP, PP, EP and ZeRO-3 sharding)."""
    grads: float
    """Gradients (bf16 or fp32 per `grad_dtype`; sharded from ZeRO-2 on)."""
    optimizer: float
    """fp32 master weights and Adam moments, 12 bytes/parameter (sharded from ZeRO-1 on)."""
    model_states: float
    """params + grads + optimizer."""
    activations: float
    """Stored activations of the micro-batches in flight on the stage."""
    embedding_logits: float
    """Embedding output and fp32 logits of the first / last stage."""
    overhead: float
    """Fixed overhead (CUDA context, workspaces) plus transients (ZeRO-3 gathers, full-recompute
    working set, CP ring buffers)."""
    total: float
    """params + grads + optimizer + activations + embedding_logits + overhead."""
    capacity: float
    """HBM of one GPU."""
    usable: float
    """capacity x usable_fraction: what a layout may fill to fit."""


class TimeOut(_Out):
    """Seconds per training step of the pacing (slowest) pipeline stage."""

    compute: float
    """Forward and backward kernels of every micro-batch."""
    recompute: float
    """Forward kernels re-run in backward (selective or full recompute)."""
    tp_comm: float
    """Tensor-parallel collectives not hidden by compute."""
    cp_comm: float
    """Context-parallel ring exchange not hidden by attention."""
    ep_comm: float
    """Expert-parallel all-to-alls not hidden by compute."""
    pp_comm: float
    """Pipeline point-to-point sends on the fill and drain path."""
    dp_comm: float
    """Data-parallel gradient reduction / parameter gathering left exposed after overlap."""
    bubble: float
    """Pipeline bubble, (pp - 1) / vp x the slowest stage's time per micro-batch."""
    optimizer: float
    """Optimizer step on the local shard plus the fixed per-step overhead."""
    step: float
    """Sum of the items above: one optimizer step."""


class ModelParamsOut(_Out):
    """Parameter counts of the model as the cost model sees it (biases and the few norms the
    count leaves out are under 0.1 %)."""

    total: int
    """Every parameter (all experts, embeddings, output layer unless tied)."""
    active: int
    """Parameters one token passes through (top-k routed experts only); = total for dense models."""


class EstimateOut(_Out):
    """Output of `autoparallel estimate --format json` (and `autoparallel.estimate`)."""

    model: str
    """Model name."""
    gpu: str
    """GPU preset name."""
    n_gpus: int
    """GPUs in the job."""
    layout: LayoutOut
    """The layout, every axis explicit."""
    memory_gib: MemoryOut
    """Memory per GPU, GiB."""
    fits: bool
    """Whether memory_gib.total <= memory_gib.usable."""
    time_s: TimeOut
    """Time per step, seconds."""
    mfu: float
    """Model FLOPs utilisation, 0-1 (model FLOPs per step / (step x peak x n_gpus))."""
    tokens_per_s_per_gpu: float
    """Training throughput, tokens per second per GPU."""
    model_flops_per_step: float
    """Model FLOPs of one optimizer step (no recompute), FLOP."""
    model_params: ModelParamsOut
    """Total and active parameter counts of the model."""


class RankedOut(EstimateOut):
    """One ranked layout of a plan."""

    rank: int
    """1 = fastest."""


class ProblemOut(_Out):
    """The planned problem."""

    model: str
    """Model name."""
    gpu: str
    """GPU preset name."""
    n_gpus: int
    """GPUs in the job."""
    gpus_per_node: int
    """GPUs per node."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""


class PlanOut(_Out):
    """Output of `autoparallel plan --format json` (and `autoparallel.plan(...).out`)."""

    schema_version: str
    """`SCHEMA_VERSION` of this output."""
    problem: ProblemOut
    """What was planned: model, GPU kind and count, sequence length, global batch."""
    model_params: ModelParamsOut
    """Total and active parameter counts of the model."""
    n_layouts: int
    """Layouts enumerated."""
    n_valid: int
    """Layouts that pass every rule except memory."""
    n_fit: int
    """Valid layouts that fit in usable memory."""
    search_s: float
    """Wall time of the search, seconds."""
    ranked: list[RankedOut]
    """The best fitting layouts, fastest first (at most `--top`)."""


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
