"""Feasibility rules as data. Each rule is a small vectorised function that marks the rows it
rejects; `check_rules` ORs their flags into one integer per row, so a rejected layout keeps every
reason. Rules can be switched off by name (e.g. `tp_in_node` via `--allow-tp-across-nodes`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntFlag

import numpy as np

from .cost.arch import Arch
from .cost.context import heads_violated, window_violated
from .layouts import LayoutTable
from .specs.problem import Problem


class Reject(IntFlag):
    """Reasons a layout cannot run (bit flags; several may be set)."""

    WORLD = 1
    HEADS = 2
    LAYERS = 4
    SEQ = 8
    BATCH = 16
    INTERLEAVE = 32
    EXPERTS = 64
    TP_NODE = 128
    EP_NODE = 256
    OOM = 512
    SCHEDULE = 1024
    A2A_OVERLAP = 2048
    MOE_SP = 4096
    LAYER_TYPE = 8192
    CP_HEADS = 16384
    CP_WINDOW = 32768


@dataclass(frozen=True)
class Rule:
    """One feasibility rule."""

    name: str
    flag: Reject
    why: str
    violated: Callable[[Problem, Arch, LayoutTable], np.ndarray]
    default_on: bool = True


def _world(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    return t["dp"] * t["tp"] * t["pp"] * t["cp"] != p.cluster.n_gpus


def _heads(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    tp = t["tp"]
    kv_ok = (a.n_kv_heads % tp == 0) | (tp % a.n_kv_heads == 0)
    return (a.n_heads % tp != 0) | ~kv_ok


def chunk_layers(n_layers: int, t: LayoutTable) -> np.ndarray:
    """Layers of the largest model chunk of each row: its largest stage (the even split, or
    the uneven one's first, middle or last) over vp, rounded up."""
    pp, vp = t["pp"], t["vp"]
    even = -(-n_layers // pp)
    lf, ll = t["lf"], t["ll"]
    mid = np.where(pp > 2, (n_layers - lf - ll) // np.maximum(pp - 2, 1), 0)
    largest = np.where((lf > 0) | (ll > 0), np.maximum(np.maximum(lf, ll), mid), even)
    return -(-largest // vp)


def counts_beyond_layers(n_layers: int, t: LayoutTable) -> tuple[np.ndarray, np.ndarray]:
    """(offload, recompute) per row: more layers offloaded than Megatron-Core allows (`ao`
    must be below the model's layers: TransformerConfig `cpu_offloading_num_layers` in
    [0, num_layers)), or more layers per chunk recomputed by the block method (`rn`) than a
    model chunk holds (`chunk_layers`; N beyond it is all of them, which `rn` -1 says)."""
    offload = t["ao"] >= n_layers
    recompute = (t["rc"] == 2) & (t["rn"] >= 0) & (t["rn"] > chunk_layers(n_layers, t))
    return offload, recompute


def _layers(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    """Even split: pp x vp divides the layers. Uneven (`lf`, `ll` set): first, last and the equal
    middle stages hold whole, positive layer counts that sum to the layers, the middle ones
    divisible by vp (equal model chunks); the ends take any count, which Megatron-Core writes
    with its embedding/loss accounting or a pipeline layout (`splits`). Offloaded and
    block-recomputed layer counts within the layers (`counts_beyond_layers`)."""
    offload, recompute = counts_beyond_layers(a.n_layers, t)
    return split_violated(a, t) | offload | recompute


def split_violated(a: Arch, t: LayoutTable) -> np.ndarray:
    """The split part of `_layers`."""
    L, pp, vp = a.n_layers, t["pp"], t["vp"]
    even_bad = L % (pp * vp) != 0
    lf, ll = t["lf"], t["ll"]
    uneven = (lf > 0) | (ll > 0)
    if not np.any(uneven):
        return even_bad
    rest = L - lf - ll
    n_mid = np.maximum(pp - 2, 1)
    mid = rest // n_mid
    mid_bad = np.where(pp > 2, (rest % n_mid != 0) | (mid < 1) | (mid % vp != 0), rest != 0)
    uneven_bad = (pp < 2) | (lf < 1) | (ll < 1) | mid_bad
    return np.where(uneven, uneven_bad, even_bad)


def _seq(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    s = p.training.seq_len
    cp_bad = (t["cp"] > 1) & (s % (2 * t["cp"]) != 0)
    sp_bad = (t["sp"] == 1) & ((s // t["cp"]) % t["tp"] != 0)
    return cp_bad | sp_bad


def _batch(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    return p.training.global_batch % (t["dp"] * t["mb"]) != 0


def _interleave(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    m = p.training.global_batch // np.maximum(t["dp"] * t["mb"], 1)
    return (t["vp"] > 1) & (t["sch"] <= 1) & ((t["pp"] == 1) | (m % t["pp"] != 0))


def _schedule(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    """Schedule and chunks agree (1F1B, ZB-H1, DualPipe: vp = 1; interleaved: vp > 1; ZB-V,
    DualPipeV: vp = 2; all but 1F1B need pp > 1); DualPipe needs an even pp and an even number
    of micro-batches (half run each way) and DualPipe(V) at least 2 pp micro-batches
    (deepseek-ai/DualPipe dualpipe.py and dualpipev.py `step` asserts: `num_ranks % 2 == 0`,
    `num_chunks % 2 == 0` (DualPipe) and `num_chunks >= num_ranks * 2`)."""
    sch, vp, pp = t["sch"], t["vp"], t["pp"]
    m = p.training.global_batch // np.maximum(t["dp"] * t["mb"], 1)
    need_vp = np.choose(np.clip(sch, 0, 5), [1, 0, 1, 2, 1, 2])  # 0: any vp > 1
    vp_bad = np.where(need_vp == 0, vp == 1, vp != need_vp)
    dual_bad = (sch >= 4) & (m < 2 * pp)
    return (sch < 0) | (sch > 5) | vp_bad | ((sch > 0) & (pp == 1)) | dual_bad | (
        (sch == 4) & ((pp % 2 != 0) | (m % 2 != 0)))


def _experts(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    """EP divides the experts and ETP the expert FFN width (whole experts, whole column shards);
    the expert grid ETP x EP x EDP folds onto each pipeline stage's TP x CP x DP ranks, so
    etp x ep divides tp x cp x dp (Megatron-Core parallel_state.initialize_model_parallel:
    world % (etp x ep x pp) == 0; MoE Parallel Folding, arXiv 2504.14960). Dense models keep
    ep = 1 and etp = tp."""
    ep, etp = t["ep"], t["etp"]
    if not a.n_experts:
        return (ep > 1) | (etp != t["tp"])
    grid = t["tp"] * t["cp"] * t["dp"]
    return (a.n_experts % ep != 0) | (a.expert_ffn % etp != 0) | (grid % (ep * etp) != 0)


def _tp_in_node(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    """TP and expert-TP groups (innermost ranks, stride 1) inside one NVLink domain."""
    g = p.cluster.nvlink_domain
    return (t["tp"] > g) | (g % t["tp"] != 0) | (t["etp"] > g) | (g % t["etp"] != 0)


def _ep_in_node(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    """The expert-TP x EP block (ranks 0 .. etp x ep - 1 of the expert grid) inside one NVLink
    domain (Megatron-Core MoE guide: keep EP x TP communication within NVLink)."""
    g = p.cluster.nvlink_domain
    span = t["etp"] * t["ep"]
    return (span > g) | (g % span != 0)


def _moe_sp(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    """An MoE model with TP trains with sequence parallelism: Megatron-Core's MoELayer raises
    without it ("MoE and tensor parallelism ... without also enabling sequence parallelism",
    moe_layer.py), TorchTitan always shards the sequence with TP; where the stack has no SP
    (StackSpec.sequence_parallel false) the rule does not apply."""
    if not a.n_experts or not p.stack.sequence_parallel:
        return np.zeros(len(t), dtype=bool)
    return (t["tp"] > 1) & (t["sp"] == 0)


def _a2a_overlap(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    """With the EP all-to-all overlap on (`moe_a2a_overlap`), the layouts Megatron-Core's
    TransformerConfig accepts it for: EP > 1, no full recompute, no `moe` among the recomputed
    modules, with a pipeline virtual stages, and at most one MTP layer, which needs a pipeline
    (transformer_config.py asserts: "MTP layernum only supports 1 when enabling
    overlap_moe_expert_parallel_comm", "Pipeline model parallel size must be larger than 1 ...
    with MTP layer")."""
    if not (a.n_experts and p.training.moe_a2a_overlap):
        return np.zeros(len(t), dtype=bool)
    from .specs.layout import MODULE_BITS, RecomputeModule

    moe_rc = (t["rc"] == 1) & ((t["rm"] & MODULE_BITS[RecomputeModule.MOE]) != 0)
    mtp = (a.n_mtp > 1) | ((a.n_mtp == 1) & (t["pp"] == 1))
    return (t["ep"] == 1) | (t["rc"] == 2) | moe_rc | ((t["pp"] > 1) & (t["vp"] == 1)) | mtp


RULES: tuple[Rule, ...] = (
    Rule("world", Reject.WORLD, "dp x tp x pp x cp must equal the GPU count", _world),
    Rule("heads", Reject.HEADS,
         "tp must divide the query heads, and divide or be a multiple of the KV heads", _heads),
    Rule("layers", Reject.LAYERS,
         "layers must divide evenly into pp x vp model chunks, or an uneven split (first, equal "
         "middles, last) must sum to them with the middle stages divisible by vp", _layers),
    Rule("seq", Reject.SEQ,
         "sequence must divide by 2 x cp (load-balanced ring) and its CP share by tp with SP", _seq),
    Rule("batch", Reject.BATCH, "global batch must divide by dp x micro_batch", _batch),
    Rule("interleave", Reject.INTERLEAVE,
         "interleaving (vp > 1) needs pp > 1 and micro-batches per step a multiple of pp",
         _interleave),
    Rule("schedule", Reject.SCHEDULE,
         "the schedule fixes the chunks per rank (1f1b/zb-h1/dualpipe vp = 1, interleaved vp > 1, "
         "zbv/dualpipev vp = 2) and needs pp > 1; dualpipe needs an even pp and micro-batch "
         "count, dualpipe(v) at least 2 x pp micro-batches", _schedule),
    Rule("cp_heads", Reject.CP_HEADS,
         "the all-to-all context-parallel forms (a2a, a2a+ring) split the heads: the query and "
         "KV heads of a TP rank must divide by the all-to-all group (cp for a2a, cp_a2a for "
         "a2a+ring), or the group be a multiple of the KV heads where the stack replicates them",
         heads_violated),
    Rule("cp_window", Reject.CP_WINDOW,
         "sliding-window attention runs with the a2a and allgather context-parallel forms only "
         "(Transformer Engine), not with ring or a2a+ring", window_violated),
    Rule("experts", Reject.EXPERTS,
         "ep must divide the experts, etp the expert FFN width and etp x ep the tp x cp x dp "
         "ranks of a stage (ep = 1, etp = tp for dense models)", _experts),
    Rule("tp_in_node", Reject.TP_NODE,
         "a TP or expert-TP group must sit inside one NVLink domain (--allow-tp-across-nodes "
         "lifts this)", _tp_in_node),
    Rule("ep_in_node", Reject.EP_NODE, "etp x ep must sit inside one NVLink domain (optional)",
         _ep_in_node, default_on=False),
    Rule("moe_sp", Reject.MOE_SP,
         "an MoE model with tp > 1 needs sequence parallelism (Megatron-Core's MoE layer "
         "refuses TP without SP; TorchTitan always shards the sequence with TP)", _moe_sp),
    Rule("a2a_overlap", Reject.A2A_OVERLAP,
         "the EP all-to-all overlap (--moe-a2a-overlap) needs ep > 1, no full recompute and no "
         "recomputed moe module, virtual stages with a pipeline, and at most one MTP layer, with "
         "a pipeline (Megatron-Core checks)",
         _a2a_overlap),
)


def _layer_type(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    from .cost.layer_rules import layer_type_violations  # hybrid models (`cost.layer_types`)

    return layer_type_violations(p, a, t)


RULES = RULES + (Rule("layer_type", Reject.LAYER_TYPE,
                      "the stack must run every layer type of a hybrid model with this layout",
                      _layer_type),)
RULE_BY_NAME = {r.name: r for r in RULES}


def active_rules(disabled: Iterable[str] = (), enabled: Iterable[str] = ()) -> tuple[Rule, ...]:
    """Default rules minus `disabled`, plus optional rules named in `enabled`."""
    disabled, enabled = set(disabled), set(enabled)
    unknown = (disabled | enabled) - set(RULE_BY_NAME)
    if unknown:
        raise ValueError(f"unknown rule(s) {sorted(unknown)}; known: {sorted(RULE_BY_NAME)}")
    return tuple(
        r for r in RULES if (r.default_on or r.name in enabled) and r.name not in disabled
    )


def check_rules(problem: Problem, arch: Arch, t: LayoutTable, rules=None) -> np.ndarray:
    """Reject flags per row (0 = passes every rule). OOM is added later by the memory ledger."""
    flags = np.zeros(len(t), dtype=np.int64)
    for rule in active_rules() if rules is None else rules:
        flags |= np.where(rule.violated(problem, arch, t), int(rule.flag), 0)
    return flags


_OOM = Rule("oom", Reject.OOM, "does not fit in usable GPU memory", lambda p, a, t: None)
_BY_FLAG = {r.flag: r for r in (*RULES, _OOM)}


def reasons(flags: int) -> list[str]:
    """Names of the rules a flag value violates."""
    return [_BY_FLAG[f].name for f in Reject if flags & f]


def explain(flags: int) -> list[str]:
    """'name: why' for every rule a flag value violates."""
    return [f"{_BY_FLAG[f].name}: {_BY_FLAG[f].why}" for f in Reject if flags & f]
