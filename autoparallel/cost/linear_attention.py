"""Gated DeltaNet linear-attention layers (Yang, Kautz & Hatamizadeh 2024, arXiv 2412.06464;
Qwen3-Next's `linear_attention` layers) as Megatron-Core builds them
(megatron/core/ssm/gated_delta_net.py, 0.16.1), priced by `cost.ssm_mixer`.

- in_proj: h -> 2 qk_dim + 2 v_dim + 2 n_v columns (q, k, v, the output gate z, and the per
  value-head beta and alpha; `self.in_proj_dim = self.qk_dim * 2 + self.v_dim * 2 +
  self.num_value_heads * 2`);
- conv1d over 2 qk_dim + v_dim channels (`self.conv_dim`), kernel `linear_conv_kernel_dim`;
- per value head: A_log, dt_bias; gated RMSNorm weight of one value head's width;
- out_proj: v_dim -> h. TP splits both head counts (`num_value_heads // tp_size`).
- CP: not implemented in 0.16.1 (`GatedDeltaNetContextParallel` is commented out): a layout with
  cp > 1 on a gated DeltaNet model is refused.
- Scan FLOPs per token and value head, the chunkwise form of the paper's Sec. 3.3 (chunk C,
  key width d_k, value width d_v): K K^T, the WY factors W = T K and U = T V, Q K^T and its
  product with the corrected values, 2 C (3 d_k + 2 d_v); the triangular solve for T, C^2 / 3;
  and the state terms W S, Q S and the state update K^T (U - W S), 6 d_k d_v.
"""

from __future__ import annotations

from ..specs.layer_pattern import GDN, GatedDeltaNetSpec
from .ssm_mixer import MixerArch


def delta_rule_flops_per_token(g: GatedDeltaNetSpec) -> float:
    """Forward FLOPs per token of the chunkwise gated delta rule (arXiv 2412.06464 Sec. 3.3):
    n_v [2 C (3 d_k + 2 d_v) + C^2 / 3 + 6 d_k d_v] (key heads repeated to the value heads)."""
    C, dk, dv = g.chunk_size, g.key_head_dim, g.value_head_dim
    return g.n_value_heads * (2.0 * C * (3.0 * dk + 2.0 * dv) + C * C / 3.0 + 6.0 * dk * dv)


def build_gated_deltanet(g: GatedDeltaNetSpec, hidden: int) -> MixerArch:
    """The `MixerArch` of one gated DeltaNet layer of width `hidden`."""
    qk, v, nv = g.qk_dim, g.v_dim, g.n_value_heads
    return MixerArch(
        letter=GDN, hidden=hidden,
        in_width=2 * qk + 2 * v + 2 * nv,
        out_in=v,
        conv_channels=2 * qk + v, conv_kernel=g.conv_kernel,
        small_params=2.0 * nv + g.value_head_dim,  # A_log, dt_bias; norm weight
        scan_flops=delta_rule_flops_per_token(g),
        tp_units=(g.n_key_heads, nv),
        cp_in=0.0,
        cp_supported=False,
    )
