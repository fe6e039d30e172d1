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
- Scan bytes per token (`ssd_bytes_per_token`): what the SSD kernels read and write in HBM. The
  chunk states (H P N per chunk of Q tokens, fp32 between kernels) are as large per token as x
  whenever N ~ Q, so the kernels are memory-bound: on an H100 the count below, at the achievable
  HBM bandwidth, is the time of the FLOPs at ~8 % of the BF16 peak, what the hybrid runs fit
  (`benchmarks/fit_scan_efficiency.py`).
"""

from __future__ import annotations

from ..specs.layer_pattern import MAMBA, MambaSpec
from .ssm_mixer import MixerArch


def ssd_flops_per_token(m: MambaSpec) -> float:
    """Forward FLOPs per token of the SSD scan (arXiv 2405.21060 Sec. 6, chunk length Q):
    2 Q N G + H (2 Q P + 4 N P + 2 N P / Q)."""
    Q, N, P, H, G = m.chunk_size, m.state_size, m.head_dim, m.n_heads, m.n_groups
    return 2.0 * Q * N * G + H * (2.0 * Q * P + 4.0 * N * P + 2.0 * N * P / Q)


SSD_FWD = {"D": 6.0, "DNQ": 12.0, "GN": 8.0, "GQ": 8.0, "H": 26.0}
"""Forward bytes per token of the five SSD kernels, per unit of D = H P (x, out), D N / Q (chunk
states), G N (B, C), G Q (C B^T), H (dt): each kernel's tensor arguments read once and its outputs
written once (tiles re-read by other programs assumed to hit L2; state-spaces/mamba
mamba_ssm/ops/triton/ssd_combined.py `_mamba_chunk_scan_combined_fwd`, @e9594ce). Megatron-Core
passes the gate z to the gated RMSNorm, not to the scan (`mamba_split_conv1d_scan_combined` with
`rmsnorm_weight`: the scan runs with `z=None`), so z and out_x do not appear:

| kernel | reads | writes |
|---|---|---|
| `_chunk_cumsum_fwd` | dt 2H | dA_cumsum, dt fp32 8H |
| `_chunk_state_fwd` | x 2D, B 2GN, dt, dA 8H | states fp32 4DN/Q |
| `_state_passing_fwd` | states 4DN/Q | states bf16 2DN/Q |
| `_bmm_chunk_fwd` | B, C 4GN | CB fp32 4GQ |
| `_chunk_scan_fwd` | CB 4GQ, x 2D, C 2GN, dt, dA 8H, states 2DN/Q | out 2D |
"""
SSD_BWD = {"D": 22.0, "DNQ": 34.0, "GN": 38.0, "GQ": 24.0, "H": 86.0}
"""Backward bytes per token of the fifteen kernels of `_mamba_chunk_scan_combined_bwd` (same
file and rule): it recomputes dA_cumsum (10H), CB (4GN + 4GQ), the chunk states (2D + 2GN + 8H +
4DN/Q) and their passing in fp32 (8DN/Q); then `_chunk_scan_bwd_dstates` (dout 2D, C 2GN, dA 4H;
dstates fp32 4DN/Q), `_state_passing_bwd` (states, dstates fp32 8DN/Q; both bf16 4DN/Q),
`_chunk_scan_chunk_state_bwd_dx` (x, dout 4D, B 2GN, CB 4GQ, dstates 2DN/Q, dt, dA 8H; dx 2D,
ddt 4H), `_chunk_state_bwd_db` (x 2D, dstates 2DN/Q, B 2GN, dt, dA 8H; dB fp32 4GN, ddA 4H),
`_chunk_scan_bwd_dC` (states 2DN/Q, dout 2D, C 2GN, dA 4H; dC fp32 4GN, ddA 4H),
`_chunk_scan_bwd_dcb` (x, dout 4D, dt, dA 8H; dCB fp32 4GQ), two `_bmm_chunk_bwd` (B or C 2GN,
dCB 4GQ, residual fp32 4GN; 2GN each), `_chunk_scan_bwd_ddAcs_stable` (x, dout 4D, CB 4GQ, dt,
dA 8H; ddA 4H) and `_chunk_cumsum_bwd` (ddA, ddt 8H, dt 2H; ddt 2H)."""


def ssd_bytes_per_token(m: MambaSpec) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token of the SSD scan kernels, whole layer
    (`SSD_FWD`, `SSD_BWD`)."""
    Q, N, G, H, D = m.chunk_size, m.state_size, m.n_groups, m.n_heads, m.d_inner
    unit = {"D": D, "DNQ": D * N / Q, "GN": G * N, "GQ": G * Q, "H": H}
    return (float(sum(c * unit[k] for k, c in SSD_FWD.items())),
            float(sum(c * unit[k] for k, c in SSD_BWD.items())))


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
        scan_bytes=ssd_bytes_per_token(m),
        tp_units=(H, G),
        cp_in=2 * d_in + 2 * G * N + H,
        cp_supported=True,
        cp_units=(H,),
    )
