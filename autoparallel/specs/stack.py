"""Software stacks: what a training framework does by default, and its efficiency per GPU.

The same layout on the same GPUs runs at different speeds under Megatron-Core with Transformer
Engine, TorchTitan, PyTorch FSDP trainers, DeepSpeed or nanotron: the attention kernel, which
communication overlaps exist, the gradient dtypes, what the low-precision recipe keeps. A stack
preset states these with sources, plus the efficiency knobs fitted on that stack's measured runs
(`autoparallel calibrate --stack NAME`) per GPU.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ._base import Spec
from .hardware import Profile
from .precision import PrecisionName

ModelCodeName = Literal["fused", "hf", "nanotron", "torchtitan", "paddlenlp", "atorch", "chatglm"]
"""Model code whose saved tensors the activation ledger follows (`cost.model_code`)."""

AttentionKernel = Literal["flash", "cudnn", "eager"]
MoEDispatcher = Literal["alltoall", "allgather", "deepep", "hybridep"]
"""MoE token dispatchers (`cost.moe_dispatch`): Megatron-Core `--moe-token-dispatcher-type
alltoall|allgather`, or `flex` with `--moe-flex-dispatcher-backend deepep|hybridep`."""
MoERouting = Literal["dropless", "balanced", "capacity"]
"""How tokens spread over experts (`cost.moe_layer.imbalance`)."""
CudaGraphs = Literal["none", "scoped", "full"]
"""CUDA graph capture (`cost.moe_layer.host_overhead`)."""
OffloadModule = Literal["expert_fc1", "moe_act"]
"""Modules whose saved input fine-grained activation offload moves to the host
(`cost.offload.module_offload_bytes`; Megatron-Core `--offload-modules`)."""
OffloadModules = Literal["none", "expert_fc1", "moe_act", "expert_fc1+moe_act"]
"""A job's offloaded modules, `+`-joined as recompute modules are in a slug."""

CpCommName = Literal["ring", "a2a", "allgather", "a2a+ring"]
"""A context-parallel form (`specs.layout.CpComm`)."""

STACK_KNOBS = ("gemm_efficiency", "fp8_gemm_efficiency", "fp4_gemm_efficiency",
               "attention_efficiency", "cudnn_attention_efficiency", "elementwise_factor",
               "scan_efficiency",
               "step_overhead_ms", "dp_overlap", "ep_overlap", "memory_overhead_gib",
               "moe_host_overhead_us", "grouped_gemm_expert_us", "moe_dropless_imbalance")
"""Profile knobs a stack may set: the software's own efficiencies and overheads. Hardware knobs
(collective bandwidth fractions, latencies, HBM efficiency) stay the GPU preset's."""


class StackSpec(Spec):
    """One software stack (preset `presets/stacks/<name>.toml`, or a user TOML/JSON file)."""

    name: str
    """Preset name, e.g. `megatron-core`."""
    description: str = ""
    """What software this covers."""
    frameworks: list[str] = Field(default_factory=list)
    """Regular expressions (case-insensitive) that recognise this stack in a measured run's
    `framework` column (validation and calibration)."""
    attention: dict[str, AttentionKernel]
    """Attention kernel class per GPU generation (`ampere`, `hopper`, `blackwell`, `cdna3`, ...;
    `default` for the others)."""
    tp_comm_overlap: bool = False
    """Whether TP collectives are overlapped with their GEMMs by default."""
    grad_dtype: Literal["bf16", "fp32"] = "fp32"
    """Gradient buffer dtype by default (`fp32` = 18 bytes/param ledger, `bf16` = 16)."""
    grad_reduce_dtype: Literal["bf16", "fp32"] = "fp32"
    """Dtype in which data-parallel gradients are reduced (bytes on the wire)."""
    optimizer_dtype: Literal["fp32", "bf16"] = "fp32"
    """AdamW state dtype by default (`fp32`: master weights + moments, 12 bytes/param; `bf16`:
    moments only, 4 bytes/param)."""
    activation_factor: float = Field(1.0, gt=0)
    """Stored activations relative to the fused-kernel accounting (Korthikanti et al.): 1 for
    stacks with fused norms, activations and attention; above 1 for eager PyTorch modules that
    save every intermediate (measured on the stack's runs, `sources`)."""
    precisions: list[PrecisionName] = Field(default_factory=lambda: ["bf16"])
    """Precision recipes the stack implements."""
    schedules: list[str] = Field(default_factory=lambda: ["1f1b"])
    """Pipeline schedules the stack implements."""
    low_precision_weight_cache: bool = False
    """Whether low-precision recipes keep a quantised copy of each linear weight and of its
    transpose across micro-batches (Transformer Engine caches both)."""
    low_precision_activations: bool = False
    """Whether the inputs of linear layers are saved for backward in the low-precision format
    (Transformer Engine saves the quantised input) instead of BF16."""
    low_precision_allgather: bool = False
    """Default of `JobSpec.fp8_param_gather`: whether low-precision recipes keep the linear
    weights in their format and all-gather them so (Megatron-Bridge's FP8/MXFP8/NVFP4 recipes
    `fp8_param_gather` / `fp4_param_gather`; TorchTitan `enable_fsdp_float8_all_gather`)."""
    unstated_recompute: Literal["least_that_fits", "none"] = "least_that_fits"
    """How `validate` reads a measured dense run that does not state its recompute: the least
    recompute that fits in memory, or `none` where the stack's published dense recipes run none
    unless they say so (Megatron-Bridge's Llama recipes, the NeMo launcher configs). MoE runs
    keep the least that fits: MoE base recipes set their own recompute per model."""
    selective_recompute: str = "core attention"
    """What `recompute = selective` recomputes in this stack (text)."""
    selective_policy: Literal["core_attention", "op_sac"] = "core_attention"
    """How `selective` is costed: `core_attention` (Megatron: the attention scores are recomputed,
    nothing else) or `op_sac` (TorchTitan's op-level selective checkpointing: the block input,
    every other matmul output and the attention output are saved, the rest recomputed;
    `cost.memory.op_sac_bytes`)."""
    model_code: ModelCodeName = "fused"
    """What the stack's model code saves beyond the fused-kernel ledger (`cost.model_code`):
    `fused`, `hf` (Hugging Face transformers modules), `nanotron`, `torchtitan`, `paddlenlp`,
    `atorch` (ATorch 3D: Hugging Face layers with a vocab-parallel loss), `chatglm` (ChatGLM's
    remote code: fp32 norms, K and V expanded to every head)."""
    torch_compile: bool = False
    """Whether the stack's runs use torch.compile by default (`JobSpec.torch_compile`)."""
    autocast: bool = False
    """Whether the stack keeps fp32 weights under torch.autocast by default (`JobSpec.autocast`)."""
    sequence_parallel: bool = True
    """Whether the stack implements sequence parallelism with TP (Megatron SP); without it the
    search keeps SP off and a run that states nothing is read as SP off."""
    optimizer_foreach: bool = False
    """Whether the optimizer step allocates a moment-sized temporary per parameter (PyTorch
    `torch.optim.AdamW` with `foreach`, the CUDA default: `_foreach_sqrt(exp_avg_sqs)` before the
    in-place update); False for fused multi-tensor kernels updating in place (Apex / Transformer
    Engine FusedAdam in Megatron, DeepSpeed FusedAdam, TorchTitan's default `fused`)."""
    moe_dispatchers: list[MoEDispatcher] = Field(default_factory=lambda: ["alltoall"])
    """MoE token dispatchers the stack implements."""
    moe_dispatcher: MoEDispatcher = "alltoall"
    """Default MoE token dispatcher (`JobSpec.moe_dispatcher`)."""
    moe_a2a_overlap: bool = False
    """Whether the EP all-to-all is overlapped with another micro-batch's compute by default."""
    moe_routing: MoERouting = "dropless"
    """Default routing (`JobSpec.moe_routing`)."""
    cuda_graphs: CudaGraphs = "none"
    """Default CUDA graph capture (`JobSpec.cuda_graphs`)."""
    cuda_graph_modes: list[CudaGraphs] = Field(default_factory=lambda: ["none"])
    """CUDA graph captures the stack implements."""
    offload_modules: list[OffloadModule] = Field(default_factory=list)
    """Modules whose saved input the stack can offload to the host one by one (fine-grained
    activation offload, `JobSpec.offload_modules`); none by default."""
    hybrid_layers: bool = False
    """Whether the stack builds hybrid models' Mamba-2 and gated-DeltaNet mixer layers (the
    `layer_type` rule refuses hybrid models on a stack without them, `cost.layer_rules`)."""
    moe_shared_expert_overlap: bool = False
    """Whether shared experts run concurrently with the token dispatch (Megatron
    `--moe-shared-expert-overlap`; off when the all-to-all overlap is on, which Megatron refuses
    together with it)."""
    moe_fused_router: bool = True
    """Router projection, top-k, softmax/sigmoid and auxiliary loss fused (Megatron
    `--moe-router-fusion`): its elementwise passes read the fp32 scores once."""
    moe_router_fp32: bool = True
    """The router GEMM runs in fp32 (Megatron `--moe-router-dtype fp32`, the MoE guide's advice,
    set by the Megatron-Bridge MoE recipes): CUDA-core fp32 rate, not the tensor cores."""
    persistent_grads: bool = True
    """Whether gradients live in a buffer that persists across steps (Megatron's contiguous grad
    buffer, DeepSpeed's partitioned gradients); False for PyTorch FSDP / TorchTitan, whose
    `zero_grad(set_to_none=True)` frees them, so that with one micro-batch per step the
    activation peak and the gradient peak do not coincide (`cost.memory.stage_memory`)."""
    cp_comm: list[CpCommName] = Field(default_factory=lambda: ["ring"])
    """Context-parallel forms the stack implements, its default first (the form its measured
    runs used when they do not say); empty: no context parallelism, the search keeps cp = 1."""
    cp_kv_replicate: bool = False
    """Whether the all-to-all form replicates KV heads up to the all-to-all group when the group
    is larger (DeepSpeed `UlyssesSPAttentionHF`: `kv_replication_factor`); False: the KV heads
    must divide by it (Transformer Engine)."""
    cp_allgather_overlap: bool = False
    """Whether the all-gather form issues its K, V all-gather with the first block of attention
    and hides it there (PyTorch `_AllGatherRotater`, TorchTitan); False: before attention,
    exposed (Transformer Engine `AttnFuncWithCPAndKVAllGather`)."""
    grads_side_stream: bool = False
    """Whether sharded gradients are allocated on a communication stream, in a caching-allocator
    pool the compute stream never reuses (PyTorch FSDP1's post-backward stream, FSDP2's
    reduce-scatter stream): the reserved figure then holds every gradient shard even where the
    allocated peak does not (`cost.device_memory.reserved_bytes`)."""
    unsharded_accumulation: bool = False
    """Whether the training loop runs FSDP's `no_sync()` between the micro-batches of a step
    (Lightning Fabric `no_backward_sync`, used by LitGPT): gradients then accumulate unsharded
    on every rank until the last micro-batch (`cost.memory.stage_memory`)."""
    world_group: bool = False
    """Whether a training step also runs collectives on the default (world) process group, apart
    from its parallel groups, so every rank holds one more NCCL communicator of all the job's
    GPUs (Megatron: barriers at initialisation, the gradient norm over the whole world with the
    distributed optimizer; `cost.device_memory.nccl_bytes`)."""
    transformer_engine: bool = False
    """Whether the linear layers are Transformer Engine modules, which allocate their own
    cuBLASLt workspace tensor beside PyTorch's (`cost.device_memory.workspace_bytes`)."""
    kernels: str | None = None
    """Name of the kernel family the stack runs, when it shares it with other stacks (e.g.
    `megatron-te`: Megatron-Core's layers on Transformer Engine and cuDNN attention, run by
    plain Megatron-Core and by NVIDIA's Megatron-Bridge recipes alike): the efficiency knobs are
    the kernels', so the stacks of one family are fitted together on their pooled runs
    (`benchmarks/calibrate_stacks.py`); their recipe defaults stay their own. None: the stack
    alone."""
    profile: dict[str, dict[str, float]] = Field(default_factory=dict)
    """GPU preset -> efficiency knobs fitted on this stack's runs on that GPU (with its kernel
    family's, `kernels`)."""
    profile_notes: dict[str, str] = Field(default_factory=dict)
    """GPU preset -> what its profile was fitted on."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Where each default comes from (field -> citation)."""

    @model_validator(mode="after")
    def _check(self) -> StackSpec:
        bad = {g: sorted(set(k) - set(STACK_KNOBS)) for g, k in self.profile.items()}
        bad = {g: k for g, k in bad.items() if k}
        if bad:
            raise ValueError(f"`profile` has knobs a stack may not set {bad}; allowed: "
                             f"{', '.join(STACK_KNOBS)}")
        for g, knobs in self.profile.items():
            Profile(**knobs)  # range checks of every knob (efficiencies in (0, 1], ...)
        if "bf16" not in self.precisions:
            raise ValueError("`precisions` must include bf16")
        if len(set(self.cp_comm)) != len(self.cp_comm):
            raise ValueError(f"`cp_comm` {self.cp_comm} names a form twice")
        return self

    def attention_for(self, generation: str) -> str:
        """The attention kernel class this stack runs on a GPU generation."""
        return self.attention.get(generation, self.attention.get("default", "flash"))
