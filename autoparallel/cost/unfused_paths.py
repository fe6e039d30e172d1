"""Memory-bound passes of the code paths Megatron-Core runs unfused for some model features.

The layers' elementwise time (`cost.time._elementwise`) follows what the fused kernels store, with
the stack's fitted factor. Two model features send Megatron-Core (with Transformer Engine) down
eager PyTorch code instead, whose passes over HBM are counted here op by op, 2-byte elements, reads
plus writes, forward and backward (autograd's rule for each op), as bytes per element:

- **Unfused RoPE.** `apply_rotary_pos_emb` (megatron/core/models/common/embeddings/rope_utils.py,
  megatron-core 0.16) takes TE's fused kernel only when the YaRN concentration factor is 1
  ("mscale=... is not supported by TE's fused RoPE. Using unfused implementation.";
  `YarnSpec.concentration`: gpt-oss 1.347). `_apply_rotary_pos_emb_bshd` then runs, on Q and on
  K: `t * cos` (read 2 + write 2), `_rotate_half` = a negation of one half (2 per element of t)
  and a `cat` (4), `* sin` (4), the sum (6) and `cat((t, t_pass))` (4): 24 bytes forward. Backward:
  `g * sin` (4), the negation (2), the `cat` that assembles the chunks' gradients (4), `g * cos`
  (4) and the sum of the two gradients (6): 20. TE's fused kernel reads and writes t once each
  way (4 + 4), which the elementwise rule already holds: the extra is 20 forward, 16 backward,
  per element of the rank's Q (a d_h / tp) and K (g d_h / min(tp, g)) heads.
- **Routed experts' second bias.** With `add_bias_linear`, `TEGroupedMLP` builds FC2 with
  `skip_bias_add` and adds the bias scaled by each token's routing probability after the grouped
  GEMM, expert by expert (megatron/core/transformer/moe/experts.py `_apply_bias`:
  `cat([t + b * p for ...])`): the broadcast product (write 2), the sum (read 4, write 2) and the
  `cat` (read 2, write 2), 12 bytes forward per element of the X x h FC2 output; backward, the
  product's two gradients (`G * p` summed over tokens, `G * b` summed over h: 6 each) and the
  `cat` that joins the split pieces' gradients (4): 16. The first bias is fused into the
  activation kernel (`weighted_bias_swiglu_impl` / `weighted_bias_quick_geglu_impl`), and a dense
  linear's into TE's GEMM: no extra.

Both apply to Megatron-Core model code with Transformer Engine (`StackSpec.transformer_engine`,
model code `fused`); other stacks' model code is timed by their own fitted elementwise factor.
The per-expert kernel launches of `_apply_bias` (three forward, about six backward per local
expert) are not charged.
"""

from __future__ import annotations

import numpy as np

from ..layouts import LayoutTable
from ..specs.problem import Problem
from .arch import Arch
from .compute import memory_bound_time
from .moe_layer import routed_rows

ROPE_EXTRA_BYTES = (20.0, 16.0)
"""Unfused RoPE over TE's fused kernel, bytes per element of Q and K (forward, backward)."""
EXPERT_BIAS_BYTES = (12.0, 16.0)
"""`_apply_bias` per element of the routed FC2 output (forward, backward)."""


def megatron_code(problem: Problem) -> bool:
    """Whether the model runs Megatron-Core's code with Transformer Engine (module docstring)."""
    return bool(problem.stack.transformer_engine) and problem.training.model_code == "fused"


def unfused_seconds(problem: Problem, arch: Arch, t: LayoutTable, moe: bool):
    """(forward, backward) seconds one layer of a kind adds per micro-batch on one rank for the
    unfused paths (module docstring); zeros where none applies."""
    zero = np.zeros(len(t))
    if not megatron_code(problem):
        return zero, zero
    fwd, bwd = zero, zero
    if arch.rope_concentration != 1.0:
        tp = t["tp"].astype(np.float64)
        tokens = t["mb"].astype(np.float64) * problem.training.seq_len / t["cp"]
        widths = (arch.n_heads * arch.qk_head_dim / tp
                  + arch.n_kv_heads * arch.qk_head_dim / np.minimum(tp, arch.n_kv_heads))
        elements = tokens * widths
        fwd = fwd + memory_bound_time(problem, ROPE_EXTRA_BYTES[0] * elements)
        bwd = bwd + memory_bound_time(problem, ROPE_EXTRA_BYTES[1] * elements)
    if moe and arch.expert_bias:  # over the rows the grouped GEMMs multiply
        elements = routed_rows(problem, arch, t) * arch.hidden
        fwd = fwd + memory_bound_time(problem, EXPERT_BIAS_BYTES[0] * elements)
        bwd = bwd + memory_bound_time(problem, EXPERT_BIAS_BYTES[1] * elements)
    return fwd, bwd
