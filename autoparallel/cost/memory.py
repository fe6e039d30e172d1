"""Memory ledger: bytes per GPU on the most-loaded pipeline stage, as named items.

Model states follow the seed and ZeRO (Rajbhandari et al., arXiv 1910.02054, Sec. 5):
16 bytes/parameter (bf16 param 2 + grad 2 + fp32 master/m/v 12), 18 with fp32 grads (Megatron,
reference §1.2); ZeRO-1 shards the 12, ZeRO-2 also the grads, ZeRO-3 also the params, over the
data-parallel group DP x CP (Megatron's distributed optimizer shards over DP x CP, reference §1.2
caveat i); expert parameters shard over ETP x EP and their states over the expert-data-parallel
group EDP = TP x CP x DP / (ETP x EP) (MoE Parallel Folding, arXiv 2504.14960).
Activations follow Korthikanti et al. (arXiv 2205.05198) generalised in reference §3.4.
"""

from __future__ import annotations

import numpy as np

from ..layouts import COLUMNS, LayoutTable, edp
from ..specs.precision import recipe
from ..specs.problem import Problem
from ..units import GiB
from .arch import Arch
from .context import cp_buffer_bytes
from .model_code import model_code
from .device_memory import outside_allocator_bytes, reserved_bytes, workspace_bytes
from .distinct_rows import CP_FORM_COLUMNS, distinct_rows, spread
from .moe_memory import dispatch_buffer_bytes, routed_activation_bytes
from .offload import (keeps_scores, module_offload_bytes, module_offload_in_transfer,
                      offloaded_layers, selective_saved, uniform_groups)
from .pick import pick
from .stages import STAGES, Stage, micro_batches, stages

MEMORY_ITEMS = ("params", "grads", "optimizer", "activations", "embedding_logits", "overhead")


def stage_params(arch: Arch, t: LayoutTable, st: Stage) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameters held by one GPU of the stage after TP, PP and EP sharding."""
    if arch.hybrid is not None:  # summed over the layer types (`cost.layer_types.HybridArch`)
        return arch.hybrid.stage_params(arch, t, st)
    tp = t["tp"].astype(np.float64)
    kv_div = np.minimum(tp, arch.n_kv_heads)  # KV heads replicate once tp > n_kv (reference §3.4)
    layers = st.n_dense + st.n_moe
    sharded = st.n_dense * (arch.p_attn_q + arch.p_mlp) + st.n_moe * (arch.p_attn_q + arch.p_shared)
    dense = (
        sharded / tp
        + layers * arch.p_attn_kv / kv_div
        + layers * (arch.p_attn_rep + arch.p_norm)
        + st.n_moe * arch.p_router
        + st.embed * arch.p_embed / tp
        # untied output layer on the last stage; tied weights need a copy there when pp > 1
        + st.output * np.where((t["pp"] > 1) & (arch.p_output == 0), arch.p_embed, arch.p_output) / tp
        + st.output * arch.p_final_norm
        # multi-token prediction: each module's 2h -> h projection (TP-sharded) and two norms
        + st.mtp * (2.0 * arch.hidden * arch.hidden / tp + 2.0 * arch.hidden)
    )
    # routed experts: EP splits the experts, expert-TP (`etp`, Megatron's default tp) each one
    expert = st.n_moe * arch.p_routed / (t["ep"] * t["etp"])
    # DualPipe keeps a second copy of the rank's stages (DeepSeek-V3 report Table 2: 2x parameters)
    return dense * st.copies, expert * st.copies


def layer_activation_bytes(problem: Problem, arch: Arch, t: LayoutTable, moe: bool,
                           recompute: np.ndarray | None = None,
                           low_precision: bool = True, code_extras: bool = True,
                           offload: bool = True) -> np.ndarray:
    """Activation bytes one GPU stores for one layer and one micro-batch (`offload` False: also
    what the job's offloaded modules move to the host, `cost.offload.module_offload_bytes`).

    No recompute: sbh[8 + 2 delta + 4q/h + 4kv/h + c_f f/h] (reference §3.4; = 34 sbh for a GPT
    layer); without SP the LN/QKV/FC1 inputs and masks stay whole on every TP rank, i.e.
    sbh(10 + 24/t) for GPT (Korthikanti Table 2); with SP all of it divides by t. Model code that
    keeps more than the fused kernels (fp32 norms, pre-RoPE copies, an unfused gated MLP) adds its
    terms (`cost.model_code`; `code_extras` False: the fused accounting only). Eager attention
    adds the scores 5as^2b (dropout) or 2as^2b. Selective recompute: the stack's policy,
    Megatron's core attention (drops the scores; named modules `t["rm"]` drop what
    `cost.offload.module_saved_bytes` lists) or TorchTitan's op-level policy (`op_sac_bytes`).
    Full recompute keeps the layer input, 2sbh (/t with SP). CP divides the sequence.
    Low precision (`low_precision` and a stack that saves quantised inputs, e.g. Transformer
    Engine): the inputs of the linear layers are kept in the recipe's element size instead of
    2 bytes: QKV and FC1 inputs 2h + 2h (replicated without SP), output-projection input 2 n_h d_v
    and FC2 input 2f per token (TP-sharded); for MoE layers the shared experts' FC2 inputs. The
    routed experts' tensors are per rank, with expert TP and the routing's imbalance
    (`cost.moe_memory.routed_activation_bytes`).
    """
    s, b = problem.training.seq_len, t["mb"].astype(np.float64)
    tp, cp = t["tp"].astype(np.float64), t["cp"].astype(np.float64)
    sp = t["sp"] == 1
    rc = t["rc"] if recompute is None else recompute
    tokens = b * s / cp
    rep_div = np.where(sp, tp, 1.0)
    kv_div = np.minimum(tp, arch.n_kv_heads)
    code = model_code(problem.training.model_code if code_extras else "fused",
                      compiled=problem.training.torch_compile)
    q_w = arch.n_heads * arch.qk_head_dim
    k_w = arch.n_kv_heads * arch.qk_head_dim
    gated = arch.mlp_up == 2
    glu_f = (arch.top_k * arch.expert_ffn + arch.shared_ffn) if moe else arch.ffn
    rep = arch.act_attn_rep + (arch.act_moe_rep if moe else arch.act_mlp_rep) \
        + 2.0 * code.norm_extra_h * arch.hidden
    shard = arch.act_attn_qo + (arch.act_moe_shard if moe else arch.act_mlp_shard) \
        + code.rope_extra * q_w + (code.glu_extra_f * glu_f if gated else 0.0)
    kv = arch.act_attn_kv + code.rope_extra * k_w
    stored = tokens * (rep / rep_div + shard / tp + kv / kv_div)
    if code.kv_expand:  # K and V saved at every query head of the rank (`cost.model_code`)
        stored = stored + tokens * code.kv_expand * np.maximum(q_w / tp - k_w / kv_div, 0.0)
    rec = recipe(problem.training.precision)
    quantised = low_precision and rec.low and problem.stack.low_precision_activations
    if moe:  # the routed experts' tensors, per rank (`cost.moe_memory`: expert TP, imbalance)
        stored = stored + routed_activation_bytes(problem, arch, t, low_precision=quantised)
    if quantised:
        h = arch.hidden
        lin_rep = 2.0 * arch.blocks * h  # QKV and FC1 inputs (one of them per hybrid block)
        if moe:  # attention output projection, shared experts' FC2 inputs
            lin_shard = 2.0 * arch.p_attn_out / h + 2.0 * arch.shared_ffn
        else:
            lin_shard = 2.0 * arch.p_attn_out / h + 2.0 * arch.p_mlp / (h * (arch.mlp_up + 1))
        saved = (1.0 - rec.element_bytes / 2.0) * tokens * (lin_rep / rep_div + lin_shard / tp)
        stored = stored - saved
    if problem.training.attention == "eager":
        score_coef = 5.0 if arch.dropout else 2.0  # softmax out 2 + mask 1 + dropout out 2 (ref §3.1)
        scores = score_coef * b * (arch.n_heads / tp) * (s / cp) * s
        stored = stored + np.where(keeps_scores(t, rc), scores, 0.0)
    if np.any(t["rm"] > 0):  # named modules besides core attention (`cost.offload`)
        stored = stored - np.where(rc == 1, selective_saved(problem, arch, t, moe, False), 0.0)
    if offload and moe and problem.training.offload_modules != "none":
        # fine-grained activation offload: the named modules' inputs live on the host
        # (`cost.offload.module_offload_bytes`)
        stored = stored - module_offload_bytes(problem, arch, t, rc)
    full = 2.0 * tokens * arch.hidden / rep_div
    if problem.stack.selective_policy == "op_sac":
        stored = np.where(rc == 1, op_sac_bytes(arch, t, tokens, moe, problem), stored)
    return np.where(rc == 2, full, stored)


def op_sac_bytes(arch: Arch, t: LayoutTable, tokens: np.ndarray, moe: bool,
                 problem: Problem) -> np.ndarray:
    """Bytes one layer keeps under TorchTitan's op-level selective activation checkpointing.

    The policy (pytorch/torchtitan `_apply_ac_to_transformer_block`, 2025; the `SelectiveAC`
    op list since) saves the outputs of matmuls, attention kernels and reduce-scatters but
    recomputes every second matmul of the block, and the checkpoint keeps the block input. A
    Llama block runs its matmuls in the order wq, wk, wv, wo, w1, w3, w2, so wq, wv, w1 and w2 are
    saved: 2q + 2v + 2f + 2h per token, plus the attention output 2q and its fp32 log-sum-exp
    (4 bytes per head), plus the block input 2h. Low-precision linears (torchao Float8Linear) go
    through `aten.mm` on a tensor subclass, so the count is the same and the outputs stay BF16.
    For MoE layers the routed experts' first GEMM and output are counted per routed copy
    (k (2 f_e + 2h)) in place of w1 and w2."""
    tp = t["tp"].astype(np.float64)
    rep_div = np.where(t["sp"] == 1, tp, 1.0)
    kv_div = np.minimum(tp, arch.n_kv_heads)
    q_w = arch.n_heads * arch.qk_head_dim
    v_w = arch.n_kv_heads * arch.v_head_dim
    h = arch.hidden
    mlp = arch.top_k * (2.0 * arch.expert_ffn + 2.0 * h) + 2.0 * arch.shared_ffn if moe \
        else 2.0 * arch.ffn + 2.0 * h
    # block input; wq output + attention output (2q each) + LSE; the MLP's; wv output
    return tokens * (2.0 * h / rep_div + (4.0 * q_w + 4.0 * arch.n_heads + mlp) / tp
                     + 2.0 * v_w / kv_div)


def layer_activations(problem: Problem, arch: Arch, t: LayoutTable) -> dict[str, np.ndarray]:
    """Per-layer activation bytes of one micro-batch, the same on every stage
    (`layer_activation_bytes`): `dense` and `moe` layers under the row's recompute, and
    `dense_kept` / `moe_kept` without recompute; `one_micro_batch` whether a step has a single
    micro-batch."""
    none = np.zeros_like(t["rc"])
    return {"one_micro_batch": micro_batches(problem.training.global_batch, t) <= 1,
            "dense": layer_activation_bytes(problem, arch, t, moe=False),
            "moe": layer_activation_bytes(problem, arch, t, moe=True),
            "dense_kept": layer_activation_bytes(problem, arch, t, moe=False, recompute=none),
            "moe_kept": layer_activation_bytes(problem, arch, t, moe=True, recompute=none)}


def stage_memory(problem: Problem, arch: Arch, t: LayoutTable, st: Stage,
                 acts: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Ledger items (bytes) for one GPU of one stage (`MEMORY_ITEMS`) but the context-parallel
    form's buffers, which `with_cp_buffers` adds to `overhead`; plus `side_grads`: the gradient
    shard held in a communication stream's allocator pool (reserved throughout;
    `StackSpec.grads_side_stream`), `side_at_peak`: the part of the `grads` item, at the
    allocated peak, that lies in that pool rather than the compute stream's, and `step_gap`:
    how far the optimizer step's peak exceeds the backward's (-inf where the step adds none).
    Nothing here reads the CP form (`cc`, `cu`): rows that differ only in it are costed once
    (`memory_ledger`). `acts`: the rows' `layer_activations`, when the caller has them
    (`memory_ledger` costs them once per row)."""
    tr = problem.training
    tp, cp, dp = (t[k].astype(np.float64) for k in ("tp", "cp", "dp"))
    zero = t["zero"]
    d = dp * cp
    d_e = edp(t)
    dense, expert = stage_params(arch, t, st)

    def sharded(n_bytes: float, stage_from: int) -> np.ndarray:
        on = zero >= stage_from
        return n_bytes * (dense / np.where(on, d, 1.0) + expert / np.where(on, d_e, 1.0))

    params = sharded(2.0, 3)
    # Low-precision weight cache (Transformer Engine): each linear weight is kept quantised and
    # transposed across micro-batches, 2q bytes per linear parameter on the GPU (reference §3.6:
    # "FP8 adds weight transposes/scales"); not with ZeRO-3, where weights are gathered per use.
    # With `fp8_param_gather` the quantised weight is the parameter itself (Megatron-Core keeps
    # "the compute param in fp8 (do not use any other intermediate dtype)"): its 16-bit copy is
    # gone, 2 bytes per linear parameter (2 - q of each ZeRO-3 shard, kept in the recipe's format).
    rec = recipe(tr.precision)
    if rec.low and problem.stack.low_precision_weight_cache:
        q = rec.element_bytes
        embed_w = (st.embed * arch.p_embed + st.output * (arch.p_output or arch.p_embed)) / tp
        linear = np.maximum(dense + expert - embed_w, 0.0)
        params = params + np.where(zero < 3, 2.0 * q * linear, 0.0)
        if tr.fp8_param_gather:
            shard = np.maximum(dense - embed_w, 0.0) / d + expert / d_e
            params = params - np.where(zero < 3, 2.0 * linear, (2.0 - q) * shard)
    grads = sharded(float(tr.grad_bytes), 2)
    optimizer = sharded(float(tr.optimizer_bytes), 1)
    if np.any(t["oo"] > 0):  # optimizer offload: that share of the state is in host memory
        optimizer = optimizer * (1.0 - t["oo"] / 100.0)

    hybrid = arch.hybrid is not None
    if hybrid:  # activations and the recompute working set by layer type
        activations, a_none = arch.hybrid.activations(problem, arch, t, st)
        a_dense = a_moe = None
    else:
        acts = acts if acts is not None else layer_activations(problem, arch, t)
        a_dense, a_moe = acts["dense"], acts["moe"]
    if not hybrid and np.any(t["rn"] >= 0):  # full recompute of some layers only: the rest keep everything
        kept = np.where(t["rc"] == 2, 1.0 - st.recomputed, 0.0)
        a_dense = kept * acts["dense_kept"] + (1.0 - kept) * a_dense
        a_moe = kept * acts["moe_kept"] + (1.0 - kept) * a_moe
    if not hybrid and np.any(t["rn"] < -1):  # uniform groups: one layer input kept per group
        kept_share, group = uniform_groups(t, st.n_dense + st.n_moe)  # (`cost.offload`)
        a_dense, a_moe = a_dense * kept_share, a_moe * kept_share
    if not hybrid:
        # the stack's measured activation factor over the fused-kernel accounting (StackSpec)
        activations = problem.stack.activation_factor * st.inflight * (
            st.n_dense * a_dense + st.n_moe * a_moe)
    if not hybrid and np.any(t["ao"] > 0):  # activation offload: the first ao layers' saved tensors leave,
        # one offloaded layer of one micro-batch stays in transfer (`cost.offload`)
        off_d, off_m = offloaded_layers(t, st.n_dense, st.n_moe)
        in_transfer = np.where(off_m > 0, a_moe, 0.0)
        in_transfer = np.maximum(in_transfer, np.where(off_d > 0, a_dense, 0.0))
        activations = activations - problem.stack.activation_factor * (
            st.inflight * (off_d * a_dense + off_m * a_moe) - in_transfer)

    if tr.offload_modules != "none":  # one MoE layer's offloaded inputs in transfer (`cost.offload`)
        has_moe = True if hybrid else st.n_moe > 0
        activations = activations + np.where(has_moe, problem.stack.activation_factor
                                             * module_offload_in_transfer(problem, arch, t), 0.0)

    s, b = tr.seq_len, t["mb"].astype(np.float64)
    tokens = b * s / cp
    rep_div = np.where(t["sp"] == 1, tp, 1.0)
    # First stage: int64 token ids + embedding dropout mask per in-flight micro-batch (ref §1.3).
    embed = st.inflight_mb * (8.0 * tokens + arch.dropout * tokens * arch.hidden / rep_div)
    # Last stage: final-norm output and output-layer input 2sbh + 2sbh, and the loss's logits:
    # fp32 4sbV / t for a vocab-parallel cross-entropy (reference §1.3 / §3.1), more where the
    # model code upcasts and copies them (`cost.model_code`: 6-12 bytes per entry).
    loss_bytes = model_code(tr.model_code, compiled=tr.torch_compile).loss_bytes_per_vocab
    logits = (st.output + st.mtp) * tokens * (4.0 * arch.hidden / rep_div
                                              + loss_bytes * arch.vocab / tp)

    # ZeRO-3 / FSDP gathers one unit (a layer, or the embedding) in bf16 and prefetches the next
    # (reference §1.6: ~2 x 2 bytes x unit); the rank's own 1/d shard is already counted, and a
    # stage with a single unit has nothing to prefetch.
    embed_unit = (st.embed * arch.p_embed + st.output * (arch.p_output or arch.p_embed)) / tp
    layers = np.maximum(st.n_dense + st.n_moe, 1)
    layer_unit = (dense + expert - embed_unit) / layers
    two_units = np.minimum(dense + expert, 2.0 * np.maximum(layer_unit, embed_unit))
    gathered = np.where(zero == 3, 2.0 * two_units * (1.0 - 1.0 / d), 0.0)
    # Full recompute re-materialises one layer's activations during its backward (reference §3.4).
    a_none = a_none if hybrid else np.maximum(
        acts["dense_kept"], acts["moe_kept"] if arch.n_moe_layers else 0.0)
    # TorchTitan's op-level selective policy recomputes the rest of the block the same way.
    recomputing = (t["rc"] == 2) | ((t["rc"] == 1) & (problem.stack.selective_policy == "op_sac"))
    working = np.where(recomputing & (np.asarray(st.recomputed) > 0), a_none, 0.0)
    if np.any(t["rn"] < -1):  # a uniform group re-materialises N layers at once
        working = working * np.where(t["rc"] == 2, group, 1.0)
    # torch.autocast over fp32 weights caches the 16-bit cast of every weight it meets until the
    # forward ends (torch.autocast `cache_enabled=True`, PyTorch docs; autocast_mode.cpp caches
    # casts of leaf tensors that require grad): a whole 16-bit copy of the stage's weights, also
    # under ZeRO-3 / FSDP, whose gathered units are cast and cached one after the other.
    cast_cache = 2.0 * (dense + expert) if tr.autocast else 0.0
    # fixed: the GEMM workspaces (`cost.device_memory.workspace_bytes`) and any fixed extra a
    # profile sets (`Profile.memory_overhead_gib`, 0 by default)
    fixed = workspace_bytes(problem.cluster.gpu.generation, problem.stack.transformer_engine,
                            arch.n_moe_layers > 0) + problem.profile.memory_overhead_gib * GiB
    # the CP form's buffers join the overhead in `with_cp_buffers`
    overhead = fixed + gathered + working + cast_cache
    one = acts["one_micro_batch"] if acts is not None else micro_batches(tr.global_batch, t) <= 1
    unsharded = np.zeros(len(t), dtype=bool)
    if problem.stack.unsharded_accumulation:
        # FSDP1 `no_sync()` between the micro-batches of a step (Lightning Fabric's
        # `no_backward_sync`, LitGPT's training loops): the gradients accumulate unsharded in the
        # FlatParameter until the last micro-batch reduce-scatters them (PyTorch
        # FullyShardedDataParallel.no_sync docs: "FSDP will accumulate the full model gradients
        # (instead of gradient shards) until the eventual sync"): the whole stage's gradients
        unsharded = (~one) & (zero >= 2)
        grads = np.where(unsharded, float(tr.grad_bytes) * (dense + expert), grads)
    grads_full = grads
    if not problem.stack.persistent_grads:
        # Gradients freed between steps (PyTorch `zero_grad(set_to_none=True)`, FSDP2's sharded
        # grads allocated by each layer's reduce-scatter): with one micro-batch per step they
        # appear as the activations are released during the backward, so the peak holds the
        # larger of the two, not their sum; with accumulation they persist across micro-batches.
        transient = activations + embed + logits + working + cast_cache
        grads = np.where(one, np.maximum(grads - transient, 0.0), grads)
    step_gap = -np.inf
    if problem.stack.optimizer_foreach:
        # The optimizer step runs after the backward, every gradient held and no activation: a
        # foreach AdamW adds one moment-sized temporary (4 bytes fp32, 2 bf16) per local
        # parameter (`StackSpec.optimizer_foreach`); where that peak exceeds the backward's, the
        # excess is overhead (allocated = the larger of the two peaks; `with_cp_buffers`).
        moment = 4.0 if tr.optimizer_dtype == "fp32" else 2.0
        backward_peak = grads + activations + embed + logits + overhead
        step_peak = grads_full + sharded(moment, 1) + fixed
        step_gap = step_peak - backward_peak

    items = {
        "params": params,
        "grads": grads,
        "optimizer": optimizer,
        "activations": activations,
        "embedding_logits": embed + logits,
        "overhead": overhead,
        "step_gap": step_gap,
    }
    # gradients on a communication stream's pool (`StackSpec.grads_side_stream`): sharded ones
    # (ZeRO-2/3, reduce-scattered), the whole shard in the reduction dtype, reserved throughout
    if problem.stack.grads_side_stream:
        side = (zero >= 2) & (d > 1)
        items["side_grads"] = np.where(side, sharded(float(tr.grad_reduce_bytes), 2), 0.0)
        # the gradients the allocated peak holds that live in that pool (unsharded accumulation
        # keeps them on the compute stream)
        items["side_at_peak"] = np.where(side & ~unsharded, grads, 0.0)
    else:
        items["side_grads"], items["side_at_peak"] = 0.0, 0.0  # arrays in `memory_ledger`
    return items


STAGE_FIGURES = ("allocated", "reserved", "device")
"""Per-stage figures as users read them: `torch.cuda.max_memory_allocated`,
`max_memory_reserved`, `nvidia-smi` (`cost.device_memory`)."""


def with_cp_buffers(items: dict[str, np.ndarray], kv_buffers: np.ndarray) -> dict[str, np.ndarray]:
    """`stage_memory`'s items with the CP form's buffers in `overhead` (`step_gap` dropped): a
    layer's attention holds them at the backward's peak (`cost.context.cp_buffer_bytes`: ring
    receive buffers, the all-to-all copies, the gathered K, V), so the overhead is the step's
    excess or the buffers, whichever is larger: overhead + kv + max(gap - kv, 0)."""
    out = {k: v for k, v in items.items() if k != "step_gap"}
    out["overhead"] = items["overhead"] + np.maximum(items["step_gap"], kv_buffers)
    return out


MEMORY_BASE_COLUMNS = tuple(c for c in COLUMNS if c not in CP_FORM_COLUMNS)
"""The columns the memory ledger reads but for the CP form's buffers (`stage_memory` reads no
`CP_FORM_COLUMNS`; they reach the memory through `with_cp_buffers`)."""


def memory_ledger(problem: Problem, arch: Arch, t: LayoutTable) -> dict[str, np.ndarray]:
    """Memory items of the most-loaded stage per row, plus `total` (= allocated), `reserved`,
    `device`, `capacity`, `usable`, `fit_peak` (the figure compared with `usable`) and `stage`
    (0 first, 1 middle, 2 last); and every item and figure of each stage kind under
    `<stage>.<key>` (`first.params`, `last.device`, ...).

    Fits (`fit_peak <= usable`): by default the reserved peak of the most loaded stage (less a
    communication stream's free cached gradient blocks, which the allocator releases before it
    fails) against the capacity less what lies outside the caching allocator (CUDA context and
    NCCL memory: `cost.device_memory`); with an explicit `usable_fraction`, the allocated peak
    against capacity x usable_fraction (the seed's rule).

    Rows equal but for the CP form (a plan crosses every cp > 1 row with the forms and group
    sizes it searches) share everything but the form's buffers: `stage_memory` runs once per
    distinct row (`cost.distinct_rows`) and the buffers are added per row, the same numbers as
    costing every row."""
    found = distinct_rows(t, MEMORY_BASE_COLUMNS) if np.any(t["cp"] > 1) else None
    base, inverse = (t, None) if found is None else (t.take(found[0]), found[1])
    sts = stages(arch, base, problem.training.global_batch)
    # outside PyTorch's allocator: CUDA context, NCCL, and DeepEP's own buffers (`cost.moe_memory`)
    outside = spread(outside_allocator_bytes(base, tied_embeddings=arch.tied,
                                             world_group=problem.stack.world_group)
                     + dispatch_buffer_bytes(problem, arch, base), inverse)
    acts = None if arch.hybrid is not None else layer_activations(problem, arch, base)
    kv_buffers = cp_buffer_bytes(problem, arch, t)
    per_stage = [with_cp_buffers({k: spread(v, inverse) for k, v in
                                  stage_memory(problem, arch, base, sts[name], acts).items()},
                                 kv_buffers) for name in STAGES]
    out: dict[str, np.ndarray] = {}
    for name, items in zip(STAGES, per_stage):
        for k in ("side_grads", "side_at_peak"):  # 0 where the stack has no side stream
            if np.ndim(items[k]) == 0:
                items[k] = np.full(len(t), float(items[k]))
        allocated = sum(items[k] for k in MEMORY_ITEMS)
        items["allocated"] = allocated
        # side-stream gradients: their pool replaces the grads the allocated peak holds
        items["reserved"] = reserved_bytes(allocated, items["side_grads"], items["side_at_peak"])
        # what must fit: the side stream's free cached blocks are released and the allocation
        # retried before an out-of-memory error (CUDACachingAllocator.cpp `malloc`:
        # release_cached_blocks, then alloc_block again), so they do not count against the GPU
        items["fit_reserved"] = reserved_bytes(allocated)
        items["device"] = items["reserved"] + outside
        out |= {f"{name}.{k}": v for k, v in items.items()}
    totals = np.stack([items["allocated"] for items in per_stage])
    worst = np.argmax(totals, axis=0)
    for key in MEMORY_ITEMS + ("reserved", "device", "fit_reserved"):
        out[key] = pick(worst, [items[key] for items in per_stage])
    out["model_states"] = out["params"] + out["grads"] + out["optimizer"]
    out["total"] = np.max(totals, axis=0)
    capacity = problem.cluster.gpu.hbm_gib * GiB
    out["capacity"] = np.full(len(t), capacity)
    fraction = problem.training.usable_fraction
    if fraction is None:
        out["usable"] = capacity - outside
        out["fit_peak"] = out.pop("fit_reserved")
    else:
        out["usable"] = np.full(len(t), capacity * fraction)
        out["fit_peak"] = out["total"]
        out.pop("fit_reserved")
    out["headroom"] = out["usable"] - out["fit_peak"]
    out["stage"] = worst
    return out
