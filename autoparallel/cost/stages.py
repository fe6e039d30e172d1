"""Which layers, parameters and in-flight micro-batches each pipeline stage holds.

The first stage holds the input embedding and the most in-flight micro-batches; the last holds
the output layer, the logits and (with 1F1B) one micro-batch. The ledger evaluates both and a
middle stage, and reports the most loaded (reference §1.3, §1.5, §3.3).

Layers per stage: the even split L / p, or an uneven one with `lf` layers on the first stage,
`ll` on the last and (L - lf - ll) / (p - 2) on each middle stage (Megatron-Core's
`--decoder-first/last-pipeline-num-layers`, launchers.md §1.1). Micro-batches held per schedule
follow reference §3.3 (1F1B/interleaved from Megatron's warm-up counts; ZB-H1 and ZB-V hold what
1F1B's first stage holds, p, on every rank; DualPipe p + 1, DeepSeek-V3 report Table 2;
DualPipeV p + 1/2, deepseek-ai/DualPipe README)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layouts import LayoutTable
from .arch import Arch

STAGES = ("first", "middle", "last")


@dataclass(frozen=True)
class Stage:
    """Per-row description of one pipeline stage (arrays)."""

    name: str
    n_dense: np.ndarray
    n_moe: np.ndarray
    embed: np.ndarray
    """1 where the stage holds the input embedding."""
    output: np.ndarray
    """1 where the stage holds the output layer and the loss."""
    inflight: np.ndarray
    """Activation multiplier: stage layers' micro-batches held at the peak (in units of the
    stage's layers x one micro-batch)."""
    inflight_mb: np.ndarray
    """Micro-batches whose embedding output is alive at the peak (first stage)."""
    copies: np.ndarray | float = 1.0
    """Parameter copies the stage's rank holds: 2 with DualPipe (stages i and p-1-i on one rank,
    DeepSeek-V3 report Table 2), else 1."""
    recomputed: np.ndarray | float = 0.0
    """Share of the stage's layers fully recomputed (`recomputed_share`)."""
    mtp: np.ndarray | float = 0.0
    """Multi-token-prediction modules the stage runs (the last stage: `Arch.n_mtp`), each counted
    among its layers (`n_moe` or `n_dense`) and as one more pass through the output head."""
    counts: dict | None = None
    """Hybrid models: layers of each type (pattern letter -> array) on the stage; None else."""


def recomputed_share(t: LayoutTable, layers) -> np.ndarray:
    """Share of a stage's `layers` fully recomputed: 1 with full recompute of every layer, 0
    without full recompute, and min(N, chunk layers) / chunk layers with full recompute of the
    first N layers of each model chunk (Megatron `--recompute-method block
    --recompute-num-layers N`, transformer_block.py `_checkpointed_forward`: layers
    [0, N) of each chunk are checkpointed, the rest keep their activations). Dense and MoE
    layers are taken in proportion."""
    full = (t["rc"] == 2).astype(np.float64)
    rn = t["rn"]
    if not np.any(rn >= 0):
        return full
    chunk = np.maximum(np.asarray(layers, dtype=np.float64) / t["vp"], 1e-9)
    part = np.clip(rn / chunk, 0.0, 1.0)
    return full * np.where(rn < 0, 1.0, part)


def micro_batches(global_batch: int, t: LayoutTable) -> np.ndarray:
    """Micro-batches per step per pipeline (= gradient accumulation steps), m = B / (dp * b)."""
    return global_batch // np.maximum(t["dp"] * t["mb"], 1)


def _held(pp, vp, m, rank, sch=None):
    """Activation multiplier of pipeline rank `rank` (units of the stage's layers x one
    micro-batch), from Megatron's warm-up counts (schedules.py::get_pp_rank_microbatches,
    reference §1.5): 1F1B holds min(m, p - r) micro-batches; interleaved holds
    2(p - r - 1) + (v - 1)p + 1 chunk-micro-batches of L/(pv) layers, at most the m v that exist.
    ZB-H1 p on every rank: rank r defers r weight-gradient (W) passes to the end (Qi et al. 2023
    §3.1, Fig. 3), and a micro-batch whose W is pending keeps nearly all its activations (M_W ~
    M_B, their Table 1), so 1F1B's p - r plus r pending; ZB-V p on every rank, its V pairing the
    heavy first chunk with the light last one (Qi et al. 2024; reference §3.3); DualPipe p + 1
    (DeepSeek-V3 report Table 2); DualPipeV 2p + 1 chunks of half the rank's layers, p + 1/2
    (deepseek-ai/DualPipe README: PP + 1 chunks per device, PP = 2p); at most the m that exist.
    tests/test_pipeline.py replays each schedule's order and counts the same peaks."""
    one_f_one_b = np.minimum(pp - rank, m)
    chunks = np.minimum(2 * (pp - rank - 1) + (vp - 1) * pp + 1, m * vp)
    held = np.where(vp > 1, chunks / vp, one_f_one_b)
    if sch is not None and np.any(sch > 1):
        held = np.select(
            [(sch == 2) | (sch == 3), sch == 4, sch == 5],
            [np.minimum(pp, m), np.minimum(pp + 1, m), np.minimum(pp + 0.5, m)], held)
    return np.where(pp > 1, held, 1.0).astype(np.float64)


def stage_layer_counts(n_layers: int, t: LayoutTable):
    """(first, middle, last, before_last) transformer layers per pipeline rank (float arrays):
    the even split n_layers / pp, or the row's uneven `lf`/`ll` with the middle stages sharing
    the rest; `before_last` = layers on the stages before the last."""
    pp = t["pp"].astype(np.float64)
    per = n_layers / pp
    uneven = (t["lf"] > 0) | (t["ll"] > 0)
    if not np.any(uneven):
        return per, per, per, (pp - 1) * per
    first = np.where(uneven, t["lf"], per)
    last = np.where(uneven, t["ll"], per)
    mid = np.where(uneven & (pp > 2), (n_layers - first - last) / np.maximum(pp - 2, 1), per)
    mid = np.where(uneven & (pp == 2), first, mid)  # no middle stage: report the first
    before_last = np.where(uneven, n_layers - last, (pp - 1) * per)
    return first, mid, last, before_last


def stages(arch: Arch, t: LayoutTable, global_batch: int) -> dict[str, Stage]:
    """First, middle and last stage of every row (identical when pp = 1)."""
    if arch.hybrid is not None:  # a pattern of layer types: its layers on each stage
        return arch.hybrid.stages(arch, t, global_batch)
    pp, vp = t["pp"].astype(np.float64), t["vp"].astype(np.float64)
    sch = t["sch"]
    m = micro_batches(global_batch, t).astype(np.float64)
    first, mid, last, before_last = stage_layer_counts(arch.n_layers, t)

    def moe_upto(x):
        """MoE layers among the first x: after the leading dense ones, every `moe_layer_step`-th
        (Llama-4 `interleave_moe_layer_step`; 1 for DeepSeek, Qwen3, Mixtral)."""
        if not arch.n_moe_layers:
            return np.zeros_like(np.asarray(x, dtype=np.float64))
        return np.floor(np.maximum(np.asarray(x, dtype=np.float64) - arch.n_lead_dense, 0.0)
                        / arch.moe_layer_step + 1e-9)

    dense_first = first - moe_upto(first)
    dense_last = last - (moe_upto(before_last + last) - moe_upto(before_last))
    dense_mid = np.where(pp > 2, mid - (moe_upto(first + mid) - moe_upto(first)), dense_first)
    single = pp == 1
    one = np.ones_like(pp)
    zero = np.zeros_like(pp)
    held_first = _held(pp, vp, m, 0, sch)
    held_last = _held(pp, vp, m, pp - 1, sch)
    held_mid = np.where(pp > 2, _held(pp, vp, m, 1, sch), held_first)  # most-loaded middle rank
    copies = np.where(sch == 4, 2.0, 1.0) if np.any(sch == 4) else 1.0
    # multi-token prediction: its blocks (of the model's last layer kind) on the last stage
    # (Megatron-Core places `mtp` after the decoder layers; DeepSeek-V3 report §3.2.1)
    mtp_moe = float(arch.n_mtp) if arch.n_moe_layers else 0.0
    mtp_dense = float(arch.n_mtp) - mtp_moe
    return {
        "first": Stage("first", dense_first, first - dense_first, one,
                       np.where(single, one, zero), held_first, held_first, copies,
                       recomputed_share(t, first)),
        "middle": Stage("middle", dense_mid, mid - dense_mid, np.where(single, one, zero),
                        np.where(single, one, zero), held_mid, np.where(single, one, zero), copies,
                        recomputed_share(t, mid)),
        "last": Stage("last", dense_last + mtp_dense, last - dense_last + mtp_moe,
                      np.where(single, one, zero), one, held_last, np.where(single, one, zero),
                      copies, recomputed_share(t, last), mtp=float(arch.n_mtp)),
    }
