"""Training-job specification: sequence length, batch, precision recipe, memory headroom."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from ..limits import MAX_GLOBAL_BATCH, MAX_SEQ_LEN
from ._base import Spec
from .precision import PrecisionName
from .stack import CudaGraphs, ModelCodeName, MoEDispatcher, MoERouting, OffloadModules


class TrainingSpec(Spec):
    """One training job. Batch sizes count sequences."""

    seq_len: PositiveInt = Field(le=MAX_SEQ_LEN)
    """Tokens per sequence s (at most 2^24, `limits.MAX_SEQ_LEN`)."""
    global_batch: PositiveInt = Field(le=MAX_GLOBAL_BATCH)
    """Sequences per optimizer step (global batch size; at most 2^24, `limits.MAX_GLOBAL_BATCH`)."""
    grad_dtype: Literal["bf16", "fp32"] = "bf16"
    """Gradient storage: `bf16` gives the seed's 16 bytes/parameter (2 param + 2 grad + 12 Adam);
    `fp32` gives Megatron's 18 (main grads kept in fp32; reference §1.2)."""
    usable_fraction: float | None = Field(None, gt=0, le=1)
    """Share of HBM the allocated peak may fill (the seed's rule, e.g. 0.9); None: the reserved
    peak (allocated + the allocator's fitted fragmentation reserve) against the capacity less the
    CUDA context and NCCL memory (`cost.device_memory`)."""
    attention: Literal["flash", "cudnn", "eager"] = "flash"
    """`flash`: fused FlashAttention-2-class kernel, no s^2 scores stored; `cudnn`: the cuDNN fused
    attention / FlashAttention-3 of Transformer Engine (Megatron-Core, NeMo), same memory as
    `flash`, its own efficiency; `eager`: scores materialised (ref §3.1-3.2, §7.3)."""

    precision: PrecisionName = "bf16"
    """Numeric recipe of the linear layers (`specs.precision`)."""
    stack: str = "megatron-core"
    """Name of the software stack (its settings are on `Problem.stack`)."""
    optimizer_dtype: Literal["fp32", "bf16"] = "fp32"
    """AdamW state: `fp32` master weights + two moments, 12 bytes/parameter (ZeRO paper Sec. 3.1);
    `bf16`: two bf16 moments and no master copy, 4 bytes/parameter (Lightning "bf16-true", where
    the whole model and optimizer run in bf16: LitGPT's ~8 bytes/parameter with bf16 weights and
    gradients)."""
    model_code: ModelCodeName = "fused"
    """What the model's code saves for backward beyond the fused-kernel ledger (`cost.model_code`)."""
    torch_compile: bool = False
    """torch.compile over model and loss: the model code's extras and the loss's fp32 copies are
    fused away (`cost.model_code.compiled`)."""
    autocast: bool = False
    """fp32 weights under torch.autocast, which caches the 16-bit cast of each weight for the
    forward (`cost.memory.stage_memory`)."""
    grad_reduce_dtype: Literal["bf16", "fp32"] | None = None
    """Dtype of the data-parallel gradient reduction; None = the gradient buffer's dtype."""

    moe_dispatcher: MoEDispatcher = "alltoall"
    """MoE token dispatcher (`cost.moe_dispatch`)."""
    moe_a2a_overlap: bool = False
    """EP all-to-all overlapped with another micro-batch's compute (Megatron
    `--overlap-moe-expert-parallel-comm`; `cost.moe_layer.exposed_dispatch`)."""
    moe_routing: MoERouting = "dropless"
    """Token routing: dropless, balanced (forced) or capacity (token dropping)."""
    moe_capacity_factor: float = Field(1.0, gt=0)
    """With capacity routing: an expert's token capacity in units of its balanced share."""
    cuda_graphs: CudaGraphs = "none"
    """CUDA graph capture: none, scoped (attention and MoE router/preprocess), full."""
    offload_modules: OffloadModules = "none"
    """MoE modules whose saved input is offloaded to the host (`cost.offload`)."""

    tp_comm_overlap: bool = False
    """Whether tensor-parallel collectives are overlapped with the GEMMs that produce and consume
    them (Megatron `--tp-comm-overlap` with Transformer Engine userbuffers, TorchTitan async TP):
    each collective is split and pipelined with the GEMM it feeds or follows, so it hides behind
    that GEMM's time and only the excess is exposed."""

    fp8_param_gather: bool = False
    """Whether a low-precision recipe's linear weights are kept in the recipe's format only and
    all-gathered in it (Megatron-Core `DistributedDataParallelConfig.fp8_param_gather`: "keep the
    compute param in fp8 (do not use any other intermediate dtype) and perform the param
    all-gather in fp8"; `--fp4-param-gather` for NVFP4). Ignored in BF16."""

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element."""
        return 2 if self.grad_dtype == "bf16" else 4

    @property
    def grad_reduce_bytes(self) -> int:
        """Bytes per gradient element on the wire of the data-parallel reduction."""
        dtype = self.grad_reduce_dtype or self.grad_dtype
        return 2 if dtype == "bf16" else 4

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer-state bytes per parameter (12 fp32 master + Adam moments, 4 bf16 moments)."""
        return 12 if self.optimizer_dtype == "fp32" else 4

    @property
    def bytes_per_param(self) -> int:
        """Model-state bytes per parameter without sharding (16 or 18; 8 with bf16 optimizer state)."""
        return 2 + self.grad_bytes + self.optimizer_bytes

    @property
    def tokens_per_step(self) -> int:
        """Tokens processed per optimizer step."""
        return self.seq_len * self.global_batch
