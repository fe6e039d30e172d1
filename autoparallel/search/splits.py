"""Uneven pipeline splits: how many transformer layers the first and last stage hold.

Megatron-Core takes the first and last stage's layer counts and splits the rest evenly
(`--decoder-first-pipeline-num-layers`, `--decoder-last-pipeline-num-layers`; launchers.md §1.1),
each count divisible by vp. The last stage also runs the output layer and the loss, the first the
embedding (reference §4: "stage imbalance adds directly to the bubble"). `balanced_splits` picks
the splits that minimise the most loaded stage's forward FLOPs, with the output layer counted as
`output_layers` transformer layers (its FLOP ratio, `output_weight`)."""

from __future__ import annotations

from ..cost.arch import Arch


def output_weight(arch: Arch, seq_len: int) -> float:
    """Forward FLOPs of the output layer per token in units of one transformer layer's:
    2 h V / (2 x GEMM weights per layer + s n_h (d_qk + d_v)) (reference §2.1 FLOP convention,
    causal attention), plus, per multi-token-prediction module, one layer and one more output
    pass. The embedding lookup has no FLOPs and weighs 0."""
    per_layer = 2.0 * arch.gemm_params_per_token() / arch.n_layers + seq_len * arch.attn_score_width
    head = 2.0 * arch.hidden * arch.vocab / per_layer
    # multi-token prediction on the last stage: per module a block (~ one layer) and a head pass
    return head * (1 + arch.n_mtp) + arch.n_mtp


def balanced_splits(n_layers: int, pp: int, vp: int, w_last: float, k: int = 2) -> list[tuple[int, int]]:
    """Up to `k` (first, last) layer counts of the splits whose most loaded stage is lightest
    (load = layers, + `w_last` on the last stage), uneven ones only (the even split is the
    `(0, 0)` row the enumerator keeps anyway); where an even split exists, only splits lighter
    than it; and only splits within one layer or 10 % of the ideal load (L + w_last) / pp. Ties prefer the smaller total squared load
    (a flatter pipeline), then fewer layers on the first stage (it holds the most micro-batches).

    Example: Llama-3.1-405B (126 layers) on pp 16: [(7, 7), (6, 8)] -> `pp16[7,8x14,7]` first.
    """
    if pp < 2:
        return []
    found = []
    mids = [None] if pp == 2 else range(vp, n_layers // (pp - 2) + 1, vp)
    for mid in mids:
        rest = n_layers - (0 if mid is None else (pp - 2) * mid)
        if rest < 2 * vp:
            continue
        ideal = (rest - w_last) / 2.0
        # around the equalising first stage, and the middle stages' count (a heavy last stage,
        # e.g. the output head plus an MTP module, wants the fewest layers there)
        near = {vp * int(ideal // vp) + d * vp for d in (-1, 0, 1, 2)}
        for first in near | ({mid, rest - vp} if mid is not None else set()):
            last = rest - first
            if first < vp or last < vp or last % vp:
                continue
            if mid is not None and first == mid == last:
                continue  # the even split
            if mid is None and first == last:
                continue
            loads = [first, last + w_last] + ([] if mid is None else [mid])
            key = (round(max(loads), 9), round(sum(x * x for x in loads) + (pp - 3) * (mid or 0) ** 2, 6), first)
            found.append((key, (first, last)))
    # splits far from the ideal load (L + w) / p cannot pace well: keep those within one layer or
    # 10 % of it (coarse vp granularity, e.g. 14-layer chunks on 4 ranks, yields none)
    ideal = (n_layers + w_last) / pp
    found = [f for f in found if f[0][0] <= max(ideal + 1.0, 1.1 * ideal) + 1e-9]
    if n_layers % (pp * vp) == 0:  # an even split exists: only splits that beat it
        even = n_layers / pp + w_last
        found = [f for f in found if f[0][0] < round(even, 9)]
    found.sort()
    out: list[tuple[int, int]] = []
    for _, split in found:
        if split not in out:
            out.append(split)
        if len(out) == k:
            break
    return out
