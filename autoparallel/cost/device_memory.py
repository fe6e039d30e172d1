"""From the ledger (what `torch.cuda.max_memory_allocated` reports) to what the caching allocator
reserves (`max_memory_reserved`, what TorchTitan prints) and what `nvidia-smi` shows.

- **Reserved** = allocated x (1 + `FRAGMENTATION`) + `BLOCK_ROUNDING`. The PyTorch caching
  allocator rounds every request up to a multiple of 512 bytes, serves requests <= 1 MiB from
  2 MiB segments, 1-10 MiB requests from 20 MiB segments and rounds larger segments up to 2 MiB
  (PyTorch docs, "CUDA semantics - memory management"; c10/cuda/CUDACachingAllocator.cpp
  kMinBlockSize 512, kSmallBuffer 2 MiB, kLargeBuffer 20 MiB, kRoundLarge 2 MiB). Freed blocks
  stay cached, so the reserve also holds the holes that activations of varying sizes leave
  (fragmentation). `FRAGMENTATION` is fitted on the runs that report both figures, one per source
  (memory_runs.csv: Megatron-LM issue 525, 28.82 GiB allocated / 29.97 GiB reserved = +4.0 %;
  Megatron-Bridge's Moonlight-16B recompute guide, 36.6 GB peak allocated / "max reserved stayed
  near 40 GB" = +9.2 %): their geometric mean, +6.6 %. With `expandable_segments:True`
  (PYTORCH_CUDA_ALLOC_CONF; PyTorch docs) segments grow in place and the holes mostly vanish; the
  planner does not assume it.
- **Device** = reserved + CUDA context + NCCL communicator buffers, neither of which goes through
  the caching allocator (cuBLAS / Transformer Engine workspaces do: PyTorch and TE allocate them as
  tensors, so they are in the ledger's `overhead`, `Profile.memory_overhead_gib`).
  * CUDA context: 0.3-0.6 GiB per process (CUDA C Programming Guide, lazy loading, CUDA 11.7+
    keeps the lower end; measured on A100/H100 with PyTorch: ~0.5 GiB). We use `CUDA_CONTEXT`.
  * NCCL: each communicator a rank belongs to (one per parallel group of size > 1, created when
    first used) holds, per channel and per peer connection, NCCL_BUFFSIZE = 4 MiB SIMPLE buffers
    plus the LL/LL128 buffers and its device-side structures; memory grows linearly with the
    channels NCCL opens to reach NVLink bandwidth and with the algorithms' connections (NCCL
    maintainers, NVIDIA/nccl #864 / #986). Measured through PyTorch on 4 x A100 NVLink (NVIDIA/nccl
    #964): creating a group and running one all-reduce raised device memory by 544 MB for a
    2-GPU group and 688 MB for a 3-4 GPU group (`NCCL_PER_PAIR`, `NCCL_PER_COMMUNICATOR`). Hopper
    opens more channels and, on NVSwitch systems, NVLS buffers (the NeMo launcher and JAX-Toolbox
    set NCCL_NVLS_ENABLE=0 to save that memory), so these are lower bounds there. The groups a
    rank is in follow from the layout (`nccl_bytes`).
  * Workspaces are not added here: they are tensors from the caching allocator, inside the
    allocated figure (`workspace_bytes`, the ledger's `overhead`).
- **Side-stream gradients** (`reserved_bytes` with `side_grads`): PyTorch FSDP allocates every
  sharded gradient on a communication stream (FSDP1: `_reduce_grad` under the post-backward
  stream; FSDP2: `foreach_reduce`'s reduce-scatter output, "allocated in the RS stream", whose
  views are the sharded gradients; torch/distributed/fsdp 2.x), and the caching allocator hands
  a freed block back only to the stream that allocated it (c10/cuda/CUDACachingAllocator.cpp
  `get_free_block`: `(*it)->stream != p.stream()` fails the search). Gradients freed by
  `zero_grad(set_to_none=True)` therefore stay reserved in that stream's pool through the next
  step's forward: the reserved peak is the compute stream's reserve without them plus the whole
  gradient shard in the reduction dtype, even where the allocated peak (one micro-batch per
  step) does not hold them (`cost.memory`).
"""

from __future__ import annotations

import numpy as np

from ..layouts import LayoutTable
from ..units import GiB, MiB

FRAGMENTATION = 0.066
"""Reserved / allocated - 1 at the peak, fitted across two sources (module docstring)."""
BLOCK_ROUNDING = 2 * MiB
"""Rounding of the last large segment to 2 MiB and the small-block pool's first 2 MiB segment."""
CUDA_CONTEXT = 0.5 * GiB
"""CUDA context per process (0.3-0.6 GiB, module docstring)."""
NCCL_PER_COMMUNICATOR = 688e6
"""NCCL device memory per communicator of 3+ GPUs (NVIDIA/nccl #964: 688 MB, 4 x A100 NVLink)."""
NCCL_PER_PAIR = 544e6
"""NCCL device memory per 2-GPU communicator (NVIDIA/nccl #964: 544 MB), e.g. a P2P pipeline pair."""


def nccl_bytes(t: LayoutTable, tied_embeddings: bool = True,
               world_group: bool = False) -> np.ndarray:
    """NCCL device memory of one rank: `NCCL_PER_COMMUNICATOR` per group of 3+ GPUs and
    `NCCL_PER_PAIR` per 2-GPU group, for the groups Megatron-Core's initialize_model_parallel
    builds and a training step uses (PyTorch creates a communicator at its first collective): DP,
    TP, CP, EP, DP x CP, the pipeline's P2P pairs (one neighbour at pp = 2, two beyond) and, with
    tied embeddings only, the embedding group of the first and last stage (Megatron all-reduces
    the shared embedding's gradient there; `_allreduce_embedding_grads`).

    With `world_group` (`StackSpec.world_group`), also the default process group of all the
    job's GPUs, a communicator of its own beside the parallel groups (each
    `torch.distributed.new_group` is a separate ProcessGroupNCCL, even over the same ranks).
    Megatron runs collectives on it in every version: `torch.distributed.barrier()` in
    `initialize_megatron` (Megatron-LM v2.5 `megatron/initialize.py`, core_v0.6.0
    `megatron/training/initialize.py`), the start-time all-reduce of `pretrain` (core_v0.19.0
    `megatron/training/training.py`), and with the distributed optimizer the gradient norm
    "over all ranks" (core_v0.6.0 `DistributedOptimizer.get_model_parallel_group`: "the model
    parallel group is the entire world", returning None, the default group)."""
    dp, tp, pp, cp, ep = (t[k].astype(np.float64) for k in ("dp", "tp", "pp", "cp", "ep"))

    def group(size):
        return np.where(size > 2, NCCL_PER_COMMUNICATOR, np.where(size == 2, NCCL_PER_PAIR, 0.0))

    out = group(dp) + group(tp) + group(cp) + group(ep) + np.where(cp > 1, group(dp * cp), 0.0)
    pairs = np.where(pp > 2, 2.0, np.where(pp == 2, 1.0, 0.0))  # P2P neighbours
    pairs = pairs + np.where((pp > 1) & tied_embeddings, 1.0, 0.0)  # embedding group
    if world_group:  # EP folds inside dp x tp x cp x pp: the world is their product
        out = out + group(dp * tp * pp * cp)
    return out + pairs * NCCL_PER_PAIR


TORCH_CUBLAS_WORKSPACE = {"sm90": 4096 * 8 * 1024, "other": 4096 * 1024 * 2 + 16 * 1024 * 8}
"""PyTorch's cuBLAS workspace per (handle, stream), taken from the caching allocator (aten/src/
ATen/cuda/CublasHandlePool.cpp `parseChosenWorkspaceSize`: CUBLAS_WORKSPACE_CONFIG default
":4096:8" = 32 MiB on sm90 and later, ":4096:2:16:8" = 8 MiB + 128 KiB before; cuBLASLt shares it,
TORCH_CUBLASLT_UNIFIED_WORKSPACE default)."""
HIPBLASLT_WORKSPACE = 76 * 1024 * 1024
"""hipBLASLt workspace on ROCm (the same file, `parseCUDABlasLtWorkspaceSize`: 76 MiB)."""
TE_CUBLAS_WORKSPACE = {"sm90": 32 * 1024 * 1024, "other": 4 * 1024 * 1024}
"""Transformer Engine's cuBLASLt workspace tensor (transformer_engine/pytorch/cpp_extensions/
gemm.py `get_cublas_workspace_size_bytes`: 32 MiB on Hopper and later, 4 MiB before)."""
TE_GROUPED_STREAMS = 4
"""Extra TE workspaces for grouped GEMMs (MoE experts): one per compute stream,
`get_num_cublas_streams()` = 4 (transformer_engine/pytorch/cpp_extensions/gemm.py)."""


def workspace_bytes(generation: str, transformer_engine: bool, moe: bool) -> float:
    """GEMM workspaces one GPU's process holds in the caching allocator: PyTorch's cuBLAS
    workspace for the compute stream (autograd runs each backward op on its forward op's stream),
    hipBLASLt's on ROCm, and with Transformer Engine its own workspace, times 1 + 4 with grouped
    expert GEMMs. These are the fixed part of the allocated figure; the rest of it scales with
    the layout (ledger items)."""
    sm90 = "sm90" if generation in ("hopper", "blackwell") else "other"
    out = float(TORCH_CUBLAS_WORKSPACE[sm90])
    if generation == "cdna3":
        out += HIPBLASLT_WORKSPACE
    if transformer_engine:
        out += TE_CUBLAS_WORKSPACE[sm90] * (1 + (TE_GROUPED_STREAMS if moe else 0))
    return out


def reserved_bytes(allocated: np.ndarray, side_grads: np.ndarray | float = 0.0,
                   grads_at_peak: np.ndarray | float = 0.0) -> np.ndarray:
    """`max_memory_reserved` from the allocated peak (module docstring): the compute stream's
    reserve, allocated x (1 + `FRAGMENTATION`) + `BLOCK_ROUNDING`, plus, for gradients allocated
    on a communication stream (`side_grads`: the whole shard, bytes), that stream's pool in
    place of the `grads_at_peak` the allocated peak holds."""
    compute = allocated - grads_at_peak
    return compute * (1.0 + FRAGMENTATION) + BLOCK_ROUNDING + side_grads


def outside_allocator_bytes(t: LayoutTable, tied_embeddings: bool = True,
                            world_group: bool = False) -> np.ndarray:
    """What `nvidia-smi` shows beyond the caching allocator's reserve: CUDA context and the NCCL
    memory of every communicator the rank uses (`nccl_bytes`)."""
    return CUDA_CONTEXT + nccl_bytes(t, tied_embeddings, world_group)
