"""Vectorised enumeration of every candidate layout of a problem (struct of arrays).

The product of the axes is built with numpy: the (tp, pp, cp) factorisations of the GPU count
with dp derived, crossed with the other axes' candidate universes, then masked to the
combinations the issue defines as candidates (vp only where the layers split into pp x vp chunks,
evenly or unevenly, ep only where it divides the experts and dp x cp, sp only with tp > 1,
micro-batches dividing the per-replica batch, each pipeline schedule with the chunk count it
runs). Each (pp, vp) gets the even split where it exists and the time-balanced uneven splits
(`splits.balanced_splits`). Rules that reject candidates (heads, sequence, placement, ...) run
later.

Two guards keep bad input from reaching numpy: before each cross product is built its size is
checked against `limits.MAX_LAYOUTS` (beyond it: a SpecError with the estimated count and the
options that narrow it, or the sampler path), and a filter given by the user that leaves no
candidate is a SpecError naming the filter and the values that would work.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np

from ..cost.model_arch import build_arch
from ..errors import SpecError
from ..layouts import ALL_LAYERS, COLUMNS, LayoutTable
from ..limits import MAX_LAYOUTS
from ..specs.layout import (CP_COMM_CODES, RECOMPUTE_CODES, SCHEDULE_CODES, CpComm, Schedule,
                            modules_mask)
from ..specs.problem import Problem
from .space import SearchSpace
from ..splits import balanced_splits, layer_weights, output_weight

_SCHEDULE_VP = np.array([1, 0, 1, 2, 1, 2])
"""Chunks per rank each schedule code runs (0: any vp > 1)."""


def divisors(n: int) -> np.ndarray:
    """Sorted positive divisors of n."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return np.array(sorted(set(small) | {n // d for d in small}), dtype=np.int64)


class _TooMany(Exception):
    """A cross product would exceed `MAX_LAYOUTS` rows (caught by `enumerate_layouts`)."""

    def __init__(self, rows: int):
        self.rows = rows


def _cross(base: dict[str, np.ndarray], name: str, values) -> dict[str, np.ndarray]:
    """Cartesian product of the rows of `base` with `values` as a new column (refused, before
    it is built, when it would exceed `MAX_LAYOUTS` rows)."""
    values = np.asarray(values, dtype=np.int64)
    n = len(next(iter(base.values())))
    if n * len(values) > MAX_LAYOUTS:
        raise _TooMany(n * len(values))
    out = {k: np.repeat(v, len(values)) for k, v in base.items()}
    out[name] = np.tile(values, n)
    return out


def _repeat(v: np.ndarray, k: int) -> np.ndarray:
    """`np.repeat(v, k)`: by a broadcast copy where k is large (1.6x faster at k = 12 on 143 k
    rows, slower at k = 2)."""
    if k < 8:
        return np.repeat(v, k)
    return np.broadcast_to(v[:, None], (len(v), k)).reshape(-1)


def _cross_all(base: dict[str, np.ndarray], axes: list[tuple[str, object]]) -> dict[str, np.ndarray]:
    """`_cross` with each (name, values) of `axes` in turn, built at once: the same rows in the
    same order, without the intermediate tables (each of `base`'s columns repeated once)."""
    values = [np.asarray(v, dtype=np.int64) for _, v in axes]
    n = len(next(iter(base.values())))
    times = math.prod(len(v) for v in values)
    if n * times > MAX_LAYOUTS:
        raise _TooMany(n * times)
    out = {k: _repeat(v, times) for k, v in base.items()}
    inner = times
    for (name, _), v in zip(axes, values):
        inner //= len(v)  # rows per value of this axis within one block of its outer axes
        out[name] = np.tile(np.repeat(v, inner), n * (times // (inner * len(v))))
    return out


def _keep(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in cols.items()}


def _too_many_message(rows: int, problem: Problem, space: SearchSpace) -> str:
    given = [a for a in ("tp", "pp", "cp", "vp", "micro_batch") if getattr(space, a) is not None]
    free = [f"--{a.replace('_', '-')}" for a in ("tp", "pp", "cp", "vp", "micro_batch", "zero",
                                                 "recompute", "schedule") if a not in given]
    return (f"enumerating the layouts of {problem.cluster.n_gpus:,} GPUs would build {rows:,} "
            f"candidate rows at one step, more than the limit {MAX_LAYOUTS:,} (limits.py); "
            f"narrow it with {', '.join(free[:5])} (e.g. --tp 1,2,4,8 --pp 1,2,4,8), or search it "
            "with the sampler (autoparallel.search.sampler.sample_search)")


def _nonempty(cols: dict[str, np.ndarray], what: str) -> dict[str, np.ndarray]:
    """`cols` unchanged, or a SpecError when a filter of the user's left no candidate."""
    if len(next(iter(cols.values()))) == 0:
        raise SpecError(f"no layout is left: {what}")
    return cols


def _forms_given(problem: Problem, space: SearchSpace, forms) -> str:
    """The CP forms searched, as given (`SearchSpace.given`) or as the stack's default."""
    if space.cp_comm is not None:
        return space.given("cp_comm")
    return f"the {problem.stack.name} stack's CP forms ({','.join(f.value for f in forms)})"


def enumerate_layouts(problem: Problem, space: SearchSpace | None = None) -> LayoutTable:
    """Every candidate layout of `problem` allowed by `space`, as a `LayoutTable`.

    Raises:
        SpecError: the space would exceed `limits.MAX_LAYOUTS` rows, or an axis filter of the
            space leaves no candidate (the message names the filter and values that work).
    """
    space = space or SearchSpace()
    try:
        return _enumerate(problem, space)
    except _TooMany as exc:
        raise SpecError(_too_many_message(exc.rows, problem, space)) from None


@dataclass(frozen=True)
class Enumerated:
    """The candidates that pass `rules`, and how many candidates broke them (never built)."""

    table: LayoutTable
    """Candidates that pass every rule (memory is checked later)."""
    n_pruned: int
    """Candidates that break at least one rule."""
    pruned_counts: dict[str, int]
    """Per rule name, the candidates that break it (a candidate can break several)."""


def enumerate_valid(problem: Problem, space: SearchSpace | None = None,
                    rules=None, drop_dominated: bool = False) -> Enumerated:
    """The candidates of `enumerate_layouts` that pass `rules` (default: the active rules),
    built without the ones that do not: every rule depends only on the degrees, split,
    schedule, experts, SP, micro-batch and CP form, so rows are checked before they are crossed with
    ZeRO stages and recompute choices, and each rejected row counts once per combination it
    stands for. Equal to filtering `enumerate_layouts` by `check_rules` (same rows, same
    per-rule counts) when no extra axis (recompute groups or blocks, offload) is open; with one
    open, everything is built and checked (`plan`). The `MAX_LAYOUTS` limit applies to the rows
    built, so a space whose candidates exceed it can still be searched when enough break a
    rule (DeepSeek-V3 on 16,384 GPUs: 6.8 M candidates, 1.7 M pass). `drop_dominated`: also
    drop the hierarchical CP splits another split of the same row beats under every ZeRO stage
    and recompute choice (`search.dominated`), counted under `cp_split_dominated`."""
    from ..evaluate import rule_flags
    from ..rules import RULES, active_rules
    from .dominated import dominated_splits

    space = space or SearchSpace()
    rules = active_rules() if rules is None else rules
    arch = build_arch(problem.model)
    counts = {r.name: 0 for r in RULES}
    total = [0]

    def count(flags: np.ndarray, weight: int) -> None:
        # each row stands for `weight` layouts (the ZeRO x recompute choices not yet crossed in)
        total[0] += weight * int(np.count_nonzero(flags))
        for r in RULES:
            counts[r.name] += weight * int(np.count_nonzero(flags & int(r.flag)))

    def prune(cols: dict, times: int) -> dict:
        # the limit is on the rows built: the ones that pass every rule, crossed with the ZeRO
        # stages and recompute choices (`_cross` checks it again there); the rows that break a
        # rule are counted, never built, so they do not count against it
        probe = dict(cols)
        for k in ("zero", "rc", "rm", "ao", "oo"):
            probe[k] = np.zeros(len(cols["tp"]), dtype=np.int64)
        probe["rn"] = np.full(len(cols["tp"]), ALL_LAYERS, dtype=np.int64)
        table = LayoutTable(probe, problem.model.n_layers)
        flags = rule_flags(problem, arch, table, rules)
        ok = flags == 0
        if drop_dominated:
            beaten = np.zeros(len(ok), dtype=bool)
            beaten[ok] = dominated_splits(problem, arch, table.take(np.flatnonzero(ok)))
            if np.any(beaten):
                n = int(np.count_nonzero(beaten)) * times
                total[0] += n
                counts["cp_split_dominated"] = counts.get("cp_split_dominated", 0) + n
                ok &= ~beaten
        kept = int(np.count_nonzero(ok))
        if kept * times > MAX_LAYOUTS:
            raise _TooMany(kept * times)
        count(flags, times)
        return _keep(cols, ok)

    extras = (space.recompute_group is not None or space.recompute_layers is not None
              or space.recompute_layers_auto or space.offload_layers is not None
              or space.optimizer_offload is not None or space.offload_auto)
    try:
        table = _enumerate(problem, space, None if extras else prune)
    except _TooMany as exc:
        raise SpecError(_too_many_message(exc.rows, problem, space)) from None
    if extras:
        flags = rule_flags(problem, arch, table, rules)
        count(flags, 1)
        table = table.take(np.flatnonzero(flags == 0))
    return Enumerated(table, total[0], {k: v for k, v in counts.items() if v})


def _enumerate(problem: Problem, space: SearchSpace, prune=None) -> LayoutTable:
    n = problem.cluster.n_gpus
    model = problem.model
    L = model.n_layers
    B = problem.training.global_batch
    n_experts = model.moe.n_experts if model.moe else 0
    div_n = divisors(n)

    def pick(axis, auto):
        given = getattr(space, axis)
        return np.asarray(auto if given is None else given, dtype=np.int64)

    # (tp, pp, cp) with tp * pp * cp dividing n; dp derived
    cols = {"tp": pick("tp", div_n)}
    cols = _cross(cols, "pp", pick("pp", div_n))
    cols = _keep(cols, n % (cols["tp"] * cols["pp"]) == 0)  # implied below; keeps the cross small
    cols = _cross(cols, "cp", pick("cp", div_n))
    mp = cols["tp"] * cols["pp"] * cols["cp"]
    cols = _keep(cols, n % mp == 0)
    given = [a for a in ("tp", "pp", "cp") if getattr(space, a) is not None]
    _nonempty(cols, " and ".join(space.given(a) for a in given)
              + f": tp x pp x cp must divide the {n:,} GPUs; degrees that divide it: "
              + ",".join(str(int(d)) for d in div_n[:24]) + ("..." if len(div_n) > 24 else ""))
    cols["dp"] = n // (cols["tp"] * cols["pp"] * cols["cp"])

    # vp: chunks the layers split into (evenly, or unevenly with vp dividing each stage), and 2
    # for the V schedules; vp > 1 only with pp > 1
    if space.stage_layers is not None:
        cols = _keep(cols, cols["pp"] == len(space.stage_layers))
        _nonempty(cols, f"{space.given('stage_layers')} gives {len(space.stage_layers)} pipeline stages, which "
                  f"the pipeline degrees allowed (--pp, dividing the {n:,} GPUs) do not include")
    vp_auto = np.array(sorted(set(divisors(L).tolist()) | {2}), dtype=np.int64)
    vp_auto = vp_auto[vp_auto <= space.max_vp]
    cols = _cross(cols, "vp", pick("vp", vp_auto))
    cols = _keep(cols, (cols["vp"] == 1) | (cols["pp"] > 1))
    _nonempty(cols, f"{space.given('vp')}: more than one virtual stage "
              "needs a pipeline (pp > 1); allow a pp > 1 or give --vp 1")
    pinned_ends = [space.given(k) for k in
                   ("first_stage_layers", "last_stage_layers") if getattr(space, k) is not None]
    ends = (space.first_stage_layers or 0) + (space.last_stage_layers or 0)
    if pinned_ends and ends >= L + (space.first_stage_layers is not None
                                    and space.last_stage_layers is not None):
        raise SpecError(f"{' and '.join(pinned_ends)}: pins {ends} of the model's {L} layers, "
                        "leaving none for the other stages; pin fewer (the first and last stages "
                        f"hold at most {L} together, with pp 2)")
    cols = _with_splits(cols, problem, space)
    degrees = " and ".join(space.given(a) for a in ("pp", "vp")
                           if getattr(space, a) is not None)
    _nonempty(cols, (f"{' and '.join(pinned_ends)}: pinned stage ends need a pipeline (pp > 1) "
                     f"whose other stages share the rest of the {L} layers evenly"
                     if pinned_ends else
                     f"{degrees or 'pp, vp'}: pp x vp does not divide the {L} layers and no "
                     f"balanced uneven split exists for them (each model chunk holds whole "
                     f"layers); choose a pp x vp that divides {L}, or a pp whose stages can "
                     "hold it unevenly"))

    # schedule: each with the chunk count it runs; only 1F1B without a pipeline. By default the
    # schedules the job's software stack implements (StackSpec.schedules); --schedule may go
    # beyond them on purpose
    known = {x.value for x in Schedule}
    default = [Schedule(x) for x in problem.stack.schedules if x in known] or list(Schedule)
    codes = [SCHEDULE_CODES[Schedule(x)] for x in (space.schedule or default)]
    cols = _cross(cols, "sch", codes)
    need = _SCHEDULE_VP[cols["sch"]]
    sch_ok = np.where(need == 0, cols["vp"] > 1, cols["vp"] == need)
    sch_ok &= (cols["pp"] > 1) | (cols["sch"] == 0)
    cols = _keep(cols, sch_ok & ~_dominated(cols, codes, n_experts > 0))
    _nonempty(cols, f"{space.given('schedule')}: "
              "1f1b needs vp = 1; interleaved needs pp > 1 and vp > 1; zb-h1 and dualpipe "
              "need pp > 1 and vp = 1; zbv and dualpipev need pp > 1 and vp = 2")

    cols = _with_experts(cols, problem, space, pick)

    # SP only where the job's stack implements it (StackSpec.sequence_parallel); --sp may insist
    auto_sp = [True, False] if problem.stack.sequence_parallel else [False]
    sp_values = [int(v) for v in (space.sp if space.sp is not None else auto_sp)]
    cols = _cross(cols, "sp", sp_values)
    # SP exists only with tp > 1: keep one tp = 1 row per combination, with sp off
    cols = _keep(cols, (cols["tp"] > 1) | (cols["sp"] == min(sp_values)))
    cols["sp"] = np.where(cols["tp"] > 1, cols["sp"], 0)

    # micro-batch: divisors of the per-replica batch (B / dp) up to the bound
    mb_auto = divisors(B)
    mb_auto = mb_auto[mb_auto <= space.max_micro_batch]
    cols = _cross(cols, "mb", pick("micro_batch", mb_auto))
    replica_ok = B % cols["dp"] == 0
    if len(cols["mb"]) == 0:
        _nonempty(cols, "no micro-batch size to try")
    mb_ok = np.where(replica_ok, (B // cols["dp"]) % cols["mb"] == 0, cols["mb"] == cols["mb"].min())
    cols = _keep(cols, mb_ok)
    _nonempty(cols, f"{space.given('micro_batch')}: "
              f"a micro-batch must divide the per-replica batch (global batch {B:,} / dp); "
              f"sizes that divide the global batch: "
              + ",".join(str(int(d)) for d in divisors(B)[:16]))

    # the context-parallel forms of the cp > 1 rows (the cp_heads and cp_window rules read them)
    cols = _with_cp_forms(cols, problem, space)

    # ZeRO and recompute last: no rule depends on them, so rows that break a rule can be counted
    # and dropped before these crosses multiply them (`prune`)
    zero_values = pick("zero", [0, 1, 2, 3])
    rc_values = [RECOMPUTE_CODES[r] for r in (space.recompute or RECOMPUTE_CODES)]
    if prune is not None:
        cols = prune(cols, len(zero_values) * len(rc_values))
    cols = _cross_all(cols, [("zero", zero_values), ("rc", rc_values)])
    cols["rn"] = np.full(len(cols["mb"]), ALL_LAYERS, dtype=np.int64)  # full = every layer
    for k in ("rm", "ao", "oo"):  # default modules, nothing offloaded (opened by `_with_extras`)
        cols[k] = np.zeros(len(cols["mb"]), dtype=np.int64)
    cols = _with_extras(cols, problem, space)
    return LayoutTable({k: np.ascontiguousarray(cols[k]) for k in COLUMNS}, L)


def _with_experts(cols: dict[str, np.ndarray], problem: Problem, space: SearchSpace,
                  pick) -> dict:
    """Cross the rows with the expert grid (MoE Parallel Folding, arXiv 2504.14960): ep over the
    divisors of the experts and etp, by default, 1 or the row's tp (Megatron's default and the
    MoE guide's advice for fine-grained experts, "ETP=1"; the two values TorchTitan builds),
    any other divisor of the expert FFN width inside one NVLink domain when `space.etp` names
    it; kept where etp x ep divides the tp x cp x dp ranks of a stage (EP may exceed DP). Dense
    models: ep = 1, etp = tp."""
    moe = problem.model.moe
    if moe is None:
        if space.etp is not None:
            raise SpecError(f"{space.given('etp')}: the model has no experts, so "
                            "expert tensor parallelism does not apply; leave --etp out")
        cols = _cross(cols, "ep", pick("ep", [1]))
        cols = _nonempty(_keep(cols, cols["ep"] == 1),
                         f"{space.given('ep')}: the model has no "
                         "experts, so ep must be 1")
        cols["etp"] = cols["tp"].copy()
        return cols
    E, f_e = moe.n_experts, moe.expert_ffn_hidden_size
    g = problem.cluster.nvlink_domain
    ep_auto = divisors(E)
    etp_auto = divisors(f_e)
    etp_auto = etp_auto[(etp_auto <= g) & (g % etp_auto == 0)]
    cols = _cross(cols, "ep", pick("ep", ep_auto))
    cols = _keep(cols, E % cols["ep"] == 0)
    _nonempty(cols, f"{space.given('ep')}: ep must divide the {E} experts; degrees that "
              f"do: {','.join(str(int(d)) for d in ep_auto)}")
    if space.etp is None:  # code 0: etp 1; code 1: etp = tp (the same row where tp = 1)
        cols = _cross(cols, "etp", [0, 1])
        cols = _keep(cols, (cols["etp"] == 0) | (cols["tp"] > 1))
        cols["etp"] = np.where(cols["etp"] == 0, 1, cols["tp"])
    else:
        cols = _cross(cols, "etp", pick("etp", etp_auto))
    grid = cols["tp"] * cols["cp"] * cols["dp"]
    cols = _keep(cols, (f_e % cols["etp"] == 0) & (grid % (cols["ep"] * cols["etp"]) == 0)
                 & (cols["etp"] <= g) & (g % cols["etp"] == 0))
    given = " and ".join(space.given(a) for a in ("ep", "etp")
                     if getattr(space, a) is not None)
    return _nonempty(cols, f"{given or 'ep, etp'}: etp x ep must divide the tp x cp x dp ranks "
                     f"of a pipeline stage and etp the expert FFN width ({f_e}); expert-TP "
                     f"degrees that divide it inside a node: "
                     f"{','.join(str(int(d)) for d in etp_auto)}")


def _with_extras(cols: dict[str, np.ndarray], problem: Problem, space: SearchSpace) -> dict:
    """The axes that are off unless the space opens them: named recompute modules (selective
    rows take that module set), uniform recompute groups (full-recompute rows of every layer
    crossed with the group sizes), activation offload (rows with pp = 1 and no recompute, the
    only ones Megatron-Core's layer offload runs: TransformerConfig refuses it with pipeline
    parallelism or recompute; fewer layers than the model's) and optimizer offload. Offload
    needs the GPU's host link (`GPUSpec.host_link_gb_per_s`)."""
    if space.recompute_modules is not None:
        cols["rm"] = np.where(cols["rc"] == 1, modules_mask(space.recompute_modules), 0)
    if space.recompute_group is not None:
        groups = sorted(set(space.recompute_group))
        cols = _cross(cols, "rn", [-g for g in groups])
        cols = _keep(cols, (cols["rc"] == 2) | (cols["rn"] == -groups[0]))
        cols["rn"] = np.where(cols["rc"] == 2, cols["rn"], ALL_LAYERS)
    cols = _with_block_recompute(cols, problem, space)
    wants = [x for x in (space.offload_layers or []) if x] + [
        x for x in (space.optimizer_offload or []) if x] + ([1] if space.offload_auto else [])
    if wants and problem.cluster.gpu.host_link_gb_per_s is None:
        raise SpecError(f"offload needs the GPU's host link, and GPU `{problem.cluster.gpu.name}`"
                        " gives no `host_link_gb_per_s`; add it to the GPU spec or drop "
                        "--offload-layers/--optimizer-offload")
    L = problem.model.n_layers
    layers = space.offload_layers
    if layers is None and space.offload_auto:
        layers = [x for x in {L // 4, L // 2, 3 * L // 4, L - 1} if x > 0]
    if layers is not None:
        values = sorted(set(layers) | {0})
        cols = _cross(cols, "ao", values)
        ok = (cols["ao"] == 0) | ((cols["pp"] == 1) & (cols["rc"] == 0)
                                  & (cols["ao"] < problem.model.n_layers))
        cols = _keep(cols, ok)
        if not np.any(cols["ao"] > 0) and space.offload_layers and any(space.offload_layers):
            raise SpecError(f"{space.given('offload_layers')}: activation "
                            "offload runs with pp = 1 and recompute none (Megatron-Core), on "
                            f"fewer than the model's {problem.model.n_layers} layers; allow "
                            "--pp 1 and --recompute none")
    if space.optimizer_offload is not None:
        cols = _cross(cols, "oo", sorted({0} | {round(x * 100) for x in space.optimizer_offload}))
    return cols


def cp_forms(problem: Problem, space: SearchSpace) -> list[CpComm]:
    """The context-parallel forms a plan searches: the space's (`--cp-comm`), else the ones the
    job's stack implements (`StackSpec.cp_comm`; none: cp stays 1)."""
    if space.cp_comm is not None:
        return [CpComm(f) for f in space.cp_comm]
    return [CpComm(f) for f in problem.stack.cp_comm]


def _with_group_sizes(base: dict[str, np.ndarray], sizes: list[int]) -> dict[str, np.ndarray]:
    """Each row of `base` once per all-to-all group size u of `sizes` with 1 < u < cp dividing
    its cp, as new column `cu`: the rows of `_cross(base, "cu", sizes)` that keep such a u, in
    the same order, built without the others (a row per divisor of n, most of them dropped)."""
    cps, which = np.unique(base["cp"], return_inverse=True)
    which = which.reshape(-1)
    per_cp = [[u for u in sizes if 1 < u < c and c % u == 0] for c in cps.tolist()]
    grid = np.zeros((len(cps), max(1, max(map(len, per_cp)))), dtype=np.int64)
    for i, us in enumerate(per_cp):
        grid[i, :len(us)] = us
    k = np.array([len(us) for us in per_cp], dtype=np.int64)[which]
    rows = np.repeat(np.arange(len(which)), k)
    at = np.arange(len(rows)) - np.repeat(np.cumsum(k) - k, k)  # position among a row's sizes
    out = {name: v[rows] for name, v in base.items()}
    out["cu"] = grid[which[rows], at]
    return out


def _with_cp_forms(cols: dict[str, np.ndarray], problem: Problem, space: SearchSpace) -> dict:
    """Each cp > 1 row crossed with the context-parallel forms searched (`cp_forms`), the
    hierarchical form once per all-to-all group size u (the space's `cp_a2a`, else every
    divisor of cp with 1 < u < cp); cp = 1 rows keep code 0 (ring: nothing to exchange). A
    stack without context parallelism drops the cp > 1 rows, and a `--cp` asking for them
    anyway is an error naming the stacks and the flag that can."""
    n = len(cols["cp"])
    cols["cc"] = np.zeros(n, dtype=np.int64)
    cols["cu"] = np.ones(n, dtype=np.int64)
    forms = cp_forms(problem, space)
    multi = cols["cp"] > 1
    if not np.any(multi):
        return cols
    if not forms:
        if space.cp is not None and all(c > 1 for c in space.cp):
            raise SpecError(f"{space.given('cp')}: the {problem.stack.name} stack has no "
                            "context parallelism (StackSpec.cp_comm is empty); use another "
                            "--stack (megatron-core, torchtitan, deepspeed) or name the forms "
                            "to cost anyway with --cp-comm")
        return _keep(cols, ~multi)
    single = _keep(cols, ~multi)
    base = _keep(cols, multi)
    parts = [single]
    flat = [f for f in forms if f != CpComm.A2A_RING]
    if flat:
        crossed = _cross(base, "cc", [CP_COMM_CODES[f] for f in flat])
        parts.append(crossed)
    if CpComm.A2A_RING in forms:
        sizes = sorted(set(space.cp_a2a)) if space.cp_a2a else \
            [int(d) for d in divisors(int(base["cp"].max()))]
        hier = _with_group_sizes(base, sizes)
        if space.cp_a2a and not len(hier["cp"]) and len(base["cp"]):
            cps = ",".join(str(int(c)) for c in np.unique(base["cp"]))
            raise SpecError(f"{space.given('cp_a2a')}: no all-to-all group size u "
                            f"with 1 < u < cp divides the cp degrees tried ({cps}), so no "
                            "a2a+ring layout is left; give a u that divides one of them, or "
                            "leave --cp-a2a out")
        hier["cc"] = np.full(len(hier["cp"]), CP_COMM_CODES[CpComm.A2A_RING], dtype=np.int64)
        parts.append(hier)
    elif space.cp_a2a:  # the all-to-all size of a form the space does not try
        raise SpecError(f"{space.given('cp_a2a')} sizes the all-to-all groups of the "
                        f"a2a+ring form, which {_forms_given(problem, space, forms)} "
                        "leaves out; add a2a+ring to --cp-comm or leave --cp-a2a out")
    total = sum(len(p["cp"]) for p in parts)
    if total > MAX_LAYOUTS:
        raise _TooMany(total)
    out = {k: np.concatenate([p[k] for p in parts]) for k in cols}
    if not np.any(out["cp"] > 1) and (space.cp_comm is not None or space.cp_a2a is not None):
        raise SpecError(_forms_given(problem, space, forms)
                        + (f" and {space.given('cp_a2a')}" if space.cp_a2a else "")
                        + ": the hierarchical form a2a+ring needs an all-to-all group size u "
                        "with 1 < u < cp dividing cp (e.g. cp 8 with u 2 or 4); allow such a "
                        "cp (--cp) or another form")
    return out


BLOCK_AUTO = (1, 2, 3)
"""`--recompute-num-layers auto`: N = k/4 of the row's largest model chunk for these k."""


def _with_block_recompute(cols: dict[str, np.ndarray], problem: Problem,
                          space: SearchSpace) -> dict:
    """Rows with full recompute of only the first N layers of each model chunk (`rn` = N;
    Megatron `--recompute-method block`), added beside each full-recompute row when the space
    opens the axis: the given N, or k/4 of the row's largest chunk (`BLOCK_AUTO`), each kept
    where 0 < N < that chunk and not repeated. One vectorised step over the rows."""
    given = sorted({x for x in (space.recompute_layers or []) if x > 0})
    auto = space.recompute_layers_auto and space.recompute_layers is None
    if not given and not auto:  # closed, or only N = 0 (no recompute, searched as none)
        return cols
    if not np.any(cols["rc"] == 2):
        raise SpecError("--recompute-num-layers recomputes the first N layers of each model chunk "
                        "fully, and no candidate has full recompute; allow --recompute full")
    first_group = -min(space.recompute_group) if space.recompute_group else ALL_LAYERS
    base = _keep(cols, (cols["rc"] == 2) & (cols["rn"] == first_group))
    L, pp, vp = problem.model.n_layers, base["pp"], base["vp"]
    mid = np.where(pp > 2, (L - base["lf"] - base["ll"]) // np.maximum(pp - 2, 1), 0)
    per_rank = np.where((base["lf"] > 0) | (base["ll"] > 0),
                        np.maximum(np.maximum(base["lf"], base["ll"]), mid), L // pp)
    chunk = per_rank // vp  # largest model chunk (Megatron applies N to every chunk)
    cand = [np.full(len(chunk), n, dtype=np.int64) for n in given]
    if auto:
        cand += [np.maximum(k * chunk // 4, 1) for k in BLOCK_AUTO]
    cand = np.sort(np.stack(cand, axis=1), axis=1)
    ok = (cand > 0) & (cand < chunk[:, None])
    ok[:, 1:] &= cand[:, 1:] != cand[:, :-1]  # each N once per row
    rows, k = np.nonzero(ok)
    if len(cols["rc"]) + len(rows) > MAX_LAYOUTS:
        raise _TooMany(len(cols["rc"]) + len(rows))
    extra = {name: v[rows] for name, v in base.items()}
    extra["rn"] = cand[rows, k]
    return {name: np.concatenate([v, extra[name]]) for name, v in cols.items()}


def _dominated(cols: dict[str, np.ndarray], codes: list[int], moe: bool) -> np.ndarray:
    """Rows another schedule in the space beats on both memory and time in this cost model, so
    never worth costing: 1F1B with a pipeline when ZB-H1 is open (same micro-batches held,
    bubble (p-1)(F+B-2W) <= (p-1)(F+B)); interleaved with vp = 2 when ZB-V is open (p held
    instead of (3p-1)/2, bubble (p-1)/2 (F+B-3W) <= (p-1)/2 (F+B), no micro-batch multiple);
    DualPipeV for a dense model when ZB-V is open (p held instead of p+1, smaller bubble; its
    all-to-all overlap has nothing to hide). `estimate` still costs any of them."""
    sch, pp, vp = cols["sch"], cols["pp"], cols["vp"]
    out = np.zeros(len(sch), dtype=bool)
    if SCHEDULE_CODES[Schedule.ZB_H1] in codes:
        out |= (sch == SCHEDULE_CODES[Schedule.ONE_F_ONE_B]) & (pp > 1)
    if SCHEDULE_CODES[Schedule.ZBV] in codes:
        out |= (sch == SCHEDULE_CODES[Schedule.INTERLEAVED]) & (vp == 2)
        if not moe:
            out |= sch == SCHEDULE_CODES[Schedule.DUALPIPEV]
    return out


def _pinned_split(space: SearchSpace, L: int, pp: int) -> list[tuple[int, int]] | None:
    """(first, last) pinned by the space for pipeline degree `pp`, or None when not pinned.
    With only one end pinned, the other stages share the rest evenly (Megatron-Core's rule)."""
    if space.stage_layers is not None:
        sl = space.stage_layers
        return [(0, 0)] if len(set(sl)) == 1 else [(sl[0], sl[-1])]
    first, last = space.first_stage_layers, space.last_stage_layers
    if first is None and last is None:
        return None
    if pp == 1:
        return []  # pinned ends ask for a pipeline: no layout without one
    if first is None:
        first = (L - last) // (pp - 1)
    if last is None:
        last = (L - first) // (pp - 1)
    if pp > 2 and first == last == (L - first - last) / (pp - 2):
        return [(0, 0)]
    return [(first, last)]


def _with_splits(cols: dict[str, np.ndarray], problem: Problem, space: SearchSpace) -> dict:
    """Cross each row with the layer splits of its (pp, vp): the even split where pp x vp
    divides the layers, and the balanced uneven ones (`balanced_splits`); one Python step per
    distinct (pp, vp) pair, never per row."""
    L = problem.model.n_layers
    arch = build_arch(problem.model)
    w_last = output_weight(arch, problem.training.seq_len)
    weights = layer_weights(arch, problem.training.seq_len)  # hybrid models: by layer type
    key = cols["pp"] * 1024 + cols["vp"]
    pairs, inverse = np.unique(key, return_inverse=True)
    options: list[list[tuple[int, int]]] = []
    for pair in pairs:
        pp, vp = int(pair // 1024), int(pair % 1024)
        pinned = _pinned_split(space, L, pp)
        if pinned is not None:
            options.append(pinned)
            continue
        even_ok = L % (pp * vp) == 0
        found = balanced_splits(L, pp, vp, w_last, k=1, weights=weights) if space.uneven else []
        opts = ([(0, 0)] if even_ok or (vp == 1 and not found) else []) + found
        options.append(opts)
    counts = np.array([len(o) for o in options], dtype=np.int64)[inverse]
    out = {k: np.repeat(v, counts) for k, v in cols.items()}
    flat = [o for opts in options for o in opts]
    starts = np.concatenate([[0], np.cumsum([len(o) for o in options])])[inverse]
    # position of each output row within its pair's options
    first_row = np.repeat(np.cumsum(counts) - counts, counts)
    within = np.arange(len(out["pp"])) - first_row
    pick = np.repeat(starts, counts) + within
    table = np.asarray(flat, dtype=np.int64).reshape(-1, 2) if flat else np.zeros((0, 2), np.int64)
    out["lf"] = table[pick, 0] if len(pick) else np.zeros(0, np.int64)
    out["ll"] = table[pick, 1] if len(pick) else np.zeros(0, np.int64)
    return out
