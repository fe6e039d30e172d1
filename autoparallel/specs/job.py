"""`JobSpec`: every setting of a training job besides the model, the GPUs and the batch, declared
once. CLI options (`--stack`, `--precision`, ...), Python API keywords, `Problem.describe()`,
the sweep/plan CSV columns, batch-estimate input columns, `export --from CSV` and the estimate
JSON `job` object are all derived from these fields, so that none can drift from the others.

A field left at None takes the stack's default (e.g. Megatron-Core keeps fp32 gradients and
overlaps TP communication; TorchTitan keeps 16 bytes/parameter and does not)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat

from ._base import Spec
from .precision import PrecisionName
from .stack import CudaGraphs, ModelCodeName, MoEDispatcher, MoERouting


def _cli(flag: str, metavar: str = "") -> dict:
    return {"json_schema_extra": {"cli": flag, "metavar": metavar}}


class JobSpec(Spec):
    """How the job is trained: software stack, precision, and settings that override the stack."""

    stack: str = Field("megatron-core", **_cli("--stack"))
    """Software stack preset (`autoparallel presets stacks`) or a stack TOML/JSON file."""
    precision: PrecisionName = Field("bf16", **_cli("--precision"))
    """bf16, fp16, fp8 (per-tensor scaling), fp8-blockwise, mxfp8 or nvfp4 (docs/cost-model.md)."""
    grad_dtype: Literal["bf16", "fp32"] | None = Field(None, **_cli("--grad-dtype"))
    """Gradient buffer: bf16 (16 bytes/param) or fp32 (Megatron, 18 bytes/param); default: the stack's."""
    grad_reduce_dtype: Literal["bf16", "fp32"] | None = Field(None, **_cli("--grad-reduce-dtype"))
    """Dtype of the data-parallel gradient reduction on the wire; default: the stack's."""
    optimizer_dtype: Literal["fp32", "bf16"] | None = Field(None, **_cli("--optimizer-dtype"))
    """AdamW state: fp32 master weights + moments (12 bytes/param) or bf16 moments updating bf16 weights in place (4 bytes/param, "bf16-true"); default: the stack's."""
    attention: Literal["flash", "cudnn", "eager"] | None = Field(None, **_cli("--attention"))
    """flash (FlashAttention-2 class), cudnn (TE cuDNN / FA3 class) or eager (scores stored); default: the stack's for the GPU."""
    model_code: ModelCodeName | None = Field(None, **_cli("--model-code"))
    """What the model's code saves for backward: fused (Megatron-Core / Transformer Engine), hf (Hugging Face transformers modules: fp32 norms, unfused RoPE and MLP, fp32 logits), nanotron or torchtitan; default: the stack's."""
    torch_compile: bool | None = Field(None, **_cli("--torch-compile/--no-torch-compile"))
    """The model and loss run under torch.compile (TorchTitan `--compile`): pointwise chains fused and recomputed in backward, the loss keeps only bf16 logits; memory only (its speed is in the stack's fitted profile); default: the stack's (off)."""
    autocast: bool | None = Field(None, **_cli("--autocast/--no-autocast"))
    """fp32 weights under torch.autocast (Composer amp_bf16 over fp32 FSDP parameters, ATorch): the bf16 cast of every weight is cached until the forward ends; default: the stack's (off: 16-bit weights kept by the stack)."""
    tp_comm_overlap: bool | None = Field(None, **_cli("--tp-comm-overlap/--no-tp-comm-overlap"))
    """TP collectives overlapped with GEMMs (Megatron --tp-comm-overlap, TorchTitan async TP); default: the stack's."""
    moe_dispatcher: MoEDispatcher | None = Field(None, **_cli("--moe-dispatcher"))
    """MoE token dispatcher: alltoall (NCCL all-to-all), allgather (gather every token of the expert-TP x EP group), deepep or hybridep (Megatron's flex dispatcher with DeepEP or HybridEP kernels: each token crosses the network once per destination node); default: the stack's."""
    moe_a2a_overlap: bool | None = Field(None, **_cli("--moe-a2a-overlap/--no-moe-a2a-overlap"))
    """EP all-to-all hidden behind another micro-batch's compute (Megatron --overlap-moe-expert-parallel-comm --delay-wgrad-compute, 1F1B A2A overlap); default: the stack's (off)."""
    moe_routing: MoERouting | None = Field(None, **_cli("--moe-routing"))
    """dropless (every token to its top-k experts, auxiliary-loss balancing: the busiest rank gets more), balanced (tokens forced round-robin, as benchmarks run: Megatron --moe-router-force-load-balancing) or capacity (token dropping: each expert takes at most capacity-factor x its share, padded to it); default: the stack's (dropless)."""
    moe_capacity_factor: PositiveFloat | None = Field(None, **_cli("--moe-capacity-factor"))
    """With moe_routing = capacity: tokens an expert takes, in units of its balanced share (Megatron --moe-expert-capacity-factor); default 1.0."""
    cuda_graphs: CudaGraphs | None = Field(None, **_cli("--cuda-graphs"))
    """CUDA graph capture: none, scoped (Transformer Engine graphs of attention and the MoE router/preprocess; the dynamic-shape MoE part stays eager) or full (whole layers / iteration: needs static shapes, i.e. capacity routing or the hybridep dispatcher); default: the stack's (none)."""
    usable_fraction: float | None = Field(None, gt=0, le=1, **_cli("--usable-fraction"))
    """Override: share of GPU memory the allocated peak may fill (e.g. 0.9); default: the reserved peak (with the fitted fragmentation reserve) must fit in the capacity less CUDA context and NCCL memory."""
    intra_gbps: PositiveFloat | None = Field(None, **_cli("--intra-gbps"))
    """Override of the scale-up (NVLink) bandwidth per GPU, GB/s one direction."""
    inter_gbps: PositiveFloat | None = Field(None, **_cli("--inter-gbps"))
    """Override of the network bandwidth per GPU, GB/s."""
    intra_latency_us: NonNegativeFloat | None = Field(None, **_cli("--intra-latency-us"))
    """Override of the per-step collective latency inside the scale-up domain, microseconds."""
    inter_latency_us: NonNegativeFloat | None = Field(None, **_cli("--inter-latency-us"))
    """Override of the per-step collective latency across the network, microseconds."""
    profile: str | None = Field(None, **_cli("--profile"))
    """Efficiency profile TOML (from `autoparallel calibrate`) applied over the stack's."""


JOB_FIELDS: tuple[str, ...] = tuple(JobSpec.model_fields)
"""Names of the job settings, in declaration order (CSV columns, API keywords)."""


def job_flag(name: str) -> str:
    """The CLI flag of a job field (the `--x` part of `--x/--no-x`)."""
    extra = JobSpec.model_fields[name].json_schema_extra or {}
    return str(extra["cli"]).split("/")[0]
