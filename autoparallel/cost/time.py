"""Time ledger: seconds per training step, as named items, for every row of a `LayoutTable`.

Per micro-batch and pipeline stage, one GPU runs each layer's GEMMs, fused attention and
elementwise kernels forward (F) and backward (B = 2F for GEMMs and elementwise, 2.5F for flash
attention, whose backward recomputes the scores; reference §2.4), plus recompute and the exposed
TP / CP / EP communication. The slowest stage paces the pipeline: the bubble is (p-1)/v of its
micro-batch time (Narayanan et al. 2021; reference §4), less with the zero-bubble and DualPipe
schedules, whose weight-gradient passes fill it (`pipeline_bubble`). Data-parallel communication overlaps the
backward of the last micro-batch (ZeRO 0-1), of every micro-batch (ZeRO-2) or each micro-batch's
forward and backward layer by layer (ZeRO-3), minus a last bucket (reference §5.5-5.6).
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from ..layouts import LayoutTable, edp
from ..placement import group, layout_groups
from ..specs.precision import recipe
from ..specs.problem import Problem
from ..units import MS
from .arch import Arch
from .comm import Collective, collective_time
from .compute import attention_time, gemm_time, linear_time, memory_bound_time
from .context import cp_collectives, cp_layer_time
from .distinct_rows import CP_FORM_COLUMNS, STAGE_TIME_COLUMNS, distinct_rows, spread
from .moe_dispatch import dispatch_time
from .moe_layer import exposed_dispatch, hidden_dispatch_nic, moe_ffn
from .network import sizes as tier_sizes
from .memory import layer_activation_bytes, stage_params
from .overlap import hidden_cost as _hidden_cost
from .offload import (activation_offload_time, module_offload_bytes, moe_recomputed,
                      offloaded_layers, optimizer_offload_time, selective_recompute_time)
from .pick import pick
from .stages import micro_batches, stages
from .unfused_paths import unfused_seconds

TIME_ITEMS = (
    "compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble",
    "optimizer", "offload", "host",
)
ADAM_BYTES = 26.0  # per parameter: fp32 master r+w 8, m r+w 8, v r+w 8, bf16 param write 2; + grad read
ADAM_BF16_BYTES = 12.0  # bf16 moments, no master (optimizer_dtype bf16): param r+w 4, m 4, v 4; + grad read
DDP_BUCKET_PARAMS = 4e7  # Megatron DDP bucket, max(4e7, 1e6 * dp * cp) parameters (reference §0)


def _attention_forward(problem: Problem, arch: Arch, t: LayoutTable):
    """(GEMM, core attention, core attention backward) seconds of a layer's attention block, one
    micro-batch, one GPU: QKV (or MLA) and output projections, split by TP, and the fused
    attention kernel forward and backward."""
    s = problem.training.seq_len
    b = t["mb"].astype(np.float64)
    tp, cp = t["tp"].astype(np.float64), t["cp"].astype(np.float64)
    h = arch.hidden
    T = b * s / cp  # tokens through each GEMM (SP all-gathers the TP shards first)
    kv_div = np.minimum(tp, arch.n_kv_heads)
    share = arch.gemm_share  # 1, or the layers' part of a given n_params (`Arch.gemm_share`)
    in_proj = (arch.p_attn_q - arch.p_attn_out) / tp + arch.p_attn_kv / kv_div + arch.p_attn_rep
    gemm = linear_time(problem, T, share * in_proj / h, h)  # QKV (or MLA) projections
    gemm = gemm + linear_time(problem, T, h, share * arch.p_attn_out / h / tp)  # output projection
    # causal core attention: b * s^2 * n_h (d_qk + d_v) forward FLOPs (reference §2.1), split by
    # TP (heads) and CP (load-balanced sequence chunks); sliding-window layers compute a fraction
    window = arch.attn_pair_fraction(problem.training.seq_len)
    attn_flops = b * s * s * arch.attn_score_width * window / (tp * cp)
    exps = b * s * s / 2.0 * arch.n_heads * window / (tp * cp)  # one per causal score
    attn = attention_time(problem, attn_flops, exps)
    attn_bwd = attention_time(problem, attn_flops, exps, backward=True)
    return gemm, attn, attn_bwd


def attention_forward_time(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Forward seconds of a layer's core attention, one micro-batch, one GPU (what each
    context-parallel form's exchanges hide behind: `cost.context.cp_layer_time`)."""
    return _attention_forward(problem, arch, t)[1]


def _dense_mlp_forward(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Forward GEMM seconds of a dense MLP, split by TP."""
    h = arch.hidden
    T = t["mb"].astype(np.float64) * problem.training.seq_len / t["cp"]
    tp = t["tp"].astype(np.float64)
    f = arch.gemm_share * arch.p_mlp / (h * (arch.mlp_up + 1))  # = ffn, or its n_params equivalent
    return linear_time(problem, T, arch.mlp_up * f / tp, h) + linear_time(problem, T, h, f / tp)


def _elementwise(problem: Problem, arch: Arch, t: LayoutTable, moe: bool) -> np.ndarray:
    """Elementwise kernels write and re-read what the layer stores (reference §3.4 accounting);
    the stack's fitted `elementwise_factor` covers how fused its kernels are, so the model-code
    extras (cost.model_code) are memory-only, as is where offloaded tensors are kept."""
    stored = layer_activation_bytes(problem, arch, t, moe, recompute=np.zeros_like(t["rc"]),
                                    low_precision=False, code_extras=False, offload=False)
    return memory_bound_time(problem, 2.0 * problem.profile.elementwise_factor * stored)


def _layer_forward(problem: Problem, arch: Arch, t: LayoutTable, moe: bool):
    """(GEMM, core attention, elementwise) forward seconds of one layer of a kind, one
    micro-batch, one GPU: the attention block plus a dense MLP, or the MoE block
    (`cost.moe_layer.moe_ffn`; router, experts, shared experts, router scores)."""
    gemm, attn, _ = _attention_forward(problem, arch, t)
    code = unfused_seconds(problem, arch, t, moe)[0]
    if not moe:
        return (gemm + _dense_mlp_forward(problem, arch, t), attn,
                _elementwise(problem, arch, t, False) + code)
    ffn = moe_ffn(problem, arch, t, np.zeros(len(t)))
    return gemm + ffn.gemm, attn, _elementwise(problem, arch, t, True) + ffn.elem + code


def tp_pair(problem: Problem, t: LayoutTable, grp, arch: Arch) -> np.ndarray:
    """One block's forward TP communication: an all-reduce (no SP) or an all-gather plus a
    reduce-scatter (SP) of the s*b*h bf16 activation (reference §5.5; seed table). A dense layer
    has two such blocks (attention, MLP); an MoE layer's attention block one, its shared experts
    another (Megatron-Core SharedExpertMLP gathers the SP input and reduce-scatters its output),
    and the expert-TP all-gather / reduce-scatter of the k routed copies is the dispatcher's
    (`cost.moe_dispatch`)."""
    T = t["mb"] * problem.training.seq_len / t["cp"]
    S = 2.0 * T * arch.hidden
    ar = collective_time(problem, Collective.ALL_REDUCE, S, grp)
    ag_rs = collective_time(problem, Collective.ALL_GATHER, S, grp) + collective_time(
        problem, Collective.REDUCE_SCATTER, S, grp)
    return np.where(t["sp"] == 1, ag_rs, ar)


def stage_times(problem: Problem, arch: Arch, t: LayoutTable, groups,
                sts: dict | None = None, cp_terms: bool = True) -> dict[str, dict]:
    """Per-micro-batch seconds of each stage: fwd, bwd, recompute, tp, cp, ep, host. `sts`: the
    stages to cost (default: `stages(arch, ...)`; a hybrid model passes each layer type's).
    `cp_terms` False: the CP form's seconds left at 0 (`_stage_times_by_form` adds them)."""
    if arch.hybrid is not None:  # summed over the layer types (`cost.layer_types.HybridArch`)
        return arch.hybrid.stage_times(problem, arch, t, groups)
    prof = problem.profile
    rc = t["rc"]
    tp, cp = t["tp"].astype(np.float64), t["cp"].astype(np.float64)
    T = t["mb"] * problem.training.seq_len / cp
    pair = tp_pair(problem, t, groups["tp"], arch)
    attn_gemm, attn, attn_bwd = _attention_forward(problem, arch, t)
    zero = np.zeros(len(t))
    # each layer kind: (GEMM, core attention, elementwise, overlappable TP communication) forward,
    # and the core attention's backward
    # TP pairs: one per residual block (`Arch.blocks`: 2 in a transformer layer, 1 in a hybrid
    # model's single-block layer, whose MoE layer has no attention block)
    # and the unfused code paths' forward and backward seconds (`cost.unfused_paths`)
    kinds = {"dense": (attn_gemm + _dense_mlp_forward(problem, arch, t), attn,
                       _elementwise(problem, arch, t, False), arch.blocks * pair, attn_bwd,
                       *unfused_seconds(problem, arch, t, False))}
    if arch.n_moe_layers:  # the MoE feed-forward block (`cost.moe_layer`, `cost.moe_dispatch`)
        ffn = moe_ffn(problem, arch, t, pair)
        kinds["moe"] = (attn_gemm + ffn.gemm, attn, _elementwise(problem, arch, t, True) + ffn.elem,
                        (arch.blocks - 1.0) * pair + ffn.tp, attn_bwd,
                        *unfused_seconds(problem, arch, t, True))
        dispatch = dispatch_time(problem, arch, t, groups)
    else:
        kinds["moe"] = kinds["dense"]
    overlapped = problem.training.tp_comm_overlap

    def tp_layer(tp_fwd, gemm_f, full):
        """TP seconds per layer and micro-batch: forward, backward, recomputed forward (`full`:
        share of layers fully recomputed). Exposed in full, or, with TP overlap, hidden behind
        the layer's GEMMs (forward 1x, backward 2x)."""
        if not overlapped:
            return tp_fwd * (2.0 + full)
        f = _hidden_cost(prof, tp_fwd, gemm_f)
        return f * (1.0 + full) + _hidden_cost(prof, tp_fwd, 2.0 * gemm_f)

    # once for every stage and layer kind
    cp_coll = cp_collectives(problem, arch, t) if cp_terms else None

    def cp_layer(attn_f, full):
        # the layout's context-parallel form: ring hops hidden behind blocks of attention,
        # Ulysses all-to-alls, the K, V all-gather or both levels of the hierarchy
        # (`cost.context`; reference §5.6)
        return cp_layer_time(problem, t, cp_coll, attn_f, full) if cp_terms else 0.0

    # output layer + vocab-parallel cross-entropy on the last stage
    V = arch.vocab
    # cross-entropy kernels write and re-read the bf16 logits (2 bytes) and their fp32 copy
    # (4 bytes, reference §1.3): 2 x (2 + 4) bytes per logit, the layers' elementwise rule
    ce_bytes = 2.0 * (2.0 + 4.0) * T * V / tp
    logits_gemm = gemm_time(problem, T, V / tp, arch.hidden)
    logits_f = logits_gemm + memory_bound_time(problem, ce_bytes)
    # multi-token prediction (last stage): per module one more output-head pass and its
    # 2h -> h projection of [norm(h_i), norm(emb(t_i+k))] (DeepSeek-V3 report §2.2)
    mtp_f = logits_f + linear_time(problem, T, arch.hidden / tp, 2.0 * arch.hidden) if arch.n_mtp else 0.0

    named = bool(np.any(t["rm"] > 0))
    sel = {k: np.where(rc == 1, kinds[k][1], 0.0) for k in kinds}
    moe_again = 0.0
    if named:  # named modules (`cost.offload`)
        sel = {"dense": selective_recompute_time(problem, arch, t, False, kinds["dense"][1]),
               "moe": selective_recompute_time(problem, arch, t, True, kinds["moe"][1])}
        moe_again = moe_recomputed(t)
    offload = bool(np.any(t["ao"] > 0))
    if offload:  # bytes each offloaded layer moves per micro-batch (`cost.offload`)
        factor = problem.stack.activation_factor
        moved = {"dense": factor * layer_activation_bytes(problem, arch, t, moe=False),
                 "moe": factor * layer_activation_bytes(problem, arch, t, moe=True)}

    # fine-grained activation offload: each MoE layer's offloaded module inputs (`cost.offload`)
    mod_moved = problem.stack.activation_factor * module_offload_bytes(problem, arch, t) \
        if problem.training.offload_modules != "none" and arch.n_moe_layers else None

    out = {}
    for name, st in (sts or stages(arch, t, problem.training.global_batch)).items():
        parts = {}
        if offload:
            n_off = dict(zip(("dense", "moe"), offloaded_layers(t, st.n_dense, st.n_moe)))
        for kind, n in (("dense", st.n_dense), ("moe", st.n_moe)):
            gemm, attn_k, elem, tp_fwd, attn_b, code_f, code_b = kinds[kind]
            fwd = gemm + attn_k + elem + code_f
            bwd = 2.0 * gemm + attn_b + 2.0 * elem + code_b
            parts[kind] = dict(
                fwd=n * fwd,
                bwd=n * bwd,
                rec=n * np.where(rc == 2, st.recomputed * fwd, sel[kind]),
                off=activation_offload_time(problem, moved[kind], fwd, bwd, n_off[kind])
                if offload else 0.0,
                cp=n * cp_layer(attn_k, st.recomputed),
                tp=n * tp_layer(tp_fwd, gemm, st.recomputed),
                # weight-gradient GEMMs: half the GEMM backward (one of its two GEMMs, = forward)
                wgrad=n * gemm,
            )
            if kind == "moe" and mod_moved is not None:
                parts[kind]["off"] = parts[kind]["off"] + activation_offload_time(
                    problem, mod_moved, fwd, bwd, n)
        ep, host, nic_fwd, nic_bwd = zero, zero, zero, zero
        if arch.n_moe_layers:
            again = st.recomputed + moe_again
            layer_fwd = kinds["moe"][0] + attn
            ep_exposed, etp_exposed = exposed_dispatch(problem, arch, t, dispatch, ffn,
                                                       layer_fwd, again)
            ep = st.n_moe * ep_exposed
            # NIC time of the hidden dispatches, which the DP reduction cannot use (`_dp_by_zero`)
            nic_f, nic_b = hidden_dispatch_nic(problem, arch, t, dispatch, ffn, layer_fwd, again)
            nic_fwd, nic_bwd = st.n_moe * nic_f, st.n_moe * nic_b
            parts["moe"]["tp"] = parts["moe"]["tp"] + st.n_moe * etp_exposed
            host = st.n_moe * ffn.host
        heads = st.output * logits_f + st.mtp * mtp_f
        out[name] = dict(
            fwd=parts["dense"]["fwd"] + parts["moe"]["fwd"] + heads,
            bwd=parts["dense"]["bwd"] + parts["moe"]["bwd"] + 2.0 * heads,
            rec=parts["dense"]["rec"] + parts["moe"]["rec"],
            tp=parts["dense"]["tp"] + parts["moe"]["tp"],
            cp=parts["dense"]["cp"] + parts["moe"]["cp"],
            ep=ep,
            host=host,
            off=parts["dense"]["off"] + parts["moe"]["off"],
            wgrad=parts["dense"]["wgrad"] + parts["moe"]["wgrad"]
            + (st.output + st.mtp) * logits_gemm,
            nic_fwd=nic_fwd,
            nic_bwd=nic_bwd,
            stage=st,
        )
    return out


STAGE_BASE_COLUMNS = tuple(c for c in STAGE_TIME_COLUMNS if c not in CP_FORM_COLUMNS)
"""The columns the stage times read but for the CP form: only its seconds (`cp`) read the form
(`cost.context.cp_layer_time`); tests/test_distinct_rows.py checks it."""


def _stage_times_by_form(problem: Problem, arch: Arch, t: LayoutTable, groups) -> dict[str, dict]:
    """`stage_times(problem, arch, t, groups)`, number for number, with all but the CP form's
    seconds costed once per row distinct on `STAGE_BASE_COLUMNS`: a plan crosses every cp > 1
    row with the forms and all-to-all group sizes it searches, and only `cp` reads them, so the
    form's seconds alone are costed per row (n_dense x + n_moe x one layer's, as `stage_times`
    sums them; the core attention they hide behind is the same for both kinds)."""
    found = None
    if arch.hybrid is None and np.any(t["cp"] > 1):
        found = distinct_rows(t, STAGE_BASE_COLUMNS)
    if found is None:
        return stage_times(problem, arch, t, groups)
    first, inverse = found
    base = t.take(first)
    per_base = stage_times(problem, arch, base, layout_groups(base, tier_sizes(problem)),
                           cp_terms=False)
    coll = cp_collectives(problem, arch, t)
    attn = spread(attention_forward_time(problem, arch, base), inverse)
    out = {}
    for name, v in per_base.items():
        st = v["stage"]
        st = replace(st, **{f.name: spread(getattr(st, f.name), inverse) for f in fields(st)
                            if f.name not in ("name", "counts")})
        layer = cp_layer_time(problem, t, coll, attn, st.recomputed)
        items = {k: spread(x, inverse) for k, x in v.items() if k not in ("cp", "stage")}
        items["cp"] = st.n_dense * layer + st.n_moe * layer
        items["stage"] = st
        out[name] = items
    return out


def pipeline_bubble(t: LayoutTable, tau, fwd, wgrad) -> np.ndarray:
    """Idle seconds per step of the pacing stage, by schedule (reference §4), with tau the
    pacing stage's time per micro-batch (F + B, B the full backward), F its forward and W its
    weight-gradient part:

    - 1F1B and interleaved: (p - 1)/v * tau (Narayanan et al. 2021);
    - ZB-H1: (p - 1)(F + B - 2W) (Qi et al. 2023 §3.1; DeepSeek-V3 report Table 2 "ZB1P");
    - ZB-V: (p - 1)/2 * max(F, F + B - 3W) [derived: two chunks of half the stage each; the rank
      at the V's bottom cannot start before p - 1 chunk forwards, (p - 1) F/2, so the schedule is
      not bubble-free even at the sail-sg README's F = B_input = W point; a discrete-event
      simulation in tests/test_pipeline.py reaches that bound and never beats it];
    - DualPipe: (p/2 - 1)(F&B + B - 3W) with F&B = F + B (the overlap hides communication, not
      compute) (DeepSeek-V3 report Table 2);
    - DualPipeV: DualPipe over 2p half-stage chunks on p ranks, (p - 1)/2 * (F&B + B - 3W)
      (deepseek-ai/DualPipe README table: (PP/2 - 1)(F&B + B - 3W) on PP/2 devices, PP = 2p chunk
      times of half the rank's). Replaying the repository's DualPipe(V) step order in a
      discrete-event simulation (tests/test_pipeline.py) idles at most this, exactly this when
      F = B.
    """
    pp, vp, sch = t["pp"].astype(np.float64), t["vp"].astype(np.float64), t["sch"]
    classic = (pp - 1.0) / vp * tau
    if not np.any(sch >= 2):
        return classic
    bwd = tau - fwd
    zb_h1 = (pp - 1.0) * np.maximum(0.0, tau - 2.0 * wgrad)
    zbv = (pp - 1.0) / 2.0 * np.maximum(fwd, tau - 3.0 * wgrad)
    dual_unit = np.maximum(0.0, tau + bwd - 3.0 * wgrad)
    dualpipe = np.maximum(pp / 2.0 - 1.0, 0.0) * dual_unit
    dualpipev = (pp - 1.0) / 2.0 * dual_unit
    return np.select([sch == 2, sch == 3, sch == 4, sch == 5],
                     [zb_h1, zbv, dualpipe, dualpipev], classic)


DP_SYNC_COLUMNS = ("tp", "pp", "vp", "lf", "ll", "sch", "ep", "etp", "dp", "cp")
"""Columns the gradient-sync collectives read: the parameters a stage holds (`stage_params`:
degrees, split, schedule) and the DP x CP and expert-DP groups (`placement.layout_groups`);
tests/test_distinct_rows.py checks it."""


def dp_sync_collectives(problem: Problem, t: LayoutTable, groups, dense, expert) -> list[dict]:
    """Per gradient group holding parameters (dense ones over DP x CP, experts over EDP): the
    seconds of its all-reduce, reduce-scatter and all-gather of the whole gradient / parameters,
    of the last bucket's all-reduce and reduce-scatter, and whether the group leaves the
    scale-up domain (it then shares the NICs with the EP all-to-alls)."""
    gb = float(problem.training.grad_reduce_bytes)
    # parameters are all-gathered in bf16 (ZeRO-1's after the step, ZeRO-3's per use), or in the
    # recipe's format with `fp8_param_gather` (Megatron --fp8-param-gather, TorchTitan
    # enable_fsdp_float8_all_gather)
    rec = recipe(problem.training.precision)
    pb = rec.element_bytes if rec.low and problem.training.fp8_param_gather else 2.0
    out = []
    for psi, grp in ((dense, groups["dpcp"]), (expert, groups["edp"])):
        if not np.any(psi > 0):  # a group with nothing to reduce (a dense model's experts)
            continue
        bucket = np.minimum(psi, np.maximum(DDP_BUCKET_PARAMS, 1e6 * grp.size))
        # the last bucket cannot hide: all-reduced without a distributed optimizer (Megatron
        # DDP `start_grad_sync`: all_reduce per bucket), reduce-scattered with one
        out.append(dict(
            psi=psi, shared=grp.units(0) > 1,
            ar=collective_time(problem, Collective.ALL_REDUCE, gb * psi, grp),
            rs=collective_time(problem, Collective.REDUCE_SCATTER, gb * psi, grp),
            ag=collective_time(problem, Collective.ALL_GATHER, pb * psi, grp),
            tail_ar=collective_time(problem, Collective.ALL_REDUCE, gb * bucket, grp),
            tail=collective_time(problem, Collective.REDUCE_SCATTER, gb * bucket, grp)))
    return out


def _distinct_dp_sync(problem: Problem, arch: Arch, t: LayoutTable, groups,
                      names) -> dict[str, tuple]:
    """Per stage kind in `names`: the (dense, expert) parameters a GPU of it holds
    (`stage_params`) and its `dp_sync_collectives`, computed once per group of rows equal on
    `DP_SYNC_COLUMNS` (a plan's rows repeat them over micro-batch, SP, CP form, ZeRO and
    recompute) and copied to the group's rows."""
    found = distinct_rows(t, DP_SYNC_COLUMNS)
    if found is None:
        sub, sub_groups, inverse = t, groups, None
    else:
        first, inverse = found
        sub = t.take(first)
        sub_groups = layout_groups(sub, tier_sizes(problem))
    sts = stages(arch, sub, problem.training.global_batch)
    out = {}
    for name in names:
        dense, expert = stage_params(arch, sub, sts[name])
        colls = dp_sync_collectives(problem, sub, sub_groups, dense, expert)
        if inverse is not None:
            dense, expert = (np.broadcast_to(x, len(sub))[inverse] for x in (dense, expert))
            colls = [{k: v[inverse] for k, v in c.items()} for c in colls]
        out[name] = (dense, expert, colls)
    return out


def _dp_by_zero(problem: Problem, colls: list[dict], fwd, bwd, m, nic_fwd=0.0,
               nic_bwd=0.0) -> list[np.ndarray]:
    """Exposed data-parallel communication seconds per step for one stage (reference §5.5-5.6),
    plus the compute slowdown of the hidden part, from the stage's `dp_sync_collectives`: one
    array per ZeRO stage 0..3 (the time ledger picks each row's). Concurrent collectives on the
    same links share them (reference §5.6): where the DP group and the EP all-to-alls both leave
    the scale-up domain, the DP traffic hides only in the NIC time the all-to-alls of that
    forward (`nic_fwd`) or backward (`nic_bwd`) leave free."""
    prof = problem.profile
    ov = prof.dp_overlap
    totals = [np.zeros(np.shape(fwd)) for _ in range(4)]
    for c in colls:
        psi, shared = c["psi"], c["shared"]
        ar, rs, ag, tail_ar, tail = c["ar"], c["rs"], c["ag"], c["tail_ar"], c["tail"]
        hide = lambda comm, window: _hidden_cost(prof, comm, ov * window)  # noqa: E731
        f_win = np.where(shared, np.maximum(fwd - nic_fwd, 0.0), fwd)
        b_win = np.where(shared, np.maximum(bwd - nic_bwd, 0.0), bwd)
        rs_b, ag_f, rs_tail = hide(rs, b_win), hide(ag, f_win), np.where(rs > 0, tail, 0.0)
        z0 = hide(ar, b_win) + np.where(ar > 0, tail_ar, 0.0)
        z1 = rs_b + ag_f + rs_tail
        z2 = m * rs_b + ag_f + rs_tail
        z3 = m * (ag_f + hide(ag + rs, b_win))
        # a group with nothing to reduce (a dense model's experts) launches no collective
        totals = [tot + np.where(psi > 0, z, 0.0) for tot, z in zip(totals, (z0, z1, z2, z3))]
    return totals


def tied_embedding_allreduce(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Exposed seconds per step of keeping tied embeddings in sync when pp > 1: after the
    data-parallel gradient sync, the first stage (input embedding) and the last (output layer)
    all-reduce the shared weight's gradient, their V/t x h vocabulary shard in the gradient
    buffer's dtype, over the 2-rank embedding group, before the optimizer step (Megatron-Core
    `finalize_model_grads` -> `_allreduce_word_embedding_grads`: `torch.distributed.all_reduce(
    main_grad, group=embd_group)`, not overlapped; DeepSpeed's `_exec_reduce_tied_grads` alike).
    The two ranks are (pp - 1) x tp x cp x dp apart (placement order tp-cp-dp-pp)."""
    tp, cp, dp, pp = (t[k].astype(np.float64) for k in ("tp", "cp", "dp", "pp"))
    nbytes = float(problem.training.grad_bytes) * arch.p_embed / tp
    pair = group(np.where(pp > 1, 2.0, 1.0), tp * cp * dp * np.maximum(pp - 1.0, 1.0),
                 tier_sizes(problem))
    return np.where(pp > 1, collective_time(problem, Collective.ALL_REDUCE, nbytes, pair), 0.0)


def time_ledger(problem: Problem, arch: Arch, t: LayoutTable) -> dict[str, np.ndarray]:
    """Time items (seconds per step) of the pacing stage, plus `step`, `stage` and `m`.

    Everything but the gradient sync and the optimizer step is the same for rows that differ
    only in the ZeRO stage and the optimizer offload (`cost.distinct_rows`; the enumerator
    crosses every other axis with zero in 0..3), so it is costed once per distinct row, the
    gradient sync for each ZeRO stage there (`_dp_by_zero`), and each row then takes its own:
    the same numbers, in the same order of operations, as costing every row."""
    found = distinct_rows(t)  # rows equal but for ZeRO and optimizer offload
    if found is None:
        sub, inverse = t, np.arange(len(t))
    else:
        first, inverse = found
        sub = t.take(first)
    groups = layout_groups(sub, tier_sizes(problem))
    m = micro_batches(problem.training.global_batch, sub).astype(np.float64)
    pp, vp = sub["pp"].astype(np.float64), sub["vp"].astype(np.float64)
    tp, sp = sub["tp"].astype(np.float64), sub["sp"] == 1
    per_stage = _stage_times_by_form(problem, arch, sub, groups)
    tau = {k: v["fwd"] + v["bwd"] + v["rec"] + v["tp"] + v["cp"] + v["ep"] + v["off"] + v["host"]
           for k, v in per_stage.items()}
    tau_all = np.stack(list(tau.values()))
    tau_max = np.max(tau_all, axis=0)

    zero = t["zero"]
    sharded = zero >= 1
    d = (sub["dp"] * sub["cp"]).astype(np.float64)
    d_e = edp(sub)
    gb = float(problem.training.grad_bytes)
    # bf16 moments with no master copy step the bf16 weights in place (`optimizer_dtype`)
    adam = ADAM_BF16_BYTES if problem.training.optimizer_dtype == "bf16" else ADAM_BYTES
    offloaded = bool(np.any(t["oo"] > 0))
    share = t["oo"] / 100.0
    sync = _distinct_dp_sync(problem, arch, sub, groups, per_stage)
    base, opt_z, rest, busy = [], [], [], []
    for name, v in per_stage.items():
        dense, expert, colls = sync[name]
        items = dict(compute=m * (v["fwd"] + v["bwd"]), recompute=m * v["rec"],
                     tp_comm=m * v["tp"], cp_comm=m * v["cp"], ep_comm=m * v["ep"])
        # the optimizer steps the ZeRO shard (zero >= 1) or the whole stage (zero 0)
        shard = np.stack([dense / 1.0 + expert / 1.0, dense / d + expert / d_e])
        opt = memory_bound_time(problem, shard * (adam + gb))[sharded.astype(np.intp), inverse]
        off = (m * v["off"])[inverse]
        if offloaded:  # optimizer offload: the host steps that share (`cost.offload`)
            opt = opt * (1.0 - share)
            off = off + optimizer_offload_time(problem, shard[sharded.astype(np.intp), inverse],
                                               share)
        opt = opt + problem.profile.step_overhead_ms * MS
        dp = np.stack(_dp_by_zero(problem, colls, v["fwd"], v["bwd"], m, v["nic_fwd"],
                                  v["nic_bwd"]))[zero, inverse]  # each row's ZeRO stage
        host = (m * v["host"])[inverse]
        first_five = sum(items.values())  # summed as every row was: compute, ..., ep_comm first
        busy.append(first_five[inverse] + dp + opt + off + host)
        base.append(items)
        opt_z.append(opt)
        rest.append((dp, off, host))
    busy = np.stack(busy)
    pace = np.argmax(busy, axis=0)
    out = {k: np.stack([it[k] for it in base])[pace, inverse] for k in base[0]}
    out["dp_comm"] = pick(pace, [r[0] for r in rest])
    out["optimizer"] = pick(pace, opt_z)
    out["offload"] = pick(pace, [r[1] for r in rest])
    out["host"] = pick(pace, [r[2] for r in rest])

    S_pp = 2.0 * sub["mb"] * problem.training.seq_len / sub["cp"] * arch.hidden / np.where(sp, tp, 1.0)
    p2p = collective_time(problem, Collective.P2P, S_pp, groups["pp"])
    # fill and drain cross every chunk boundary once each way; steady-state sends overlap
    pp_comm = np.where(pp > 1, 2.0 * (pp * vp - 1.0) * p2p, 0.0)
    if arch.tied:
        pp_comm = pp_comm + tied_embedding_allreduce(problem, arch, sub)
    if np.any(sub["sch"] >= 2):
        slowest = np.argmax(tau_all, axis=0)
        fwd = pick(slowest, [v["fwd"] for v in per_stage.values()])
        wgrad = pick(slowest, [v["wgrad"] for v in per_stage.values()])
        bubble = pipeline_bubble(sub, tau_max, fwd, wgrad)
    else:
        bubble = (pp - 1.0) / vp * tau_max  # (p-1)/(v m) of m micro-batches (reference §4)
    out["pp_comm"], out["bubble"] = pp_comm[inverse], bubble[inverse]
    ordered = {k: out[k] for k in TIME_ITEMS}
    ordered["step"] = sum(ordered.values())
    ordered["stage"] = pace
    ordered["m"] = m[inverse]
    return ordered
