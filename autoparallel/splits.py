"""Uneven pipeline splits: how many transformer layers the first and last stage hold.

Megatron-Core writes such a split three ways (megatron/core/transformer/transformer_config.py,
transformer_block.py `get_num_layers_to_build`, 0.16.1): the first and last stage's counts with
the rest shared evenly (`--decoder-first/last-pipeline-num-layers`, every count divisible by vp);
the embedding and / or the loss counted as one layer each (`--account-for-embedding-in-pipeline-
split`, `--account-for-loss-in-pipeline-split`: (L + 2) / pp layers per rank, one fewer in the
first chunk of rank 0 and the last chunk of rank pp - 1, so the ends need not be divisible by vp);
or any placement (`--pipeline-model-parallel-layout`). The last stage also runs the output layer
and the loss, the first the embedding (reference §4: "stage imbalance adds directly to the
bubble"). `balanced_splits` picks the splits that minimise the most loaded stage's forward FLOPs,
with the output layer counted as `output_weight` transformer layers (its FLOP ratio); the middle
stages hold equal counts, divisible by vp (equal model chunks), the first and last any count.

`default_split` is the split `plan` takes for a (pp, vp) whose product does not divide the
layers, and `with_default_split` gives it to a layout that names none: the one entry point that
`estimate`, `estimate --input`, `plan --versus`, `export`, `tune` and the Python API share."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from .cost.arch import Arch
from .cost.model_arch import build_arch
from .specs.layout import stage_layers_slug

if TYPE_CHECKING:
    from .specs.layout import Layout
    from .specs.problem import Problem


def layer_weights(arch: Arch, seq_len: int) -> tuple[float, ...] | None:
    """A hybrid model's layers in pattern order, each weighing its forward FLOPs per token over
    the mean layer's (`cost.layer_types.HybridArch.layer_flops`: a Mamba layer its projections
    and scan, an attention layer its projections and s n_h (d_qk + d_v), an MoE layer its router
    -free top-k experts, shared experts and latent projections); None for a transformer, whose
    layers weigh the same."""
    hy = arch.hybrid
    if hy is None:
        return None
    per = {k: hy.layer_flops(k, seq_len) for k in set(hy.letters)}
    w = np.array([per[c] for c in hy.letters], dtype=np.float64)
    return tuple(float(x) for x in w / w.mean())


def output_weight(arch: Arch, seq_len: int) -> float:
    """Forward FLOPs of the output layer per token in units of one transformer layer's:
    2 h V / (2 x GEMM weights per layer + s n_h (d_qk + d_v)) (reference §2.1 FLOP convention,
    causal attention), plus, per multi-token-prediction module, one layer and one more output
    pass. The embedding lookup has no FLOPs and weighs 0. A hybrid model's unit is its mean
    layer (`layer_weights`), and an MTP module weighs its own layers (attention + MoE / MLP)."""
    hy = arch.hybrid
    if hy is not None:
        per = {k: hy.layer_flops(k, seq_len) for k in set(hy.letters) | set(hy.mtp_letters)}
        mean = sum(per[c] for c in hy.letters) / len(hy.letters)
        head = 2.0 * arch.hidden * arch.vocab / mean
        return head * (1 + hy.n_mtp) + hy.n_mtp * sum(per[k] for k in hy.mtp_letters) / mean
    per_layer = 2.0 * arch.gemm_params_per_token() / arch.n_layers + seq_len * arch.attn_score_width
    head = 2.0 * arch.hidden * arch.vocab / per_layer
    # multi-token prediction on the last stage: per module a block (~ one layer) and a head pass
    return head * (1 + arch.n_mtp) + arch.n_mtp


def balanced_splits(n_layers: int, pp: int, vp: int, w_last: float, k: int = 2,
                    weights: tuple[float, ...] | None = None) -> list[tuple[int, int]]:
    """Up to `k` (first, last) layer counts of the splits whose most loaded stage is lightest
    (load = layers, + `w_last` on the last stage), uneven ones only (the even split is the
    `(0, 0)` row the enumerator keeps anyway); where an even split exists, only splits lighter
    than it; and only splits within one layer or 10 % of the ideal load (L + w_last) / pp. Ties
    prefer the smaller total squared load (a flatter pipeline), then fewer layers on the first
    stage (it holds the most micro-batches). The middle stages' count is a multiple of vp; the
    ends are any positive count (Megatron's embedding/loss accounting or layout string) whose
    model chunks, dealt as evenly as they go, hold no more layers than a middle stage's (with
    vp > 1 a heavier chunk paces the interleaved schedule, which the per-stage load misses);
    with pp = 2 and vp > 1 both ends divisible by vp.

    Example: Llama-3.1-405B (126 layers) on pp 16: [(7, 7), (6, 8)] -> `pp16[7,8x14,7]` first,
    also with vp 2, 4 or 8 (Megatron-Bridge's 405B recipes: 128 / 16 = 8 per rank with the
    embedding and the loss counted as a layer each).

    `weights` (a hybrid model's `layer_weights`, vp = 1): a stage's load is the sum of its
    layers' weights in pattern order instead of their count, every stage's (the middle ones
    differ by what they hold), every first-stage count tried.
    """
    if weights is not None and int(vp) == 1:
        return list(_balanced_weighted(int(pp), float(w_last), int(k), tuple(weights)))
    return list(_balanced(int(n_layers), int(pp), int(vp), float(w_last), int(k)))


@lru_cache(maxsize=256)
def _balanced_weighted(pp: int, w_last: float, k: int, weights: tuple[float, ...]
                       ) -> tuple[tuple[int, int], ...]:
    if pp < 2:
        return ()
    L = len(weights)
    cum = np.concatenate([[0.0], np.cumsum(weights)])

    def loads(first: int, mid: int, last: int) -> list[float]:
        out = [cum[first]]
        for j in range(pp - 2):
            out.append(cum[first + (j + 1) * mid] - cum[first + j * mid])
        out.append(cum[L] - cum[L - last] + w_last)
        return out

    found = []
    mids = [0] if pp == 2 else range(1, L // (pp - 2) + 1)
    for mid in mids:
        rest = L - (pp - 2) * mid
        for first in range(1, rest):
            last = rest - first
            if mid and first == mid == last or not mid and first == last:
                continue  # the even split
            ld = loads(first, mid, last)
            found.append(((round(max(ld), 9), round(sum(x * x for x in ld), 6), first),
                          (first, last)))
    ideal = (cum[L] + w_last) / pp
    found = [f for f in found if f[0][0] <= max(ideal + 1.0, 1.1 * ideal) + 1e-9]
    if L % pp == 0:  # an even split exists: only splits that beat it
        per = L // pp
        even = max(loads(per, per, per))
        found = [f for f in found if f[0][0] < round(even, 9)]
    return _best(found, k)


def _best(found: list, k: int) -> tuple[tuple[int, int], ...]:
    """The `k` distinct (first, last) splits of `found` ((cost key, split) pairs), cheapest
    first."""
    out: list[tuple[int, int]] = []
    for _, split in sorted(found):
        if split not in out:
            out.append(split)
        if len(out) == k:
            break
    return tuple(out)


@lru_cache(maxsize=4096)
def _balanced(n_layers: int, pp: int, vp: int, w_last: float, k: int) -> tuple[tuple[int, int], ...]:
    if pp < 2:
        return ()
    found = []
    mids = [None] if pp == 2 else range(vp, n_layers // (pp - 2) + 1, vp)
    for mid in mids:
        rest = n_layers - (0 if mid is None else (pp - 2) * mid)
        if rest < 2:
            continue
        # first = last + w balances the ends: first near (rest + w) / 2, last near (rest - w) / 2;
        # also the middle stages' count and a last stage of vp layers (a heavy last stage, e.g.
        # the output head plus an MTP module, wants the fewest layers there)
        near = set(range(int((rest - w_last) // 2) - 1, int((rest + w_last) // 2) + 3))
        for first in near | ({mid, rest - vp} if mid is not None else set()):
            last = rest - first
            if first < 1 or last < 1:
                continue
            if vp > 1 and mid is None and (first % vp or last % vp):
                continue
            if vp > 1 and mid is not None and vp * max(-(-first // vp), -(-last // vp)) > mid:
                continue  # an end chunk heavier than a middle one would pace the interleaving
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
    return _best(found, k)


def spelled_out(n_layers: int, pp: int, first: int, last: int) -> list[int]:
    """Layers per stage, first to last, of the split with `first` and `last` at the ends and the
    middle stages sharing the rest equally."""
    if pp == 1:
        return [n_layers]
    mid = (n_layers - first - last) // max(pp - 2, 1)
    return [first] + [mid] * (pp - 2) + [last]


def default_split(arch: Arch, seq_len: int, pp: int, vp: int) -> list[int] | None:
    """The layers per stage `plan` takes for (pp, vp) when pp x vp does not divide the layers:
    the most balanced uneven split (`balanced_splits`, first of them), as `plan`'s enumerator
    picks it (`search.enumerate._with_splits`). None when the even split exists or pp = 1, or
    when no split with equal middle stages is balanced enough (e.g. 80 layers on pp 32)."""
    L = arch.n_layers
    if pp < 2 or L % (pp * vp) == 0:
        return None
    found = balanced_splits(L, pp, vp, output_weight(arch, seq_len), k=1,
                            weights=layer_weights(arch, seq_len))
    return spelled_out(L, pp, *found[0]) if found else None


def split_note(n_layers: int, pp: int, vp: int, split: list[int]) -> str:
    """The one line that says a layout was given the balanced split (`with_default_split`)."""
    chunks = f"pp x vp = {pp} x {vp} = {pp * vp}" if vp > 1 else f"pp = {pp}"
    return (f"{chunks} does not divide the {n_layers} layers: using the balanced uneven split "
            f"{stage_layers_slug(split)} (the split plan takes; --stage-layers sets another)")


def with_default_split(problem: Problem, layout: Layout) -> tuple[Layout, str | None]:
    """`layout` with `default_split` filled in when it names no split and pp x vp does not
    divide the layers, and the note saying so (None when nothing was filled in).

    Example: Llama-3.1-405B on pp 16 -> stage_layers [7, 8 x 14, 7] and the note
    'pp = 16 does not divide the 126 layers: using the balanced uneven split [7,8x14,7] ...'.
    """
    if layout.stage_layers is not None or layout.pp < 2:
        return layout, None
    arch = build_arch(problem.model)
    split = default_split(arch, problem.training.seq_len, layout.pp, layout.vp)
    if split is None:
        return layout, None
    filled = layout.model_copy(update={"stage_layers": split})
    return filled, split_note(arch.n_layers, layout.pp, layout.vp, split)


def split_kind(arch: Arch, seq_len: int, pp: int, vp: int, stage_layers: list) -> str:
    """How a row's split was chosen, for the JSON `layout.split`: `even` (n_layers / pp per
    stage), `balanced` (the split `plan` takes for this pp x vp) or `custom` (any other)."""
    if pp < 2 or len(set(stage_layers)) == 1:
        return "even"
    L = arch.n_layers
    found = balanced_splits(L, pp, vp, output_weight(arch, seq_len), k=1,
                            weights=layer_weights(arch, seq_len))
    if found and [int(x) for x in stage_layers] == spelled_out(L, pp, *found[0]):
        return "balanced"
    return "custom"
