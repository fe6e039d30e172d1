"""Context parallelism by form: what the CP ranks exchange per layer, what it hides behind, the
buffers it holds, and which head counts it needs. One vectorised path for every form
(`LayoutTable` columns `cc`, the form code, and `cu`, the hierarchical all-to-all group size).

Per layer and micro-batch each CP rank holds T = b s / c tokens (Megatron's two-chunk split:
chunks i and 2c - 1 - i of the sequence's 2c, `get_batch_on_this_cp_rank`, so every rank does
1/c of the causal attention, TE `attn_forward_func_with_cp` "DualChunkSwap"). Per token of one TP
rank, bf16: Q 2 q_w / t, K 2 k_w / min(t, g), V 2 v_w / min(t, g), attention output 2 o_w / t.

- **ring** (TE `AttnFuncWithCPAndKVP2P`, Megatron-Core `p2p`; Liu et al. 2023): c steps, each
  computing 1/c of the rank's attention while the next K, V chunk travels one hop; c - 1 hops
  forward, each hidden behind one step; backward sends K, V and dK, dV together (2x) behind one
  step of the 2.5x backward. Buffers: the forward keeps every step's receive buffer until it
  returns (`p2p_comm_buffers[i + 1] = torch.empty_like(...)`, c of them), the backward two
  double buffers of (K V, dK dV): max(c, 4) x the rank's K, V.
- **a2a** (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509 Sec. 3; TE
  `AttnFuncWithCPAndQKVOA2A`): all-to-alls of Q, K, V before attention (each rank then holds
  the whole sequence for 1/c of the heads) and of the output after it; backward the same for dO
  and dQ, dK, dV. Each rank sends its T tokens' Q, K, V, O whatever c is, so the volume per
  rank falls as 1/c (the paper's "communication volume per link 4Nh/P"); nothing to hide
  behind (attention waits for all heads). Buffers: the head-major copy of Q, K, V and the
  receive buffers (`flash_attn_a2a_communicate`: `.contiguous()` and `torch.empty_like`).
  Needs the query heads and KV heads of a TP rank divisible by c (TE asserts `num_heads %
  cp_size == 0` for Q, K, V); a stack that replicates KV heads (DeepSpeed's
  `UlyssesSPAttentionHF`: `kv_replication_factor`) also takes c a multiple of them and sends
  the replicated K, V.
- **allgather** (Llama 3 report, arXiv 2407.21783, Sec. 3.3.2; TE `AttnFuncWithCPAndKVAllGather`,
  Megatron-Core `allgather`): all-gather K and V of the whole sequence, attend the two local
  query chunks; backward all-gathers again and reduce-scatters dK, dV. Exposed in Transformer
  Engine ("KV all-gather between CP ranks is exposed"; Llama 3: "exposed in the critical path",
  small with GQA); hidden behind the first block where the stack issues it with that block
  (PyTorch's `_AllGatherRotater`, TorchTitan: `StackSpec.cp_allgather_overlap`). Buffers: the
  gathered K, V and their per-step contiguous slices forward, the gathered K, V and the
  whole-sequence dK, dV backward: 2c x the rank's K, V.
- **a2a+ring** (TE `AttnFuncWithCPAndKVP2P` with `cp_group = [a2a, p2p]`, Megatron-Core
  `a2a+p2p` with `--hierarchical-context-parallel-sizes u r`; USP, LongVILA): the all-to-all
  over the u inner ranks (heads; adjacent CP ranks, usually one NVLink domain), then the ring
  over the r = c / u groups with T u tokens of 1/u of the heads: the same K, V bytes per hop as
  the plain ring, r - 1 hops each behind 1/r of the attention. Buffers: both forms'.
"""

from __future__ import annotations

import numpy as np

from ..layouts import LayoutTable
from ..placement import group
from ..specs.layout import CP_COMM_CODES, CpComm
from ..specs.problem import Problem
from .arch import Arch
from .comm import Collective, collective_time
from .compute import ATTN_BWD
from .distinct_rows import on_distinct
from .network import sizes as tier_sizes
from .overlap import hidden_cost as _hidden_cost

RING, A2A, ALLGATHER, A2A_RING = (CP_COMM_CODES[f] for f in CpComm)
"""Form codes of the layout table's `cc` column."""
RING_BWD_BUFFERS = 4.0
"""K, V-sized buffers the ring's backward holds: two double buffers of (K V, dK dV) (TE
`AttnFuncWithCPAndKVP2P.backward`: `p2p_comm_buffers = [empty((2, *kv.shape)), ...] x 2`)."""


def a2a_size(t: LayoutTable) -> np.ndarray:
    """Ranks of each row's all-to-all group: c (a2a), `cu` (a2a+ring), 1 (ring, allgather)."""
    cc = t["cc"]
    return np.where(cc == A2A, t["cp"], np.where(cc == A2A_RING, t["cu"], 1)).astype(np.float64)


def ring_size(t: LayoutTable) -> np.ndarray:
    """Ranks of each row's ring: c (ring), c / cu (a2a+ring), 1 (a2a, allgather: no ring)."""
    cp = t["cp"].astype(np.float64)
    return np.where((t["cc"] == RING) | (t["cc"] == A2A_RING), cp / a2a_size(t), 1.0)


def cp_groups(t: LayoutTable, sizes) -> dict:
    """Placement of each row's CP groups (ranks ordered tp-cp-dp-pp, `placement`) in units of
    `sizes` GPUs per network tier (`cost.network.sizes`; an int: the scale-up domain only): `all`
    the c CP ranks (stride tp; the all-gather), `a2a` the u adjacent ones (stride tp;
    Megatron-Core's hierarchical groups put the first size innermost), `ring` the r groups
    (stride tp u). Each collective is then priced on the tiers its group crosses."""
    tp, cp = t["tp"].astype(np.float64), t["cp"].astype(np.float64)
    u = a2a_size(t)
    return {"all": group(cp, tp, sizes), "a2a": group(u, tp, sizes),
            "ring": group(ring_size(t), tp * u, sizes)}


def _per_token(problem: Problem, arch: Arch, t: LayoutTable) -> dict[str, np.ndarray]:
    """Bytes per token one TP rank holds of Q, K, V, the attention output, and of K, V as the
    a2a sends them (KV heads replicated up to the all-to-all group where the stack does)."""
    tp = t["tp"].astype(np.float64)
    kv_div = np.minimum(tp, arch.n_kv_heads)
    k_w = arch.n_kv_heads * arch.qk_head_dim
    v_w = arch.n_kv_heads * arch.v_head_dim
    k, v = 2.0 * k_w / kv_div, 2.0 * v_w / kv_div
    kv_a2a = k + v
    if problem.stack.cp_kv_replicate:
        heads = arch.n_kv_heads / kv_div  # KV heads on one TP rank
        kv_a2a = kv_a2a * np.maximum(1.0, a2a_size(t) / heads)
    return {"q": 2.0 * arch.n_heads * arch.qk_head_dim / tp, "k": k, "v": v, "kv": k + v,
            "o": 2.0 * arch.n_heads * arch.v_head_dim / tp, "kv_a2a": kv_a2a}


CP_FORM_INPUTS = ("tp", "cp", "cc", "cu", "mb")
"""The columns the CP form's collectives and buffers read (`cp_collectives`,
`cp_buffer_bytes`): a table repeats each combination over every other axis, so they are priced
once per distinct one (`cost.distinct_rows.on_distinct`; tests/test_distinct_rows.py)."""


def cp_collectives(problem: Problem, arch: Arch, t: LayoutTable) -> dict[str, np.ndarray]:
    """Per row, the collective seconds of its CP form for one layer and micro-batch: `ring_step`
    (one hop of the rank's K, V), `a2a` (the four all-to-alls of one pass), `ag` and `rs` (the
    K, V all-gather and the dK, dV reduce-scatter), 0 where the form does not use them or
    cp = 1; `r` and `u` the ring and all-to-all sizes. Priced on the rows with cp > 1 only (a
    row with cp = 1 exchanges nothing), once per distinct `CP_FORM_INPUTS` and once per table:
    `cp_layer_time` combines them with each layer kind's attention time."""
    return on_distinct(t, CP_FORM_INPUTS, lambda d: _cp_collectives(problem, arch, d))


def _cp_collectives(problem: Problem, arch: Arch, t: LayoutTable) -> dict[str, np.ndarray]:
    n = len(t)
    out = {k: np.zeros(n) for k in ("ring_step", "a2a", "ag", "rs")}
    out["r"], out["u"] = np.ones(n), np.ones(n)
    rows = np.flatnonzero(t["cp"] > 1)
    if len(rows) == 0:
        return out
    sub = t.take(rows) if len(rows) < n else t
    cc, cp = sub["cc"], sub["cp"].astype(np.float64)
    T = sub["mb"] * problem.training.seq_len / cp
    grp = cp_groups(sub, tier_sizes(problem))
    b = _per_token(problem, arch, sub)
    r, u = ring_size(sub), a2a_size(sub)
    out["r"][rows], out["u"][rows] = r, u

    ring = (cc == RING) | (cc == A2A_RING)
    if np.any(ring):
        # one hop of this rank's K, V (after the hierarchical a2a: T u tokens of 1/u of the
        # heads, the same bytes)
        step = collective_time(problem, Collective.P2P, T * b["kv"], grp["ring"])
        out["ring_step"][rows] = np.where(ring & (r > 1), step, 0.0)

    a2a = (cc == A2A) | (cc == A2A_RING)
    if np.any(a2a):
        # Q, K, V before attention and the output after it, one all-to-all each (TE issues
        # them one by one)
        g = grp["a2a"]
        kv_split = b["kv_a2a"] / b["kv"]
        one = sum(collective_time(problem, Collective.ALL_TO_ALL, T * x, g)
                  for x in (b["q"], b["k"] * kv_split, b["v"] * kv_split, b["o"]))
        out["a2a"][rows] = np.where(a2a & (u > 1), one, 0.0)

    gather = cc == ALLGATHER
    if np.any(gather):
        # K and V of the whole sequence gathered (output c T bytes each); dK, dV
        # reduce-scattered in the backward
        g = grp["all"]
        ag = collective_time(problem, Collective.ALL_GATHER, cp * T * b["k"], g) + \
            collective_time(problem, Collective.ALL_GATHER, cp * T * b["v"], g)
        rs = collective_time(problem, Collective.REDUCE_SCATTER, cp * T * b["k"], g) + \
            collective_time(problem, Collective.REDUCE_SCATTER, cp * T * b["v"], g)
        out["ag"][rows] = np.where(gather, ag, 0.0)
        out["rs"][rows] = np.where(gather, rs, 0.0)
    return out


def cp_layer_time(problem: Problem, t: LayoutTable, coll: dict[str, np.ndarray], attn_f,
                  full) -> np.ndarray:
    """Seconds of CP communication one layer adds per micro-batch on one GPU, forward, backward
    and (`full`: share of layers fully recomputed) the recomputed forward, with `attn_f` the
    rank's forward attention seconds (1/c of the layer's, `cost.time._layer_forward`) and `coll`
    the table's `cp_collectives` (priced once for every stage and layer kind)."""
    prof = problem.profile
    cc, cp = t["cc"], t["cp"].astype(np.float64)
    out = np.zeros(len(t))

    ring = ((cc == RING) | (cc == A2A_RING)) & (coll["r"] > 1)
    if np.any(ring):
        # r - 1 hops forward, each hidden behind one of the r steps of the rank's attention;
        # backward K, V and dK, dV together behind a step of the backward
        r, step = coll["r"], coll["ring_step"]
        f = (r - 1) * _hidden_cost(prof, step, attn_f / r)
        bwd = (r - 1) * _hidden_cost(prof, 2.0 * step, ATTN_BWD * attn_f / r)
        out = out + np.where(ring, f * (1.0 + full) + bwd, 0.0)

    a2a = ((cc == A2A) | (cc == A2A_RING)) & (coll["u"] > 1)
    if np.any(a2a):
        # the backward moves dO and dQ, dK, dV: the same bytes; exposed (attention waits for
        # all heads)
        out = out + np.where(a2a, coll["a2a"] * (2.0 + full), 0.0)

    gather = cc == ALLGATHER
    if np.any(gather & (cp > 1)):
        ag, rs = coll["ag"], coll["rs"]
        if problem.stack.cp_allgather_overlap:  # issued with the first block of attention
            f = _hidden_cost(prof, ag, attn_f / cp)
            bwd = _hidden_cost(prof, ag + rs, ATTN_BWD * attn_f / cp)
        else:
            f, bwd = ag, ag + rs
        out = out + np.where(gather & (cp > 1), f * (1.0 + full) + bwd, 0.0)
    return np.where(cp > 1, out, 0.0)


def cp_buffer_bytes(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Transient bytes the form holds on one GPU during a layer's attention (overhead item):
    ring max(r, 4) x the rank's K, V; a2a twice its Q, K, V; allgather 2c x its K, V;
    a2a+ring the ring's and the a2a's (module docstring); 0 where cp = 1 (costed on the rows
    with cp > 1 only, once per distinct `CP_FORM_INPUTS`)."""
    return on_distinct(t, CP_FORM_INPUTS, lambda d: _cp_buffer_bytes(problem, arch, d))


def _cp_buffer_bytes(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    out = np.zeros(len(t))
    rows = np.flatnonzero(t["cp"] > 1)
    if len(rows) == 0:
        return out
    sub = t.take(rows) if len(rows) < len(t) else t
    cc, cp = sub["cc"], sub["cp"].astype(np.float64)
    T = sub["mb"].astype(np.float64) * problem.training.seq_len / cp
    b = _per_token(problem, arch, sub)
    kv = T * b["kv"]
    ring = np.maximum(ring_size(sub), RING_BWD_BUFFERS) * kv
    a2a = 2.0 * T * (b["q"] + b["kv_a2a"])
    out[rows] = np.select([cc == RING, cc == A2A, cc == ALLGATHER, cc == A2A_RING],
                          [ring, a2a, 2.0 * cp * kv, ring + a2a], 0.0)
    return out


def heads_violated(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Rows whose all-to-all group does not divide the heads of a TP rank: the query heads
    a / t and the KV heads g / min(t, g) must divide by u (TE `AttnFuncWithCPAndQKVOA2A`:
    "requires num_heads % cp_size == 0 for Q, K, V"); where the stack replicates KV heads
    (DeepSpeed `UlyssesSPAttentionHF`) u may instead be a multiple of them."""
    tp = t["tp"]
    u = np.round(a2a_size(t)).astype(np.int64)
    q_heads = arch.n_heads // np.maximum(tp, 1)
    kv_heads = np.maximum(arch.n_kv_heads // np.minimum(tp, arch.n_kv_heads), 1)
    kv_ok = kv_heads % u == 0
    if problem.stack.cp_kv_replicate:
        kv_ok |= u % kv_heads == 0
    return (t["cp"] > 1) & (u > 1) & ((q_heads % u != 0) | ~kv_ok)


def window_violated(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Rows that pass K, V around a ring for a model with sliding-window layers: TE's CP runs
    sliding-window attention only with a2a and all-gather (`attn_forward_func_with_cp`: "does
    not support sliding window attention with cp_comm_type" p2p / a2a+p2p)."""
    windowed = bool(arch.window and arch.n_window_layers and arch.window < problem.training.seq_len)
    ring = (t["cc"] == RING) | (t["cc"] == A2A_RING)
    return (t["cp"] > 1) & ring & windowed
