"""Near-ties and a robust pick among them.

The planner's step times are uncertain by the error band of `autoparallel.bands` (about
-30 %..+15 % on calibrated GPUs), while the top layouts of a plan are often within a few percent
of each other: ranking inside the band is noise. So:

- **tied**: a layout whose band overlaps the fastest layout's band (its `step_low` is at most the
  fastest's `step_high`) is tied with it.
- **robustness penalty** (lower is better), in units of a fractional slowdown:

      penalty = net_sensitivity + gemm_sensitivity + exposed_comm_share
                + 0.10 x memory_used + 0.02 x (parallel_dims - 1) + 0.05 x [tp x ep leaves the node]
                + memory_over

  - `net_sensitivity`: step time with the scale-out (NIC) bandwidth 20 % lower / step - 1
    (congestion, a degraded rail, a slower fabric than the preset's);
  - `gemm_sensitivity`: step time with `gemm_efficiency` 10 % lower / step - 1 (a slower kernel
    library or clock than calibrated);
  - `exposed_comm_share`: exposed TP + CP + EP + PP + DP communication / step (the least
    certain items, docs/validation.md);
  - `memory_used`: memory total / usable (headroom against fragmentation and the memory band);
  - `parallel_dims`: how many of dp, tp, pp, cp, ep exceed 1 (each is a code path, a group and
    a failure mode more);
  - `tp_ep_in_node`: tensor parallelism, or the expert-TP x EP block, crossing the scale-up
    domain;
  - `memory_over`: how far the upper end of the memory band (`memory_gib.total_high`) lies
    above the usable memory, as a share of it (0 when it stays below): a layout that may run
    out of memory (`memory_risk`).

  The weights make the measured sensitivities dominate; the last three terms separate layouts
  that are otherwise alike. Both perturbations re-run the time ledger on the whole survivor
  table (vectorised, one extra ledger per perturbation).
- **robust score** = step x (1 + penalty), seconds: the step time priced with its risks. The
  band alone ties far too much to choose by the penalty alone: on calibrated GPUs the p10-p90
  band spans about x0.94-x1.5 of the prediction, so layouts up to ~1.6 x slower than the fastest
  overlap it (thousands in a 70B plan); the score keeps speed in the choice and lets robustness
  decide between layouts of similar speed.

`plan(..., rank_by="robust")` orders the tied group ahead of the rest: the layouts without memory
risk by robust score, then those with it (an out-of-memory failure costs the whole run, not a
few percent);
`rank_by="time"` keeps the fastest first and still reports `tied` and `robustness`.
"""

from __future__ import annotations

import numpy as np

from ..cost.time import time_ledger
from ..evaluate import Evaluation

NET_DROP = 0.20
"""Fractional drop of the scale-out bandwidth in the network perturbation."""
GEMM_DROP = 0.10
"""Fractional drop of `gemm_efficiency` in the compute perturbation."""
W_MEMORY, W_DIMS, W_CROSS_NODE = 0.10, 0.02, 0.05
"""Weights of memory use, extra parallel dimensions and TP x EP across the scale-up domain."""
RANK_BY = ("time", "robust")
ROBUSTNESS_KEYS = ("score", "penalty", "net_sensitivity", "gemm_sensitivity", "exposed_comm_share",
                   "memory_used", "parallel_dims", "tp_ep_in_node", "memory_over", "memory_risk")


def perturbed_steps(ev: Evaluation) -> tuple[np.ndarray, np.ndarray]:
    """Step seconds of every row with the network 20 % slower, and with GEMMs 10 % slower."""
    p = ev.problem
    slow_net = p.model_copy(update={"cluster": _slower_network(p.cluster)})
    slow_gemm = p.model_copy(update={"profile": p.profile.model_copy(
        update={"gemm_efficiency": p.profile.gemm_efficiency * (1 - GEMM_DROP)})})
    with np.errstate(divide="ignore", invalid="ignore"):
        net = time_ledger(slow_net, ev.arch, ev.table)["step"]
        gemm = time_ledger(slow_gemm, ev.arch, ev.table)["step"]
    return net, gemm


def _slower_network(c):
    """The cluster with every network tier (above the scale-up domain) `NET_DROP` slower."""
    if c.network is None:
        return c.model_copy(update={"inter_gb_per_s": c.inter_bytes_per_s * (1 - NET_DROP) / 1e9})
    nic = c.inter_bytes_per_s / 1e9  # the override where given, else the GPU's NIC
    tiers = [c.network.tiers[0]] + [
        t.model_copy(update={"gb_per_s": (t.gb_per_s if t.gb_per_s is not None and
                                          c.inter_gb_per_s is None else nic) * (1 - NET_DROP)})
        for t in c.network.tiers[1:]]
    return c.model_copy(update={"inter_gb_per_s": None,
                                "network": c.network.model_copy(update={"tiers": tiers})})


def robustness(ev: Evaluation, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The penalty and its terms for every row (see the module docstring). With `rows` (a
    boolean mask) the terms that need the time ledger's communication items or the two
    perturbed ledgers (`net_sensitivity`, `gemm_sensitivity`, `exposed_comm_share`, and so
    `penalty` and `score`) are costed for those rows only and are NaN for the others; the memory
    and shape terms are costed for every row (`plan` needs the former for the tied group and
    the ranked top alone)."""
    from ..bands import exposed_comm_share, memory_total_high
    from ..evaluate import memory_risk

    step = ev.time["step"]
    n = len(step)
    idx = np.arange(n) if rows is None else np.flatnonzero(rows)
    net, gemm, share = (np.full(n, np.nan) for _ in range(3))
    if len(idx):
        sub = ev if len(idx) == n else ev.take(idx)
        net[idx], gemm[idx] = perturbed_steps(sub)
        share[idx] = exposed_comm_share(sub.time)
    t = ev.table
    dims = sum((t[k] > 1).astype(int) for k in ("dp", "tp", "pp", "cp", "ep"))
    g = ev.problem.cluster.nvlink_domain
    in_node = (t["tp"] <= g) & (t["etp"] * t["ep"] <= g)  # TP, and the expert-TP x EP block
    used = ev.memory["fit_peak"] / ev.memory["usable"]
    high = memory_total_high(ev.problem, ev.memory["total"])
    out = {"net_sensitivity": net / step - 1.0, "gemm_sensitivity": gemm / step - 1.0,
           "exposed_comm_share": share, "memory_used": used,
           "parallel_dims": dims, "tp_ep_in_node": in_node,
           "memory_over": np.maximum(high / ev.memory["usable"] - 1.0, 0.0),
           "memory_risk": memory_risk(ev.memory, high)}
    out["penalty"] = (out["net_sensitivity"] + out["gemm_sensitivity"] + out["exposed_comm_share"]
                      + W_MEMORY * used + W_DIMS * np.maximum(dims - 1, 0)
                      + W_CROSS_NODE * (~in_node) + out["memory_over"])
    out["score"] = step * (1.0 + out["penalty"])
    return out


def tied_with_first(step_low: np.ndarray, step_high: np.ndarray) -> np.ndarray:
    """Rows (fastest first) whose band overlaps row 0's band."""
    if not len(step_low):
        return np.zeros(0, dtype=bool)
    return step_low <= step_high[0]


def tied_group(ev: Evaluation) -> np.ndarray:
    """`tied_with_first` over the rows of `ev` (fastest first), with the bands costed only for
    the rows that can overlap row 0's: a row's band starts at its step x exp(-p90) of its
    regime (`bands.bands_for`), so a row slower than row 0's `step_high` x exp(the larger p90)
    cannot, and a row's band is its own (the same numbers as costing every row's)."""
    from ..bands import step_bases

    n = len(ev)
    if not n:
        return np.zeros(0, dtype=bool)
    high0 = float(ev.take(np.array([0])).bands().step_high[0])
    widest = max(b["p90"] for b in step_bases(ev.problem).values())
    step = ev.time["step"]
    can = np.flatnonzero(step <= high0 * np.exp(widest) * (1.0 + 1e-9))
    can = np.union1d(can, [0])
    tied = np.zeros(n, dtype=bool)
    tied[can] = ev.take(can).bands().step_low <= high0
    return tied


def robust_order(step: np.ndarray, tied: np.ndarray, score: np.ndarray,
                 risk: np.ndarray | None = None) -> np.ndarray:
    """Indices: the tied rows without memory risk by robust score (then step), then the tied
    rows with it (same order), then the others in their given order."""
    idx = np.arange(len(step))
    risk = np.zeros(len(step), dtype=bool) if risk is None else np.asarray(risk, dtype=bool)
    head = idx[tied][np.lexsort((step[tied], score[tied], risk[tied]))]
    return np.concatenate([head, idx[~tied]])


def record_of(rob: dict[str, np.ndarray], i: int) -> dict:
    """Row i's robustness as the plan JSON carries it."""
    return {"score_s": float(rob["score"][i]), "penalty": float(rob["penalty"][i]), "net_sensitivity": float(rob["net_sensitivity"][i]),
            "gemm_sensitivity": float(rob["gemm_sensitivity"][i]),
            "exposed_comm_share": float(rob["exposed_comm_share"][i]),
            "memory_used": float(rob["memory_used"][i]),
            "parallel_dims": int(rob["parallel_dims"][i]),
            "tp_ep_in_node": bool(rob["tp_ep_in_node"][i]),
            "memory_over": float(rob["memory_over"][i])}


def why_recommended(result) -> str:
    """One line: how many layouts tie with the fastest and why the recommended one was chosen."""
    n_tied = int(np.count_nonzero(result.tied))
    rob = result.robustness
    if not n_tied:
        return ""
    step = result.survivors.time["step"]
    fastest = int(np.argmin(step))
    order = robust_order(step, result.tied, rob["score"], rob["memory_risk"])
    best = int(order[0])
    slug = result.survivors.table.row(best).slug
    band = result.survivors.take(np.array([fastest])).bands()  # this row's alone
    lo, hi = float(band.step_low[0]), float(band.step_high[0])
    head = (f"{n_tied:,} layout(s) tie with the fastest within its error band "
            f"({lo:.3g}-{hi:.3g} s per step)")
    if n_tied == 1:
        return head + "; nothing to choose between."
    r = record_of(rob, best)
    if best == fastest:
        choice = f"the fastest, {slug}, also has the best robust score ({r['score_s']:.3g} s)"
    else:
        choice = (f"best robust score: {slug} ({(step[best] / step[fastest] - 1):+.1%} step time, "
                  f"score {r['score_s']:.3g} s vs {rob['score'][fastest]:.3g} s for the fastest)")
    text = (f"{head}; {choice}: penalty {r['penalty']:.3f} "
            f"(network -20 %: {r['net_sensitivity']:+.1%}, GEMM -10 %: {r['gemm_sensitivity']:+.1%}, "
            f"exposed comm {r['exposed_comm_share']:.0%}, memory {r['memory_used']:.0%} of usable, "
            f"{r['parallel_dims']} parallel dims, TP x EP {'inside' if r['tp_ep_in_node'] else 'across'} "
            "the node" + (f", memory band {r['memory_over']:.0%} over usable"
                          if r["memory_over"] > 0 else "") + ")")
    if best == fastest:
        return text + "."
    if result.rank_by == "robust":
        return text + "; ranked first (--rank-by robust)."
    return text + "; --rank-by robust ranks it first."
