"""Mamba-2 layers (Dao & Gu 2024, "Transformers are SSMs", arXiv 2405.21060) as Megatron-Core
builds them (megatron/core/ssm/mamba_mixer.py, 0.16.1), priced by `cost.ssm_mixer`.

- in_proj: h -> 2 d_inner + 2 G N + H columns (z, x, B, C, dt; `MambaMixer.__init__`:
  `self.d_inner * 2 + 2 * self.ngroups * self.d_state + self.nheads`), d_inner = H P;
- conv1d over d_inner + 2 G N channels (x, B, C), kernel d_conv, with bias;
- per head: A_log, D (`D_has_hdim = False`), dt_bias; gated RMSNorm weight d_inner;
- out_proj: d_inner -> h.
- TP: `nheads % tp_size == 0`, `ngroups % tp_size == 0` (asserted), every width above / t.
- CP (`MambaContextParallel`): heads / t must divide by c, and groups / t must divide by c or c
  by groups / t.
- Scan FLOPs per token, the SSD chunked algorithm (paper Sec. 6, chunk length Q): the intra-chunk
  C B^T per group, 2 Q N G; its product with X per head, 2 Q P H; the chunk states B^T X,
  2 N P H; the state-to-output C h, 2 N P H; the inter-chunk recurrence, 2 N P H / Q.
"""

from __future__ import annotations

from ..specs.layer_pattern import MAMBA, MambaSpec
from .ssm_mixer import MixerArch


def ssd_flops_per_token(m: MambaSpec) -> float:
    """Forward FLOPs per token of the SSD scan (arXiv 2405.21060 Sec. 6, chunk length Q):
    2 Q N G + H (2 Q P + 4 N P + 2 N P / Q)."""
    Q, N, P, H, G = m.chunk_size, m.state_size, m.head_dim, m.n_heads, m.n_groups
    return 2.0 * Q * N * G + H * (2.0 * Q * P + 4.0 * N * P + 2.0 * N * P / Q)


def build_mamba(m: MambaSpec, hidden: int) -> MixerArch:
    """The `MixerArch` of one Mamba-2 layer of width `hidden`."""
    d_in, G, N, H = m.d_inner, m.n_groups, m.state_size, m.n_heads
    conv = d_in + 2 * G * N
    return MixerArch(
        letter=MAMBA, hidden=hidden,
        in_width=2 * d_in + 2 * G * N + H,
        out_in=d_in,
        conv_channels=conv, conv_kernel=m.conv_kernel,
        small_params=3.0 * H + d_in + conv,  # A_log, D, dt_bias; norm weight; conv bias
        scan_flops=ssd_flops_per_token(m),
        tp_units=(H, G),
        cp_in=2 * d_in + 2 * G * N + H,
        cp_supported=True,
        cp_units=(H,),
    )
