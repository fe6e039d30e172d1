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
- Scan bytes per token (`delta_rule_bytes_per_token`): what flash-linear-attention's chunked
  kernels read and write in HBM (`DELTA_FWD`, `DELTA_BWD`); as for Mamba-2 (`cost.mamba`) they,
  not the FLOPs, set the scan's time unless a GPU's fit says it is slower.
"""

from __future__ import annotations

from ..specs.layer_pattern import GDN, GatedDeltaNetSpec
from .ssm_mixer import MixerArch


def delta_rule_flops_per_token(g: GatedDeltaNetSpec) -> float:
    """Forward FLOPs per token of the chunkwise gated delta rule (arXiv 2412.06464 Sec. 3.3):
    n_v [2 C (3 d_k + 2 d_v) + C^2 / 3 + 6 d_k d_v] (key heads repeated to the value heads)."""
    C, dk, dv = g.chunk_size, g.key_head_dim, g.value_head_dim
    return g.n_value_heads * (2.0 * C * (3.0 * dk + 2.0 * dv) + C * C / 3.0 + 6.0 * dk * dv)


DELTA_FWD = {"K": 12.0, "V": 12.0, "S": 4.0, "A": 2.0, "H": 22.0}
"""Forward bytes per token of `chunk_gated_delta_rule_fwd` (fla-org/flash-linear-attention
fla/ops/gated_delta_rule/chunk.py, @bc3b101d; the kernel Megatron-Core's `GatedDeltaNet` calls),
per unit of K = n_v d_k (q, k, w: key heads repeated to the value heads, bf16), V = n_v d_v
(v, u, v_new, o), S = n_v d_k d_v / C (the chunk states h, bf16: `k.new_empty`), A = n_v C (the
WY matrix A, bf16) and H = n_v (gates, beta; fp32 cumsum): each kernel's tensor arguments read
once and its outputs written once, the q/k L2 norm and the gate's own kernels left to the
elementwise rule:

| kernel | reads | writes |
|---|---|---|
| `chunk_local_cumsum` | g 4H | g 4H |
| `chunk_gated_delta_rule_fwd_intra` | k 2K, v 2V, g, beta 6H | A 2A, w 2K, u 2V |
| `chunk_gated_delta_rule_fwd_h` | k, w 4K, u 2V, g 4H | h 2S, v_new 2V |
| `chunk_fwd_o` | q, k 4K, v_new 2V, h 2S, g 4H | o 2V |
"""
DELTA_BWD = {"K": 42.0, "V": 30.0, "S": 8.0, "A": 4.0, "H": 40.0}
"""Backward bytes per token of `chunk_gated_delta_rule_bwd` (same file and rule): it recomputes
w, u (k 2K, v 2V, A 2A; w 2K, u 2V) and the states (k, w 4K, u 2V; h 2S, v_new 2V); then
`chunk_bwd_dv_local` (q, k 4K, do 2V; dv 2V), `chunk_gated_delta_rule_bwd_dhu` (q, k, w 6K,
do, dv 4V; dh 2S, dv 2V), `chunk_bwd_dqkwg` (q, k, w 6K, v_new, dv, do 6V, h, dh 4S; dq, dk,
dw 6K), `prepare_wy_repr_bwd` (k, dw 4K, v, du 4V, A 2A; dk 2K, dv 2V), `dk.add_` (6K), the
gates and beta ~40H."""


def delta_rule_bytes_per_token(g: GatedDeltaNetSpec) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token of the chunked gated delta rule's kernels, whole
    layer (`DELTA_FWD`, `DELTA_BWD`)."""
    nv, dk, dv, C = g.n_value_heads, g.key_head_dim, g.value_head_dim, g.chunk_size
    unit = {"K": nv * dk, "V": nv * dv, "S": nv * dk * dv / C, "A": nv * C, "H": nv}
    return (float(sum(c * unit[k] for k, c in DELTA_FWD.items())),
            float(sum(c * unit[k] for k, c in DELTA_BWD.items())))


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
        scan_bytes=delta_rule_bytes_per_token(g),
        tp_units=(g.n_key_heads, nv),
        cp_in=0.0,
        cp_supported=False,
    )
