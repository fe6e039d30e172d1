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
  * NCCL: each communicator a rank belongs to (one per parallel group of size > 1) holds, per
    channel and per peer connection, a buffer of NCCL_BUFFSIZE = 4 MiB for the SIMPLE protocol
    (NCCL environment-variable docs) plus the LL/LL128 buffers; with the ring and the tree
    algorithm and the 8-16 channels NCCL opens inside an NVLink node that is ~16 x 2 x 4 MiB =
    128 MiB per communicator (`NCCL_PER_COMMUNICATOR`). The groups a rank is in follow from the
    layout (`communicators`).
  * Workspaces are not added here: PyTorch's cuBLAS workspace (32 MiB per handle on Hopper,
    CUBLAS_WORKSPACE_CONFIG default, PyTorch docs "Reproducibility") and Transformer Engine's
    cuBLASLt workspace (transformer_engine get_cublas_workspace_size_bytes) are tensors from the
    caching allocator, inside `memory_overhead_gib`.
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
NCCL_PER_COMMUNICATOR = 16 * 2 * 4 * MiB
"""NCCL buffers per communicator: 16 channels x 2 connections x NCCL_BUFFSIZE 4 MiB."""


def communicators(t: LayoutTable) -> np.ndarray:
    """Communicators (NCCL process groups of size > 1) one rank belongs to: data-parallel
    (DP, and DP x CP for the gradient reduction when cp > 1), tensor, pipeline (the P2P pair to
    each neighbour, plus the embedding group tying first and last stage), context and expert
    parallel groups (Megatron-Core parallel_state.initialize_model_parallel builds these)."""
    dp, tp, pp, cp, ep = (t[k] for k in ("dp", "tp", "pp", "cp", "ep"))
    n = (dp > 1).astype(np.float64) + (tp > 1) + (cp > 1) + (ep > 1)
    n = n + ((dp > 1) & (cp > 1))  # DP x CP gradient group
    n = n + np.where(pp > 1, 3.0, 0.0)  # send/recv to the previous and next stage + embedding group
    return n


def reserved_bytes(allocated: np.ndarray) -> np.ndarray:
    """`max_memory_reserved` from the allocated peak (module docstring)."""
    return allocated * (1.0 + FRAGMENTATION) + BLOCK_ROUNDING


def outside_allocator_bytes(t: LayoutTable) -> np.ndarray:
    """What `nvidia-smi` shows beyond the caching allocator's reserve: CUDA context and the NCCL
    buffers of every communicator the rank is in."""
    return CUDA_CONTEXT + NCCL_PER_COMMUNICATOR * communicators(t)
