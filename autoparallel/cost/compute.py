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


ATTN_BWD = 2.5
"""Flash-attention backward matmul FLOPs / forward (reference §2.4: the backward recomputes
S = QK^T and computes dP, dV, dQ, dK: 5 matmuls against the forward's 2)."""


def attention_time(problem: Problem, flops, exps=0.0, backward: bool = False) -> np.ndarray:
    """Seconds for fused attention of `flops` forward matmul FLOPs (the backward's are ATTN_BWD
    times as many) at the efficiency of the job's kernel: cuDNN / FlashAttention-3 (`cudnn`) or
    FlashAttention-2 class (`flash`, `eager`); the kernels differ two-fold on Hopper (FA2 forward
    33% of H100 peak, FA3/cuDNN 60-75%; reference §7.3).

    The softmax's `exps` exponentials, one per score in the forward and one in the backward
    (which recomputes P = exp(S - LSE)), run on the special function units at the GPU's
    `sfu_exp_tera_per_s`, overlapped with the matmuls of other tiles (FlashAttention-3's
    ping-pong and intra-warpgroup pipelining), so a pass takes the longer of the two. The
    exponentials bind only where the tensor cores outrun the SFUs: never on Hopper (H100: 989
    TFLOP/s of matmul against 3.9 T exponentials/s, FlashAttention-3 paper; 512 FLOPs per score
    at head dim 128), just short of it on Blackwell in BF16 at head dim 128 (2.25 PFLOP/s
    against 5 T/s), and for smaller heads; Blackwell Ultra doubles the rate to 10.7 T/s (NVIDIA
    "Making Softmax More Efficient with NVIDIA Blackwell Ultra": on GB200 the tensor cores wait
    for the SFUs, ~35 % more FP8 attention forward throughput on GB300). Fused kernels only:
    eager attention's softmax is a memory-bound kernel of its own."""
    prof, gpu = problem.profile, problem.cluster.gpu
    kind = problem.training.attention
    eff = prof.cudnn_attention_efficiency if kind == "cudnn" else prof.attention_efficiency
    mma = np.asarray(flops) * (ATTN_BWD if backward else 1.0) / (eff * gpu.bf16_tflops * TFLOPS)
    if gpu.sfu_exp_tera_per_s is None or kind == "eager":
        return mma
    return np.maximum(mma, np.asarray(exps) / (gpu.sfu_exp_tera_per_s * TFLOPS))


def memory_bound_time(problem: Problem, nbytes) -> np.ndarray:
    """Seconds to stream `nbytes` through HBM at the profile's achievable bandwidth."""
    prof, gpu = problem.profile, problem.cluster.gpu
    return np.asarray(nbytes) / (prof.hbm_efficiency * gpu.hbm_tb_per_s * 1e12)
