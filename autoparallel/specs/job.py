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
from .stack import CudaGraphs, ModelCodeName, MoEDispatcher, MoERouting, OffloadModules


CLI_HELP: dict[str, str] = {}
"""One-line `--help` text per field name (the field's docstring holds the details), recorded by
`_cli` where the field is declared; a field without one shows its docstring's first sentence."""


def _cli(flag: str, metavar: str = "", *, help: str = "") -> dict:
    """The CLI side of a field's declaration: its flag (`--x` or `--x/--no-x`), metavar and
    one-line help (kept out of the JSON schema, which carries the full description)."""
    if help:
        CLI_HELP[flag] = help
    return {"json_schema_extra": {"cli": flag, "metavar": metavar}}


class JobSpec(Spec):
    """How the job is trained: software stack, precision, and settings that override the stack."""

    stack: str = Field("megatron-core", **_cli("--stack", "NAME|FILE", help="Software stack: a preset (`autoparallel presets stacks`) or a TOML/JSON file."))
    """Software stack preset (`autoparallel presets stacks`) or a stack TOML/JSON file."""
    precision: PrecisionName = Field("bf16", **_cli("--precision", help="Training precision (docs/cost-model.md)."))
    """bf16, fp16, fp8 (per-tensor scaling), fp8-blockwise, mxfp8 or nvfp4 (docs/cost-model.md)."""
    grad_dtype: Literal["bf16", "fp32"] | None = Field(None, **_cli("--grad-dtype", help="Gradient buffer dtype [default: the stack's]."))
    """Gradient buffer: bf16 (16 bytes/param) or fp32 (Megatron, 18 bytes/param); default: the stack's."""
    grad_reduce_dtype: Literal["bf16", "fp32"] | None = Field(None, **_cli("--grad-reduce-dtype", help="Dtype of the data-parallel gradient reduction [default: the stack's]."))
    """Dtype of the data-parallel gradient reduction on the wire; default: the stack's."""
    optimizer_dtype: Literal["fp32", "bf16"] | None = Field(None, **_cli("--optimizer-dtype", help="AdamW state: fp32 (12 bytes/param) or bf16 (4) [default: the stack's]."))
    """AdamW state: fp32 master weights + moments (12 bytes/param) or bf16 moments updating bf16 weights in place (4 bytes/param, "bf16-true"); default: the stack's."""
    attention: Literal["flash", "cudnn", "eager"] | None = Field(None, **_cli("--attention", help="Attention kernel class [default: the stack's for the GPU]."))
    """flash (FlashAttention-2 class), cudnn (TE cuDNN / FA3 class) or eager (scores stored); default: the stack's for the GPU."""
    model_code: ModelCodeName | None = Field(None, **_cli("--model-code", help="What the model code saves for backward [default: the stack's]."))
    """What the model's code saves for backward: fused (Megatron-Core / Transformer Engine), hf (Hugging Face transformers modules: fp32 norms, unfused RoPE and MLP, fp32 logits), nanotron or torchtitan; default: the stack's."""
    torch_compile: bool | None = Field(None, **_cli("--torch-compile/--no-torch-compile", help="Model and loss under torch.compile (memory only) [default: the stack's]."))
    """The model and loss run under torch.compile (TorchTitan `--compile`): pointwise chains fused and recomputed in backward, the loss keeps only bf16 logits; memory only (its speed is in the stack's fitted profile); default: the stack's (off)."""
    autocast: bool | None = Field(None, **_cli("--autocast/--no-autocast", help="fp32 weights under torch.autocast [default: the stack's]."))
    """fp32 weights under torch.autocast (Composer amp_bf16 over fp32 FSDP parameters, ATorch): the bf16 cast of every weight is cached until the forward ends; default: the stack's (off: 16-bit weights kept by the stack)."""
    tp_comm_overlap: bool | None = Field(None, **_cli("--tp-comm-overlap/--no-tp-comm-overlap", help="Overlap TP collectives with GEMMs [default: the stack's]."))
    """TP collectives overlapped with GEMMs (Megatron --tp-comm-overlap, TorchTitan async TP); default: the stack's."""
    moe_dispatcher: MoEDispatcher | None = Field(None, **_cli("--moe-dispatcher", help="MoE token dispatcher: alltoall, allgather, deepep or hybridep [default: the stack's]."))
    """MoE token dispatcher: alltoall (NCCL all-to-all), allgather (gather every token of the expert-TP x EP group), deepep or hybridep (Megatron's flex dispatcher with DeepEP or HybridEP kernels: each token crosses the network once per destination node); default: the stack's."""
    moe_a2a_overlap: bool | None = Field(None, **_cli("--moe-a2a-overlap/--no-moe-a2a-overlap", help="Hide the EP all-to-all behind another micro-batch's compute (1F1B A2A overlap) [default: the stack's]."))
    """EP all-to-all hidden behind another micro-batch's compute (Megatron --overlap-moe-expert-parallel-comm --delay-wgrad-compute, 1F1B A2A overlap); default: the stack's (off)."""
    moe_routing: MoERouting | None = Field(None, **_cli("--moe-routing", help="MoE routing: dropless, balanced (forced, as benchmarks run) or capacity (token dropping) [default: the stack's]."))
    """dropless (every token to its top-k experts, auxiliary-loss balancing: the busiest rank gets more), balanced (tokens forced round-robin, as benchmarks run: Megatron --moe-router-force-load-balancing) or capacity (token dropping: each expert takes at most capacity-factor x its share, padded to it); default: the stack's."""
    moe_capacity_factor: PositiveFloat | None = Field(None, **_cli("--moe-capacity-factor", help="With --moe-routing capacity: tokens per expert in units of its balanced share [default: 1.0]."))
    """With moe_routing = capacity: tokens an expert takes, in units of its balanced share (Megatron --moe-expert-capacity-factor); default 1.0."""
    cuda_graphs: CudaGraphs | None = Field(None, **_cli("--cuda-graphs", help="CUDA graph capture: none, scoped or full [default: the stack's]."))
    """CUDA graph capture: none, scoped (Transformer Engine graphs of attention and the MoE router/preprocess; the dynamic-shape MoE part stays eager) or full (whole layers / iteration: needs static shapes, i.e. capacity routing or the hybridep dispatcher); default: the stack's (none)."""
    offload_modules: OffloadModules | None = Field(None, **_cli("--offload-modules", help="Fine-grained activation offload of MoE modules' saved inputs: none, expert_fc1, moe_act or expert_fc1+moe_act [default: none]."))
    """Fine-grained activation offload (Megatron-Core `--fine-grained-activation-offloading --offload-modules`): the saved input of each named module of every MoE layer goes to host memory during the forward and comes back before its backward: `expert_fc1` the routed experts' FC1 input (the dispatched tokens), `moe_act` the experts' activation input (the FC1 output); default none."""
    fp8_param_gather: bool | None = Field(None, **_cli("--fp8-param-gather/--no-fp8-param-gather", help="Keep and all-gather low-precision weights in the recipe's format [default: the stack's]."))
    """Low-precision recipes keep each linear weight in the recipe's format only (no 16-bit copy) and all-gather it so (Megatron --fp8-param-gather / --fp4-param-gather, TorchTitan enable_fsdp_float8_all_gather); default: the stack's."""
    usable_fraction: float | None = Field(None, gt=0, le=1, **_cli("--usable-fraction", help="Share of GPU memory the allocated peak may fill, e.g. 0.9 [default: capacity less CUDA context and NCCL]."))
    """Override: share of GPU memory the allocated peak may fill (e.g. 0.9); default: the reserved peak (with the fitted fragmentation reserve) must fit in the capacity less CUDA context and NCCL memory."""
    intra_gbps: PositiveFloat | None = Field(None, **_cli("--intra-gbps", help="Scale-up (NVLink) bandwidth per GPU, GB/s [default: the GPU's]."))
    """Override of the scale-up (NVLink) bandwidth per GPU, GB/s one direction."""
    inter_gbps: PositiveFloat | None = Field(None, **_cli("--inter-gbps", help="Network bandwidth per GPU, GB/s [default: the GPU's]."))
    """Override of the network bandwidth per GPU, GB/s."""
    intra_latency_us: NonNegativeFloat | None = Field(None, **_cli("--intra-latency-us", help="Collective latency per step inside the scale-up domain, microseconds."))
    """Override of the per-step collective latency inside the scale-up domain, microseconds."""
    inter_latency_us: NonNegativeFloat | None = Field(None, **_cli("--inter-latency-us", help="Collective latency per step across the network, microseconds."))
    """Override of the per-step collective latency across the network, microseconds."""
    network: str | None = Field(None, **_cli("--network", "NAME|FILE", help="Network preset (`autoparallel presets networks`) or a TOML/JSON file [default: two levels]."))
    """Network preset (`autoparallel presets networks`) or a network TOML/JSON file: its tiers from the NVLink domain out (size, bandwidth, latency, oversubscription, in-network reduction); default: two levels, the GPU's NVLink domain and its NICs on one flat network."""
    profile: str | None = Field(None, **_cli("--profile", "FILE", help="Efficiency profile TOML (from `autoparallel calibrate`) over the stack's."))
    """Efficiency profile TOML (from `autoparallel calibrate`) applied over the stack's."""


JOB_FIELDS: tuple[str, ...] = tuple(JobSpec.model_fields)
"""Names of the job settings, in declaration order (CSV columns, API keywords)."""


def job_help(name: str) -> str:
    """The one-line `--help` of a job field."""
    field = JobSpec.model_fields[name]
    flag = str((field.json_schema_extra or {})["cli"])
    if flag in CLI_HELP:
        return CLI_HELP[flag]
    text = " ".join((field.description or "").split())
    cut = text.find(". ")
    return text if cut < 0 else text[:cut + 1]


def job_flag(name: str) -> str:
    """The CLI flag of a job field (the `--x` part of `--x/--no-x`)."""
    extra = JobSpec.model_fields[name].json_schema_extra or {}
    return str(extra["cli"]).split("/")[0]


def flags_text(settings: dict) -> str:
    """Job settings as the flags that set them, comma-separated: `--moe-dispatcher deepep,
    --no-moe-a2a-overlap` (`job_words`); '' for none."""
    return ", ".join(" ".join(job_words(k, v)) for k, v in settings.items())


def job_words(name: str, value) -> list[str]:
    """A job setting as the command-line words that set it: `["--moe-dispatcher", "deepep"]`,
    `["--moe-a2a-overlap"]` / `["--no-moe-a2a-overlap"]` for a switch."""
    flag = job_flag(name)
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    return [flag, str(value)]
