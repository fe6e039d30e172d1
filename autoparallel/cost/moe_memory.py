"""Memory of the MoE block beyond the parameter shards (which `cost.memory.stage_params` splits
over ETP x EP, their states over EDP): what one rank stores for backward per MoE layer and
micro-batch, and the dispatcher's own buffers.

Routed experts (Megatron-Core `TEGroupedMLP` behind the alltoall / flex dispatchers): each rank
holds X = etp x k x T_r routed token copies (T_r = b s / (cp tp): the tokens it routes;
`cost.moe_dispatch.routed_tokens`), times the routing's imbalance on the busiest rank
(`cost.moe_layer.imbalance`: the capacity factor with padding). With expert TP the all-gather
after the all-to-all hands every expert-TP rank the whole routed input of its group, so the
expert FC1 input, 2 h bytes per copy, is not divided by etp (with etp = tp, Megatron's default:
2 h k T bytes per rank, not / t); the FC1 output and activation, c_f f_e bytes per copy, are
(each rank computes f_e / etp columns). Per copy (reference §3.5, derived from Megatron-Core's
grouped MLP): the permuted FC1 input 2h (kept for the weight gradient), the FC1 output and the
activation's output c_f f_e / etp (SwiGLU: 4 f_e + 2 f_e), and the routing probability in fp32
(4 bytes), which the activation multiplies in since MCore v0.13 ("memory efficient token
permutation by moving the probs multiplication from unpermutation to activation function",
MoE README), so the combine (unpermute) keeps nothing. With a
low-precision recipe on a stack that saves quantised linear inputs (Transformer Engine), the
FC1 and FC2 inputs (2h and 2 f_e / etp per copy) are kept at the recipe's element size.

DeepEP reserves its own communication buffers outside PyTorch's allocator (NVLink buffer via
cudaMalloc/IPC, RDMA buffer via NVSHMEM): `dispatch_buffer_bytes`.
"""

from __future__ import annotations

import numpy as np

from ..layouts import LayoutTable
from ..specs.precision import recipe
from ..specs.problem import Problem
from .arch import Arch
from .moe_dispatch import routed_tokens

DEEPEP_NUM_SMS = 20
"""DeepEP `Buffer.num_sms` default (deep_ep/buffers/legacy.py): 10 channels of 2 SMs."""
DEEPEP_NVL_RECV_TOKENS = ((8, 256), (64, 288), (96, 480), (128, 560), (1 << 30, 720))
"""`num_max_nvl_chunked_recv_tokens` of DeepEP's recommended dispatch configs by EP size
(`Buffer.get_dispatch_config`: 256 up to 8 ranks, 288 for 16-64, 480 for 96, 560 for 128,
720 above)."""
DEEPEP_RDMA_RECV_TOKENS = 128
"""`num_max_rdma_chunked_recv_tokens` of every recommended config."""
DEEPEP_TOKEN_EXTRA = 8 + 128 * 8 + 128 * 4 + 128 * 4
"""Per received token besides the hidden bytes (csrc/legacy/config.hpp size hints): source meta
8, top-k indices 128 x int64, top-k weights 128 x fp32, scales 128 x fp32."""
PROB_BYTES = 4.0
"""fp32 routing probability kept per routed copy for the activation's backward."""
NVL_PEERS = 8
"""`LEGACY_NUM_MAX_NVL_PEERS`: ranks one NVLink buffer serves; more ranks go over RDMA."""


def routed_copies(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Routed token copies one rank holds per MoE layer and micro-batch: etp x k x T_r x the
    routing's imbalance (module docstring)."""
    from .moe_layer import imbalance

    return t["etp"] * arch.top_k * routed_tokens(problem, t) * imbalance(problem)


def _linear_bytes(problem: Problem) -> float:
    """Bytes per stored linear-input element: the recipe's where the stack saves quantised
    inputs, else 2 (BF16)."""
    rec = recipe(problem.training.precision)
    if rec.low and problem.stack.low_precision_activations:
        return float(rec.element_bytes)
    return 2.0


def routed_activation_bytes(problem: Problem, arch: Arch, t: LayoutTable,
                            low_precision: bool = True) -> np.ndarray:
    """Bytes the routed experts of one MoE layer store per micro-batch on one rank: per copy
    2h + c_f f_e / etp + 4, the FC1 and FC2 inputs (2h + 2 f_e / etp) at the recipe's element
    size with `low_precision` (module docstring)."""
    X = routed_copies(problem, arch, t)
    f = arch.expert_ffn / t["etp"]
    per = 2.0 * arch.hidden + arch.act_coef * f + PROB_BYTES
    if low_precision:
        per = per - (2.0 - _linear_bytes(problem)) / 2.0 * (2.0 * arch.hidden + 2.0 * f)
    return X * per


def moe_act_bytes(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """What recomputing the experts' activation (`moe_act`) frees: the FC2 inputs, 2 f_e / etp
    bytes per copy (at the recipe's element size where stored quantised)."""
    return routed_copies(problem, arch, t) * _linear_bytes(problem) * arch.expert_ffn / t["etp"]


def dispatch_buffer_bytes(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Bytes DeepEP reserves per GPU (0 for the other dispatchers): its NVLink buffer,
    channels x NVLink ranks x recv tokens x (2h + `DEEPEP_TOKEN_EXTRA`), and beyond 8 ranks its
    RDMA buffer, channels x RDMA ranks x 128 x (2h + extra + 16) x 2 (send and receive)
    (csrc/legacy/config.hpp `get_nvl_buffer_size_hint`, `get_rdma_buffer_size_hint`; Megatron
    passes 2h hidden bytes, fused_a2a.py `get_hidden_bytes`)."""
    if not arch.n_experts or problem.training.moe_dispatcher != "deepep":
        return np.zeros(len(t))
    ep = t["ep"].astype(np.float64)
    channels = DEEPEP_NUM_SMS / 2
    hidden = 2.0 * arch.hidden
    recv = np.select([ep <= n for n, _ in DEEPEP_NVL_RECV_TOKENS],
                     [r for _, r in DEEPEP_NVL_RECV_TOKENS])
    nvl_ranks = np.minimum(ep, NVL_PEERS)
    rdma_ranks = np.maximum(ep / NVL_PEERS, 1.0)
    nvl = channels * nvl_ranks * recv * (hidden + DEEPEP_TOKEN_EXTRA)
    rdma = np.where(ep > NVL_PEERS, channels * rdma_ranks * DEEPEP_RDMA_RECV_TOKENS
                    * (hidden + DEEPEP_TOKEN_EXTRA + 16.0) * 2.0, 0.0)
    return np.where(ep > 1, nvl + rdma, 0.0)
