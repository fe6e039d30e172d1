"""Compute time of the kernels one GPU runs: GEMMs, fused attention, memory-bound elementwise.

GEMM time is a roofline with a fixed cost (reference §7.2 rules 1 and 3):
max(2MNK / (eta * peak), bytes / (eta_hbm * BW)) + t_fixed, so that efficiency falls for the
small per-GPU matrices that high TP or small micro-batches produce (1024^3 GEMMs reach 14-38% of
peak, >= 8192^3 58-82%, reference §7.2 table).
"""

from __future__ import annotations

import numpy as np

from ..specs.precision import recipe
from ..specs.problem import Problem
from ..units import TFLOPS, US


def gemm_time(problem: Problem, M, N, K, count=1.0) -> np.ndarray:
    """Seconds for `count` GEMMs of (M x K) @ (K x N) in bf16 launched as one kernel (grouped)."""
    prof, gpu = problem.profile, problem.cluster.gpu
    M, N, K = (np.asarray(x, dtype=np.float64) for x in (M, N, K))
    flops = 2.0 * M * N * K * count
    bytes_moved = 2.0 * (M * K + K * N + M * N) * count
    t_math = flops / (prof.gemm_efficiency * gpu.bf16_tflops * TFLOPS)
    t_mem = bytes_moved / (prof.hbm_efficiency * gpu.hbm_tb_per_s * 1e12)
    return np.where(flops > 0, np.maximum(t_math, t_mem) + prof.gemm_overhead_us * US, 0.0)


def linear_time(problem: Problem, M, N, K, count=1.0) -> np.ndarray:
    """Seconds for `count` linear-layer GEMMs (M x K) @ (K x N) in the job's precision, forward.

    BF16/FP16: `gemm_time`. Low precision (docs/cost-model.md "Precision"): the GEMM runs at the
    FP8 or FP4 peak times its own efficiency knob, reading quantised operands; quantising the
    input is a memory-bound kernel that reads it in BF16 (2 bytes/element; once more for the
    amax of per-tensor current scaling) and writes it twice in the low-precision format, row- and
    column-wise, for the forward and the weight-gradient GEMMs (Transformer Engine's fused
    cast-transpose); NVFP4 also writes and reads the random-Hadamard-transformed copy (+4 bytes).
    Without a weight cache the stack re-quantises the weight every micro-batch (torchao float8:
    2 + 2q bytes per weight element). The backward is charged twice the forward (dgrad + wgrad
    GEMMs, quantising the output gradient like the input), as for every GEMM in the time model.
    """
    rec = recipe(problem.training.precision)
    if not rec.low:
        return gemm_time(problem, M, N, K, count)
    prof, gpu = problem.profile, problem.cluster.gpu
    M, N, K = (np.asarray(x, dtype=np.float64) for x in (M, N, K))
    q = rec.element_bytes
    if rec.peak == "fp4":
        peak, eff = gpu.fp4_tflops, prof.fp4_gemm_efficiency
    else:
        peak, eff = gpu.fp8_tflops, prof.fp8_gemm_efficiency
    flops = 2.0 * M * N * K * count
    t_math = flops / (eff * peak * TFLOPS)
    t_mem = (q * (M * K + K * N) + 2.0 * M * N) * count / (prof.hbm_efficiency * gpu.hbm_tb_per_s * 1e12)
    per_input = 2.0 + 2.0 * q + 2.0 * rec.amax_pass + 4.0 * rec.hadamard
    per_weight = 0.0 if problem.stack.low_precision_weight_cache else 2.0 + 2.0 * q
    cast = memory_bound_time(problem, count * (M * K * per_input + K * N * per_weight))
    fixed = prof.gemm_overhead_us * US
    return np.where(flops > 0, np.maximum(t_math, t_mem) + fixed + cast, 0.0)


def attention_time(problem: Problem, flops) -> np.ndarray:
    """Seconds for fused attention of `flops` at the efficiency of the job's kernel: cuDNN /
    FlashAttention-3 (`cudnn`) or FlashAttention-2 class (`flash`, `eager`); the kernels differ
    two-fold on Hopper (FA2 forward 33% of H100 peak, FA3/cuDNN 60-75%; reference §7.3)."""
    prof, gpu = problem.profile, problem.cluster.gpu
    eff = prof.cudnn_attention_efficiency if problem.training.attention == "cudnn" else prof.attention_efficiency
    return np.asarray(flops) / (eff * gpu.bf16_tflops * TFLOPS)


def memory_bound_time(problem: Problem, nbytes) -> np.ndarray:
    """Seconds to stream `nbytes` through HBM at the profile's achievable bandwidth."""
    prof, gpu = problem.profile, problem.cluster.gpu
    return np.asarray(nbytes) / (prof.hbm_efficiency * gpu.hbm_tb_per_s * 1e12)
