"""Which layers, parameters and in-flight micro-batches each pipeline stage holds.

The first stage holds the input embedding and the most in-flight micro-batches; the last holds
the output layer, the logits and (with 1F1B) one micro-batch. The ledger evaluates both and a
middle stage, and reports the most loaded (reference §1.3, §1.5, §3.3)."""

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


def micro_batches(global_batch: int, t: LayoutTable) -> np.ndarray:
    """Micro-batches per step per pipeline (= gradient accumulation steps), m = B / (dp * b)."""
    return global_batch // np.maximum(t["dp"] * t["mb"], 1)


def _held(pp, vp, m, rank):
    """Activation multiplier of pipeline rank `rank` (units of the stage's layers x one
    micro-batch), from Megatron's warm-up counts (schedules.py::get_pp_rank_microbatches,
    reference §1.5): 1F1B holds min(m, p - r) micro-batches; interleaved holds
    2(p - r - 1) + (v - 1)p + 1 chunk-micro-batches of L/(pv) layers, at most the m v that exist."""
    one_f_one_b = np.minimum(pp - rank, m)
    chunks = np.minimum(2 * (pp - rank - 1) + (vp - 1) * pp + 1, m * vp)
    held = np.where(vp > 1, chunks / vp, one_f_one_b)
    return np.where(pp > 1, held, 1.0).astype(np.float64)


def stages(arch: Arch, t: LayoutTable, global_batch: int) -> dict[str, Stage]:
    """First, middle and last stage of every row (identical when pp = 1)."""
    pp, vp = t["pp"].astype(np.float64), t["vp"].astype(np.float64)
    m = micro_batches(global_batch, t).astype(np.float64)
    per = arch.n_layers / pp
    nd = float(arch.n_dense_layers)
    dense_first = np.minimum(nd, per)
    dense_last = np.clip(nd - (pp - 1) * per, 0, per)
    dense_mid = np.where(pp > 2, np.clip(nd - per, 0, per), dense_first)
    single = pp == 1
    one = np.ones_like(pp)
    zero = np.zeros_like(pp)
    held_first = _held(pp, vp, m, 0)
    held_last = _held(pp, vp, m, pp - 1)
    held_mid = np.where(pp > 2, _held(pp, vp, m, 1), held_first)  # most-loaded middle rank
    return {
        "first": Stage("first", dense_first, per - dense_first, one,
                       np.where(single, one, zero), held_first, held_first),
        "middle": Stage("middle", dense_mid, per - dense_mid, np.where(single, one, zero),
                        np.where(single, one, zero), held_mid, np.where(single, one, zero)),
        "last": Stage("last", dense_last, per - dense_last, np.where(single, one, zero), one,
                      held_last, np.where(single, one, zero)),
    }
