"""Cost terms of a recurrent (state-space or linear-attention) mixer layer: Mamba-2 and gated
DeltaNet share their shape, so one set of array functions prices both (`MixerArch` is built by
`cost.mamba` and `cost.linear_attention`).

Shape (Megatron-Core `MambaMixer` and `GatedDeltaNet`, 0.16.1): a pre-norm (h weights,
replicated), a column-parallel `in_proj` h -> `in_width`, a causal depthwise convolution over
`conv_channels`, the chunked scan over the layer's heads, a gated RMSNorm, and a row-parallel
`out_proj` `out_in` -> h. Tensor parallelism splits the heads and groups (every projection and
the scan divide by t; `nheads % tp`, `ngroups % tp` are asserted), and, like an attention block,
the layer ends in one all-reduce (or, with sequence parallelism, starts with an all-gather and
ends with a reduce-scatter) of the s b h activation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layouts import LayoutTable
from ..specs.problem import Problem
from ..units import TFLOPS
from .compute import linear_time, memory_bound_time

SCAN_BWD = 2.0
"""Scan backward FLOPs / forward: the chunked scan is a chain of matmuls (SSD paper arXiv
2405.21060 Sec. 6; gated DeltaNet arXiv 2412.06464 Sec. 3.3), whose backward computes a gradient
for each of the two operands of every matmul, twice the forward, as for every GEMM here."""


@dataclass(frozen=True)
class MixerArch:
    """Per-layer numbers of one recurrent mixer kind (counts, per token)."""

    letter: str
    """Pattern letter (`M` Mamba-2, `G` gated DeltaNet)."""
    hidden: int
    in_width: int
    """in_proj output columns (all TP-sharded)."""
    out_in: int
    """out_proj input width (TP-sharded); also the scan output width."""
    conv_channels: int
    conv_kernel: int
    small_params: float
    """Per-head and norm weights (A, D, dt bias, gated-norm weight, conv bias), TP-sharded."""
    scan_flops: float
    """Forward FLOPs per token of the chunked scan, whole layer (divided by t and c across GPUs)."""
    tp_units: tuple[int, ...]
    """Counts that TP must divide (heads, groups)."""
    cp_in: float
    """Per-token width the CP all-to-all moves into the scan (0: no CP on this mixer)."""
    cp_supported: bool
    """Whether Megatron-Core implements context parallelism for this mixer."""
    cp_units: tuple[int, ...] = ()
    """Counts that t x c must divide (Mamba's heads)."""
    scan_bytes: tuple[float, float] = (0.0, 0.0)
    """(forward, backward) HBM bytes per token the scan kernels read and write, whole layer
    (divided by t across GPUs); (0, 0): not counted, the scan is priced by its FLOPs alone."""

    @property
    def sharded_params(self) -> float:
        """Weights split over TP: in_proj, conv, per-head weights, out_proj."""
        return (self.hidden * self.in_width + self.conv_channels * self.conv_kernel
                + self.small_params + self.out_in * self.hidden)

    @property
    def params(self) -> float:
        """All weights of one layer: the TP-split ones plus the pre-norm (h)."""
        return self.sharded_params + self.hidden

    @property
    def gemm_params(self) -> float:
        """Weights the layer's GEMMs multiply each token through (in_proj, out_proj)."""
        return self.hidden * (self.in_width + self.out_in)

    def flops_per_token(self) -> float:
        """Forward FLOPs per token: the two projections (2 per weight) and the scan."""
        return 2.0 * self.gemm_params + self.scan_flops

    # activation bytes per token (bf16), reference §3.4 style: what the backward needs
    @property
    def act_rep(self) -> float:
        """Whole on every TP rank without SP: the norm input and the in_proj input, 2h + 2h."""
        return 4.0 * self.hidden

    @property
    def act_shard(self) -> float:
        """TP-sharded: the in_proj output (2 bytes x in_width, which the fused conv + scan kernel
        keeps and recomputes the conv and the states from in its backward), the scan output
        before the gated norm (2 x out_in) and the out_proj input (2 x out_in) (Megatron-Core
        `MambaMixer` memory-efficient path: `mamba_split_conv1d_scan_combined` saves `zxbcdt`
        and `out_x`; the separate TE `out_proj` saves its input)."""
        return 2.0 * self.in_width + 4.0 * self.out_in


def mixer_activation_bytes(problem: Problem, mx: MixerArch, t: LayoutTable,
                           recompute: np.ndarray | None = None) -> np.ndarray:
    """Bytes one GPU stores for one mixer layer and one micro-batch: tokens x (rep / (t with SP)
    + shard / t); full recompute keeps the layer input, 2 s b h (/t with SP); selective recompute
    (Megatron's `core_attn`) does not touch a mixer layer. CP divides the sequence."""
    s, b = problem.training.seq_len, t["mb"].astype(np.float64)
    tp, cp = t["tp"].astype(np.float64), t["cp"].astype(np.float64)
    rep_div = np.where(t["sp"] == 1, tp, 1.0)
    tokens = b * s / cp
    rc = t["rc"] if recompute is None else recompute
    stored = tokens * (mx.act_rep / rep_div + mx.act_shard / tp)
    return np.where(rc == 2, 2.0 * tokens * mx.hidden / rep_div, stored)


def scan_time(problem: Problem, flops, nbytes=0.0) -> np.ndarray:
    """Seconds of one pass of the chunked scan, a roofline of its two limits: its FLOPs at the
    profile's `scan_efficiency` of the dense BF16 peak (the SSD and delta-rule kernels run BF16
    tensor-core matmuls on chunk tiles; a knob of its own, not the GEMM efficiency, fitted on
    hybrid runs), and its kernels' HBM traffic `nbytes` (`MixerArch.scan_bytes`) at the
    achievable bandwidth (`memory_bound_time`; the kernels are memory-bound: the chunk states
    they pass between them are as large as the layer's activations, see `cost.mamba`)."""
    prof, gpu = problem.profile, problem.cluster.gpu
    compute = np.asarray(flops) / (prof.scan_efficiency * gpu.bf16_tflops * TFLOPS)
    return np.maximum(compute, memory_bound_time(problem, nbytes))


def scan_limits(problem: Problem, mx: MixerArch, t: LayoutTable) -> tuple[np.ndarray, np.ndarray]:
    """(compute, memory) seconds of one mixer layer's scan, forward + backward, one micro-batch
    on one GPU: its FLOPs at the `scan_efficiency` ceiling, and its kernels' bytes at the
    achievable HBM bandwidth. The scan takes the longer of the two in each pass (`scan_time`);
    which one binds is what a user tuning the knob needs to know."""
    prof, gpu = problem.profile, problem.cluster.gpu
    T = t["mb"].astype(np.float64) * problem.training.seq_len / t["cp"]
    tp = t["tp"].astype(np.float64)
    flops = (1.0 + SCAN_BWD) * T * mx.scan_flops / tp
    compute = flops / (prof.scan_efficiency * gpu.bf16_tflops * TFLOPS)
    return compute, memory_bound_time(problem, T * sum(mx.scan_bytes) / tp)


def mixer_forward(problem: Problem, mx: MixerArch, t: LayoutTable):
    """(gemm, scan, scan backward, elementwise) forward seconds of one mixer layer, one
    micro-batch, one GPU (the scan's backward is a roofline of its own: `SCAN_BWD` x the FLOPs,
    and the backward kernels' bytes).

    GEMMs: in_proj (T x h) @ (h x in_width / t) and out_proj (T x out_in / t) @ (out_in / t x h),
    in the job's precision (linear layers: Transformer Engine quantises them). Scan: the SSD /
    delta-rule FLOPs of the T local tokens over the local heads (/ t), at `scan_efficiency`, or
    its kernels' bytes at HBM bandwidth where that is longer (`scan_time`).
    Elementwise (conv, gating, norms): memory-bound, writing and re-reading what the layer stores
    (the transformer layers' rule, `elementwise_factor`)."""
    s = problem.training.seq_len
    b = t["mb"].astype(np.float64)
    tp, cp = t["tp"].astype(np.float64), t["cp"].astype(np.float64)
    T = b * s / cp
    h = mx.hidden
    gemm = linear_time(problem, T, mx.in_width / tp, h) + linear_time(problem, T, h, mx.out_in / tp)
    fwd_bytes, bwd_bytes = mx.scan_bytes
    scan = scan_time(problem, T * mx.scan_flops / tp, T * fwd_bytes / tp)
    scan_bwd = scan_time(problem, SCAN_BWD * T * mx.scan_flops / tp, T * bwd_bytes / tp)
    stored = mixer_activation_bytes(problem, mx, t, recompute=np.zeros_like(t["rc"]))
    elem = memory_bound_time(problem, 2.0 * problem.profile.elementwise_factor * stored)
    return gemm, scan, scan_bwd, elem


def mixer_cp_bytes(problem: Problem, mx: MixerArch, t: LayoutTable):
    """(into-scan, out-of-scan) bytes per GPU of Mamba's context-parallel all-to-alls in one
    forward (Megatron-Core `MambaContextParallel`: `_all_to_all_cp2hp` of z, x, B, C and dt before
    the conv and scan, `_all_to_all_hp2cp` of the scan output after: the sequence shards become
    head shards and back), bf16, on the T local tokens and the TP rank's heads."""
    s = problem.training.seq_len
    T = t["mb"].astype(np.float64) * s / t["cp"]
    tp = t["tp"].astype(np.float64)
    return 2.0 * T * mx.cp_in / tp, 2.0 * T * mx.out_in / tp
