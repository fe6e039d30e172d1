"""Plain-language explanations: why #1 beats #2, its largest costs, and what would help when
nothing fits."""

from __future__ import annotations

import numpy as np

from ..cost.time import TIME_ITEMS
from ..evaluate import Evaluation
from ..units import GiB

MEM_PARTS = ("params", "grads", "optimizer", "activations", "embedding_logits", "overhead")


def slug(ev: Evaluation, i: int) -> str:
    return ev.table.row(i).slug


def _largest(values: dict[str, float], total: float, k: int, unit: str, fmt: str) -> str:
    top = sorted(values.items(), key=lambda kv: -kv[1])[:k]
    return ", ".join(f"{name} {v:{fmt}} {unit} ({v / total:.0%})" for name, v in top if v > 0)


def largest_costs(ev: Evaluation, i: int, k: int = 3) -> str:
    """'compute 35.1 s (74%), ...; memory: activations 30.2 GiB (47%), ...'"""
    times = {n: float(ev.time[n][i]) for n in TIME_ITEMS}
    mems = {n: float(ev.memory[n][i]) / GiB for n in MEM_PARTS}
    return (f"time: {_largest(times, float(ev.time['step'][i]), k, 's', '.3g')}; "
            f"memory: {_largest(mems, float(ev.memory['total'][i]) / GiB, k, 'GiB', '.1f')}")


def tier_crossings(ev: Evaluation, i: int) -> str:
    """'TP nvlink, CP leaf, DP spine, PP spine': for row `i`, the outermost network tier each of
    its parallel groups crosses (`cost.network.crossings`; groups of one rank left out)."""
    from ..cost.network import TIER_GROUPS, crossings

    found = crossings(ev.problem, ev.table.take(np.array([i])))
    skip = set() if ev.arch.n_experts else {"etp", "ep", "edp"}
    if ev.table["etp"][i] == ev.table["tp"][i]:
        skip.add("etp")  # expert TP over the TP ranks (Megatron's default): the TP group
    parts = [f"{TIER_GROUPS[k]} {v[0]}" for k, v in found.items() if v[0] and k not in skip]
    return ", ".join(parts) or "every group inside one GPU"


def why_first(ev: Evaluation) -> str:
    """One line on why rank 1 beats rank 2."""
    if len(ev) < 2:
        return "#1 is the only layout that fits."
    t1, t2 = float(ev.time["step"][0]), float(ev.time["step"][1])
    if abs(t2 - t1) <= 1e-9 * t1:
        m1, m2 = float(ev.memory["total"][0]) / GiB, float(ev.memory["total"][1]) / GiB
        why = f"lower memory ({m1:.1f} vs {m2:.1f} GiB)" if m1 < m2 - 1e-9 else "the simpler layout"
        return f"#1 and #2 tie on step time ({t1:.3f} s); #1 is preferred for {why}."
    diffs = {n: float(ev.time[n][1] - ev.time[n][0]) for n in TIME_ITEMS}
    gains = [f"{n} {-d:+.3g} s" for n, d in sorted(diffs.items(), key=lambda kv: -kv[1]) if d > 1e-6 * t1][:3]
    losses = [f"{n} {-d:+.3g} s" for n, d in sorted(diffs.items(), key=lambda kv: kv[1]) if d < -1e-6 * t1][:2]
    text = (f"#1 is {(t2 - t1) / t2:.1%} faster than #2 ({t1:.3f} s vs {t2:.3f} s per step): "
            + ", ".join(gains))
    if losses:
        text += f" (against: {', '.join(losses)})"
    return text + "."


def usable_basis(problem) -> str:
    """What the usable memory is, in words: '80 GiB less CUDA context and NCCL buffers' (the
    default: per layout, it depends on the communicators the layout creates) or '80 GiB x 0.9'
    (an explicit `--usable-fraction`)."""
    c = problem.cluster.gpu.hbm_gib
    fraction = problem.training.usable_fraction
    if fraction is not None:
        return f"{c:g} GiB x {fraction:g}"
    return f"{c:g} GiB less CUDA context and NCCL buffers"


def usable_basis_of(rec: dict) -> str:
    """`usable_basis` from an estimate record (its capacity and job)."""
    cap = rec["memory_gib"]["capacity"]
    fraction = rec["job"].get("usable_fraction")
    return (f"{cap:g} GiB x {fraction:g}" if fraction is not None
            else f"{cap:g} GiB less CUDA context and NCCL buffers")


def fit_figure_of(rec: dict) -> str:
    """The memory figure an estimate record's fit compares with its usable memory, in words:
    '80.1 GiB reserved at the peak (75.2 allocated)' by default (the caching allocator's
    reserve, `cost.memory.memory_ledger` `fit_peak`), '75.2 GiB allocated' with an explicit
    `--usable-fraction` (the seed's rule). Every view that says whether a layout fits quotes it."""
    mem = rec["memory_gib"]
    fit = mem["usable"] - mem["headroom"]
    if rec["job"].get("usable_fraction") is not None:
        return f"{fit:.1f} GiB allocated"
    return f"{fit:.1f} GiB reserved at the peak ({mem['total']:.1f} allocated)"


def usable_memory_line(records: list[dict]) -> str:
    """'usable memory per GPU: 80 GiB less CUDA context and NCCL buffers, 76.2-77.7 GiB across
    these layouts (their communicators differ); ! = memory band above it (2 of 10)' from the
    ranked records (their `memory_gib.usable`, the one figure every view shows)."""
    if not records:
        return ""
    usable = [r["memory_gib"]["usable"] for r in records]
    basis = usable_basis_of(records[0])
    lo, hi = min(usable), max(usable)
    spread = (f"{lo:.1f} GiB" if round(lo, 1) == round(hi, 1) else
              f"{lo:.1f}-{hi:.1f} GiB across these layouts (their communicators differ)")
    risky = sum(r["memory_risk"] for r in records)
    text = f"usable memory per GPU: {basis}, {spread}"
    if risky:
        text += (f"; ! = the memory band's upper end (mem high) exceeds it: may run out of "
                 f"memory ({risky} of {len(records)})")
    return text


def nothing_fits_message(result) -> str:
    """'0 of 41,472 layouts fit in the usable memory (80 GiB less ...); closest dp8-tp8-pp2
    needs 91.2 GiB of its 77.7 (...); try ...'"""
    p = result.problem
    head = f"0 of {result.n_layouts:,} layouts fit in the usable memory ({usable_basis(p)})"
    blocked = result.reject_counts.get(f"target_{result.target}", 0) if result.target else 0
    if blocked:
        return (f"{head} and can be launched by {result.target}: {blocked:,} layouts fit but "
                f"{result.target} cannot express them; try another --target or none")
    if result.nearest is None or len(result.nearest) == 0:
        counts = ", ".join(f"{k} {v:,}" for k, v in sorted(result.reject_counts.items(), key=lambda kv: -kv[1]))
        text = (f"none of the {result.n_layouts:,} layouts can run: each breaks at least one rule "
                f"({counts}; a layout can break several)")
        found = passing_alternatives(result)
        if found:
            return f"{text}. Layouts would pass the rules with {' or '.join(found)}"
        return (f"{text}. Check the model's heads and layers against the GPU count and the "
                "global batch against dp")
    ev = result.nearest
    usable = float(ev.memory["usable"][0]) / GiB
    if usable <= 0:  # no layout can help: the GPU is smaller than what lies outside PyTorch
        outside = float(ev.memory["capacity"][0]) / GiB - usable
        return (f"{head}: the {p.cluster.gpu.name}'s {p.cluster.gpu.hbm_gib:g} GiB are less than "
                f"the CUDA context and NCCL buffers alone ({outside:.1f} GiB), so no layout "
                "fits; check the GPU's `hbm_gib`")
    mems = {n: float(ev.memory[n][0]) / GiB for n in MEM_PARTS}
    top = sorted(mems.items(), key=lambda kv: -kv[1])[:2]
    parts = ", ".join(f"{n} {v:.1f}" for n, v in top)
    hints = _fitting_changes(p, ev)
    t = ev.table
    if top[0][0] == "activations" and int(t["mb"][0]) > 1:
        hints.append("--micro-batch 1")
    hints.append("more GPUs")
    if p.training.seq_len >= 16384 and int(t["cp"][0]) == 1:
        hints.append("context parallelism (--cp)")
    return (f"{head}; closest {slug(ev, 0)} needs {float(ev.memory['fit_peak'][0]) / GiB:.1f} GiB "
            f"of its {float(ev.memory['usable'][0]) / GiB:.1f} usable ({parts}); {overflow(ev, 0)}; "
            f"try {' or '.join(hints)}")


PROBE_BUDGET_ROWS = 6_000_000
"""Candidate layouts the search for passing alternatives may check in all (about a second:
the rules alone check ~6 M candidates a second on one core)."""


def passing_alternatives(result, budget_rows: int = PROBE_BUDGET_ROWS) -> list[str]:
    """When no layout of `result` passes the rules: the nearest changes of the problem under
    which some do, each with how many pass, e.g. '--gpus 64 (85,572 pass)', '--global-batch
    72 (18,144 pass)', '--allow-tp-across-nodes (...)'. Tried, nearest first, with the same
    search space and rules: GPU counts a whole number of nodes (up to 4) below and above, the
    global batches nearest below and above that some divisor of the GPU count (a dp) divides,
    and TP across nodes where the `tp_in_node` rule rejected layouts. Each probe is
    `enumerate_valid` (rules only, no costing); probing stops once `budget_rows` candidates
    have been checked in all."""
    from ..errors import SpecError
    from ..problem import with_gpu_count
    from .enumerate import divisors, enumerate_valid

    p, space = result.problem, result.space
    rules = result.rules or None
    n, g, batch = p.cluster.n_gpus, p.cluster.gpus_per_node, p.training.global_batch
    checked = [0]

    def passing(problem, probe_rules=rules) -> int:
        if checked[0] >= budget_rows:
            return 0
        try:
            found = enumerate_valid(problem, space, probe_rules)
        except SpecError:  # e.g. an axis the user fixed has no value left at that size
            return 0
        checked[0] += found.n_pruned + len(found.table)
        return len(found.table)

    step = g if n >= g else 1
    counts = {}
    for k in range(1, 5):  # the nearest count below and above that has passing layouts
        for side in (-1, 1):
            m = n + side * k * step
            if side in counts or m < 1 or (m > g and m % g):
                continue
            got = passing(with_gpu_count(p, m))
            if got:
                counts[side] = f"--gpus {m} ({got:,} pass)"
    out = [counts[side] for side in (-1, 1) if side in counts]
    ends = {v for d in divisors(n).tolist() for v in (batch // d * d, -(-batch // d) * d)}
    for side in (sorted((v for v in ends if 0 < v < batch), reverse=True),
                 sorted(v for v in ends if v > batch)):  # nearest below, then above
        for b in side[:4]:
            got = passing(p.model_copy(update={"training": p.training.model_copy(
                update={"global_batch": b})}))
            if got:
                out.append(f"--global-batch {b} ({got:,} pass)")
                break
    if result.reject_counts.get("tp_in_node") and rules is not None:
        lifted = tuple(r for r in rules if r.name != "tp_in_node")
        got = passing(p, lifted)
        if got:
            out.append(f"--allow-tp-across-nodes ({got:,} pass)")
    return out


def overflow(ev, i: int) -> str:
    """'the first stage overflows by 3.2 GiB (middle 1.1, last fits)': which stage kinds of row i
    exceed the usable memory and by how much (the figure `fit_peak` compares: reserved by
    default, allocated with an explicit usable fraction)."""
    figure = "reserved" if ev.problem.training.usable_fraction is None else "allocated"
    usable = float(ev.memory["usable"][i])
    pp = int(ev.table["pp"][i])
    names = ("first",) if pp == 1 else ("first", "last") if pp == 2 else ("first", "middle", "last")
    over = {n: (float(ev.memory[f"{n}.{figure}"][i]) - usable) / GiB for n in names}
    worst = max(over, key=over.get)
    label = "the GPU" if pp == 1 else f"the {worst} stage"
    text = f"{label} overflows by {over[worst]:.1f} GiB ({figure} peak)"
    others = [f"{n} {'+' if v > 0 else ''}{v:.1f}" for n, v in over.items() if n != worst]
    return text + (f"; other stages: {', '.join(others)} GiB" if others else "")


def _fitting_changes(problem, ev: Evaluation) -> list[str]:
    """The hints among `--recompute full`, `--zero 3` and both together that make one of the
    nearest misses fit (memory ledger within the usable memory, default rules kept): a hint
    is only given when it would actually fit."""
    from ..cost.model_arch import build_arch
    from ..cost.memory import memory_ledger
    from ..layouts import LayoutTable
    from ..rules import active_rules, check_rules

    arch = build_arch(problem.model)
    t = ev.table

    def fits(**changes) -> bool:
        cols = {k: (np.full(len(t), v, dtype=np.int64) if k in changes else t[k])
                for k, v in ((k, changes.get(k)) for k in t.columns)}
        table = LayoutTable(cols, t.n_layers)
        ok = check_rules(problem, arch, table, active_rules()) == 0
        with np.errstate(divide="ignore", invalid="ignore"):
            mem = memory_ledger(problem, arch, table)
        return bool(np.any(ok & (mem["total"] <= mem["usable"])))

    recompute = bool(np.any(t["rc"] != 2)) and fits(rc=2)
    zero3 = bool(np.any(t["zero"] < 3)) and fits(zero=3)
    if recompute or zero3:
        return [h for h, ok in (("--recompute full", recompute), ("--zero 3", zero3)) if ok]
    if bool(np.any((t["rc"] != 2) | (t["zero"] < 3))) and fits(rc=2, zero=3):
        return ["--recompute full --zero 3"]
    return []


def versus(result, layout) -> str:
    """'#1 ... against dp128-tp8-pp16[7,8x14,7]-...: that layout ranks N of M, X % slower
    (its step 9.1 s vs 8.4 s): bubble +0.6 s, ...' or why it cannot run / fit."""
    from ..splits import with_default_split

    layout = with_default_split(result.problem, layout)[0]
    st = result.standing(layout)
    rec = st["estimate"]
    name = layout.resolved(result.problem.cluster.n_gpus).slug
    if not rec["fits"]:
        mem = rec["memory_gib"]
        return (f"{name} does not fit: {fit_figure_of(rec)} of its {mem['usable']:.1f} usable "
                f"({usable_basis(result.problem)})")
    if not len(result.ranked):
        return f"{name}: {rec['time_s']['step']:.3f} s per step; nothing else fits"
    best = {k: float(result.ranked.time[k][0]) for k in TIME_ITEMS}
    diffs = sorted(((k, rec["time_s"][k] - best[k]) for k in TIME_ITEMS), key=lambda kv: -abs(kv[1]))
    parts = ", ".join(f"{k} {d:+.3g} s" for k, d in diffs[:3] if abs(d) > 1e-9)
    return (f"{name} ranks {st['rank']:,} of {st['n_fit']:,} fitting layouts, "
            f"{st['gap']:+.1%} against #1 ({rec['time_s']['step']:.3f} s vs "
            f"{float(result.ranked.time['step'][0]):.3f} s per step): {parts}")


def cp_forms_line(result) -> str | None:
    """'best per context-parallel form: a2a+ring #1 (2308.9 s), ring #7 (+0.1 %), a2a #57
    (+2.3 %), allgather none fits': the fastest fitting layout of each form the search tried
    (rank among every fitting layout); None when no fitting layout uses cp > 1."""
    from ..specs.layout import CP_COMM_NAMES

    ev = result.survivors
    if ev is None or not len(ev) or not np.any(ev.table["cp"] > 1):
        return None
    from .enumerate import cp_forms

    step = ev.time["step"]
    best = float(step[0])
    parts = []
    multi = ev.table["cp"] > 1
    for form in cp_forms(result.problem, result.space):
        code = next(c for c, f in CP_COMM_NAMES.items() if f == form)
        rows = np.nonzero(multi & (ev.table["cc"] == code))[0]
        if not len(rows):
            parts.append(f"{form.value} none fits")
            continue
        i = int(rows[0])
        parts.append(f"{form.value} #{i + 1:,} ({float(step[i]):.4g} s, "
                     f"{float(step[i]) / best - 1:+.1%})")
    return "best per context-parallel form: " + ", ".join(parts)
