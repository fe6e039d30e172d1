"""Named-module recompute, uniform recompute groups, activation offload and optimizer offload:
their memory savings and time costs, for the rows of a `LayoutTable` that use them.

Named modules (Megatron-Core `--recompute-granularity selective --recompute-modules`): each
module frees the tensors it would store inside itself in the per-layer accounting of
`memory.layer_activation_bytes` (Korthikanti et al. 2022, arXiv 2205.05198, Sec. 4.1, term by
term; reference §3.4), and re-runs its forward in the backward:

- core_attn: the eager attention scores 5as^2b (2as^2b without dropout); nothing with fused
  attention, whose kernel stores only its inputs and output (the default module);
- layernorm: the outputs of input_layernorm and pre_mlp_layernorm, i.e. the QKV and FC1 (or
  router) inputs, 2sbh + 2sbh (TP-sharded with SP); re-run: the two norms (memory-bound);
- mlp (dense layers): everything inside the MLP, c_f sbf/t (SwiGLU 6, GeLU 4: the FC1 output and
  the FC2 input), keeping its input; re-run: FC1 and FC2 and the activation;
- moe_act (MoE layers): the routed experts' FC2 inputs, k 2sbf_e/t; re-run: the activation;
- moe (MoE layers): the router probabilities 4sbE, the routed copies held per rank
  (`cost.moe_memory.routed_activation_bytes`: expert TP keeps the FC1 inputs 2h whole) and the
  shared experts' c_f f_sh; re-run: router, experts and the dispatch/combine all-to-alls;
- shared_experts (MoE layers): the shared experts' c_f f_sh; re-run: their GEMMs;
- mla_up_proj (MLA): the up-projected Q, K and V (2 n_h d_qk + 2 n_h (d_qk + d_v)); re-run: the
  up-projection GEMMs.

With a low-precision recipe whose stack saves quantised linear inputs, the linear inputs among
them (QKV, FC1, FC2, expert inputs) are freed at the recipe's element size, as the ledger stores
them. Overlaps: `moe` contains `moe_act` and `shared_experts`.

Uniform groups (`--recompute-method uniform --recompute-num-layers N`, Megatron-Core
transformer_block.py `_checkpointed_forward`): a model chunk of L_c layers keeps ceil(L_c / N)
group inputs (2sbh each) and re-materialises one whole group, N layers, during its backward.

Activation offload (Megatron-Core `--cpu-offloading-num-layers N`, cpu_offload.py: a group per
layer, double-buffered): the saved activations of the first N layers of each stage are copied
to pinned host memory during the forward and back before their backward. What stays: the other
layers plus one offloaded layer's activations in transfer (the one just computed, or the one
prefetched ahead of its backward). Each layer's copy overlaps the next layer's forward (D2H)
and the backward of the layer after it (H2D) on the copy engines, so per layer and micro-batch
only max(0, bytes / link - forward) + max(0, bytes / link - backward) is exposed.

Fine-grained activation offload (Megatron-Core `--fine-grained-activation-offloading
--offload-modules`, docs/source/api-guide/fine_grained_activation_offloading.md: each named
module's input goes to the host in the forward and returns before the module's backward; the
job's `offload_modules`): of each MoE layer, `expert_fc1` moves the routed experts' FC1 input,
h elements per routed copy at the stored element size (2 bytes, or the recipe's where the stack
saves quantised linear inputs), and `moe_act` the experts' activation input, the FC1 output,
(c_f - 2) f_e / etp bytes per copy in BF16 (the ledger's c_f f_e less the FC2 input 2 f_e;
SwiGLU 4 f_e, squared ReLU 2 f_e). Nothing moves for a layer that keeps no such tensor: full
recompute, or selective recompute of the whole `moe` module. One MoE layer's offloaded tensors
stay on the GPU in transfer (the one just computed, or the one prefetched ahead of its
backward: `fine_grained_offloading_max_inflight_offloads` 1 in the Nemotron-3 Ultra recipes).
The copies hide behind the layer's forward (D2H) and backward (H2D) as whole-layer offload's
do (`activation_offload_time`).

Optimizer offload (Megatron `--optimizer-cpu-offload --optimizer-offload-fraction F`,
HybridDeviceOptimizer; DeepSpeed ZeRO-Offload, Ren et al. 2021, arXiv 2101.06840): the share F
of the rank's fp32 master weights and moments lives in host memory; each step its gradients go
to the host (grad dtype bytes), the CPU runs Adam on them (`Profile.cpu_adam_params_per_s`) and
the updated bf16 parameters come back (2 bytes), one after the other (no overlap assumed: an
upper bound where the stack overlaps copies with the CPU step). The GPU gradient buffer stays
(Megatron keeps its DDP buffer; DeepSpeed also offloads its gradient partition, which this
model does not credit).
"""

from __future__ import annotations

import numpy as np

from ..errors import SpecError
from ..layouts import LayoutTable
from ..specs.layout import MODULE_BITS, RecomputeModule
from ..specs.precision import recipe
from ..specs.problem import Problem
from .arch import Arch
from .compute import linear_time, memory_bound_time

BIT = {m.value: b for m, b in MODULE_BITS.items()}


def _has(t: LayoutTable, module: RecomputeModule) -> np.ndarray:
    """Rows whose selective recompute re-runs `module` (rm = 0 means core_attn alone)."""
    rm = t["rm"]
    bit = MODULE_BITS[module]
    on = (rm & bit) > 0
    if module == RecomputeModule.CORE_ATTN:
        on = on | (rm == 0)
    return (t["rc"] == 1) & on


def _linear_factor(problem: Problem) -> float:
    """Bytes of a stored linear input per bf16 byte: the recipe's element size / 2 where the
    stack keeps quantised linear inputs (as `memory.layer_activation_bytes`), else 1."""
    rec = recipe(problem.training.precision)
    if rec.low and problem.stack.low_precision_activations:
        return rec.element_bytes / 2.0
    return 1.0


def module_saved_bytes(problem: Problem, arch: Arch, t: LayoutTable, moe: bool) -> dict:
    """Activation bytes per layer and micro-batch each named module frees on one GPU (arrays,
    before the stack's activation factor), keyed by module name; core_attn as the eager scores."""
    s, b = problem.training.seq_len, t["mb"].astype(np.float64)
    tp, cp = t["tp"].astype(np.float64), t["cp"].astype(np.float64)
    tokens = b * s / cp
    rep_div = np.where(t["sp"] == 1, tp, 1.0)
    kv_div = np.minimum(tp, arch.n_kv_heads)
    lin = _linear_factor(problem)
    h = arch.hidden
    zero = np.zeros(len(t))
    out = {"core_attn": zero, "layernorm": lin * 4.0 * h * tokens / rep_div}
    if problem.training.attention == "eager":
        coef = 5.0 if arch.dropout else 2.0
        out["core_attn"] = coef * b * (arch.n_heads / tp) * (s / cp) * s
    if moe:
        from .moe_memory import moe_act_bytes, routed_activation_bytes  # per rank

        shared = arch.act_coef * arch.shared_ffn - (1.0 - lin) * 2.0 * arch.shared_ffn
        routed = routed_activation_bytes(problem, arch, t, low_precision=lin < 1.0)
        out["moe_act"] = moe_act_bytes(problem, arch, t)
        out["shared_experts"] = tokens * shared / tp
        out["moe"] = routed + tokens * (shared / tp + 4.0 * arch.n_experts / rep_div)
        out["mlp"] = zero
    else:
        f = arch.p_mlp / (h * (arch.mlp_up + 1))
        out["mlp"] = tokens * (arch.act_mlp_shard - (1.0 - lin) * 2.0 * f) / tp
        out["moe_act"] = out["moe"] = out["shared_experts"] = zero
    if arch.act_attn_rep > (4 + arch.dropout) * h:  # MLA latents stored: an MLA model
        q = 2.0 * arch.n_heads * arch.qk_head_dim
        out["mla_up_proj"] = tokens * (q / tp + arch.act_attn_kv / kv_div)
    else:
        out["mla_up_proj"] = zero
    return out


def keeps_scores(t: LayoutTable, rc: np.ndarray) -> np.ndarray:
    """Rows that store the eager attention scores: no recompute, or selective recompute whose
    modules leave out core_attn."""
    rm = t["rm"]
    return (rc == 0) | ((rc == 1) & (rm > 0) & ((rm & MODULE_BITS[RecomputeModule.CORE_ATTN]) == 0))


def selective_saved(problem: Problem, arch: Arch, t: LayoutTable, moe: bool,
                    core_attn: bool = True) -> np.ndarray:
    """Bytes per layer and micro-batch the row's selective modules free (0 where rc != 1);
    without `core_attn`, what the modules other than core attention free."""
    per = module_saved_bytes(problem, arch, t, moe)
    total = np.zeros(len(t))
    for m in RecomputeModule:
        if m in (RecomputeModule.MOE_ACT, RecomputeModule.SHARED_EXPERTS):
            continue
        if m == RecomputeModule.CORE_ATTN and not core_attn:
            continue
        total = total + np.where(_has(t, m), per[m.value], 0.0)
    whole_moe = _has(t, RecomputeModule.MOE)
    for m in (RecomputeModule.MOE_ACT, RecomputeModule.SHARED_EXPERTS):
        total = total + np.where(_has(t, m) & ~whole_moe, per[m.value], 0.0)
    return total


def selective_recompute_time(problem: Problem, arch: Arch, t: LayoutTable, moe: bool,
                             attn: np.ndarray) -> np.ndarray:
    """Forward seconds per layer and micro-batch the row's selective modules re-run (0 where
    rc != 1); `attn` is the layer's core-attention forward (core_attn)."""
    s = problem.training.seq_len
    T = t["mb"].astype(np.float64) * s / t["cp"]
    tp = t["tp"].astype(np.float64)
    h = arch.hidden
    kv_div = np.minimum(tp, arch.n_kv_heads)
    per = module_saved_bytes(problem, arch, t, moe)
    elem = lambda n: memory_bound_time(  # noqa: E731  write + re-read (the ledger's rule)
        problem, 2.0 * problem.profile.elementwise_factor * n)
    out = np.where(_has(t, RecomputeModule.CORE_ATTN), attn, 0.0)
    out = out + np.where(_has(t, RecomputeModule.LAYERNORM), elem(per["layernorm"]), 0.0)
    if moe:
        from .moe_layer import expert_gemms  # the MoE block's own grouped GEMMs

        experts = expert_gemms(problem, arch, t)
        shared = 0.0
        if arch.shared_ffn:
            f_s = arch.shared_ffn
            shared = linear_time(problem, T, arch.mlp_up * f_s / tp, h) \
                + linear_time(problem, T, h, f_s / tp)
        whole = _has(t, RecomputeModule.MOE)
        out = out + np.where(whole, experts + shared + elem(per["moe"]), 0.0)
        out = out + np.where(_has(t, RecomputeModule.MOE_ACT) & ~whole, elem(per["moe_act"]), 0.0)
        out = out + np.where(_has(t, RecomputeModule.SHARED_EXPERTS) & ~whole,
                             shared + elem(per["shared_experts"]), 0.0)
    else:
        f = arch.gemm_share * arch.p_mlp / (h * (arch.mlp_up + 1))  # as the layer's forward
        mlp = linear_time(problem, T, arch.mlp_up * f / tp, h) + linear_time(problem, T, h, f / tp)
        out = out + np.where(_has(t, RecomputeModule.MLP), mlp + elem(per["mlp"]), 0.0)
    if np.any(per["mla_up_proj"] > 0):
        up = (arch.p_attn_q - arch.p_attn_out) / tp + arch.p_attn_kv / kv_div
        out = out + np.where(_has(t, RecomputeModule.MLA_UP_PROJ), linear_time(problem, T, up / h, h), 0.0)
    return out


def moe_recomputed(t: LayoutTable) -> np.ndarray:
    """1 where selective recompute re-runs whole MoE layers (their all-to-alls run again)."""
    return _has(t, RecomputeModule.MOE).astype(np.float64)


def uniform_groups(t: LayoutTable, layers) -> tuple[np.ndarray, np.ndarray]:
    """(kept share, working layers) of full recompute in uniform groups of N = -rn layers
    (rn < -1): a chunk of L_c = layers / vp layers keeps ceil(L_c / N) of its L_c layer inputs
    and re-materialises min(N, L_c) layers at once; (1, 1) for every other row."""
    n = np.maximum(-t["rn"], 1).astype(np.float64)
    chunk = np.maximum(np.asarray(layers, dtype=np.float64) / t["vp"], 1.0)
    grouped = (t["rc"] == 2) & (t["rn"] < -1)
    kept = np.where(grouped, np.ceil(chunk / n) / chunk, 1.0)
    working = np.where(grouped, np.minimum(n, chunk), 1.0)
    return kept, working


def host_bytes_per_s(problem: Problem) -> float:
    """Achievable GPU <-> host copy rate per direction, bytes/s (`GPUSpec.host_link_gb_per_s` x
    `Profile.host_link_efficiency`); a SpecError when the GPU preset gives no host link."""
    gpu = problem.cluster.gpu
    if gpu.host_link_gb_per_s is None:
        raise SpecError(f"GPU `{gpu.name}` has no `host_link_gb_per_s`: offload cannot be "
                        "costed; add the host link (GB/s per direction) to the GPU spec or "
                        "drop the offload")
    return gpu.host_link_gb_per_s * 1e9 * problem.profile.host_link_efficiency


def module_offload_bytes(problem: Problem, arch: Arch, t: LayoutTable,
                         recompute: np.ndarray | None = None) -> np.ndarray:
    """Bytes the job's offloaded modules (`TrainingSpec.offload_modules`) move to the host per
    MoE layer and micro-batch on one rank, before the stack's activation factor (module
    docstring); 0 for a model without MoE layers, for rows whose layers keep no such tensor
    (full recompute in the row or in `recompute`, the recompute the caller costs, default the
    row's; selective recompute of the whole `moe` module) and without offloaded modules."""
    mods = problem.training.offload_modules
    if mods == "none" or not arch.n_moe_layers:
        return np.zeros(len(t))
    from .moe_memory import _linear_bytes, routed_copies  # per rank: expert TP, imbalance

    rc = t["rc"] if recompute is None else recompute
    copies = routed_copies(problem, arch, t)
    per = 0.0
    names = mods.split("+")
    if "expert_fc1" in names:  # the dispatched tokens: h elements at the stored size
        per = per + _linear_bytes(problem) * arch.hidden
    if "moe_act" in names:  # the FC1 output in BF16: c_f f_e less the FC2 input's 2 f_e
        per = per + (arch.act_coef - 2.0) * arch.expert_ffn / t["etp"]
    # a fully recomputed row offloads nothing, even in the ledger's kept-layer figures (its
    # recompute working set re-materialises whole layers; its partially recomputed rows'
    # kept layers are not credited: an upper bound)
    keeps = (rc != 2) & (t["rc"] != 2) & ~_has(t, RecomputeModule.MOE)
    return np.where(keeps, copies * per, 0.0)


def module_offload_in_transfer(problem: Problem, arch: Arch, t: LayoutTable) -> np.ndarray:
    """Offloaded module bytes one stage keeps on the GPU in transfer: one MoE layer's
    (`module_offload_bytes`; of a hybrid model, its largest MoE layer type's), before the stack's
    activation factor."""
    if arch.hybrid is None:
        return module_offload_bytes(problem, arch, t)
    out = np.zeros(len(t))
    for part in arch.hybrid.parts:
        if part.moe:
            out = np.maximum(out, module_offload_bytes(problem, part.arch, t))
    return out


def offloaded_layers(t: LayoutTable, n_dense, n_moe) -> tuple[np.ndarray, np.ndarray]:
    """(dense, MoE) layers of a stage whose activations are offloaded: the first `ao` of the
    stage's layers (its dense layers come first), at most all of them."""
    ao = t["ao"].astype(np.float64)
    dense = np.minimum(ao, n_dense)
    return dense, np.minimum(np.maximum(ao - dense, 0.0), n_moe)


def activation_offload_time(problem: Problem, bytes_per_layer, fwd_layer, bwd_layer,
                            n_off) -> np.ndarray:
    """Exposed seconds per micro-batch of offloading `n_off` layers of `bytes_per_layer` each:
    each copy hides behind one layer's forward (D2H) and one layer's backward (H2D)."""
    copy = np.asarray(bytes_per_layer) / host_bytes_per_s(problem)
    return n_off * (np.maximum(0.0, copy - fwd_layer) + np.maximum(0.0, copy - bwd_layer))


def optimizer_offload_time(problem: Problem, params: np.ndarray, share: np.ndarray) -> np.ndarray:
    """Seconds per step of the offloaded optimizer share: gradients to the host (grad dtype),
    CPU Adam, bf16 parameters back, in sequence, for `share` of the rank's `params`."""
    moved = share * params
    link = host_bytes_per_s(problem)
    copies = moved * (float(problem.training.grad_bytes) + 2.0) / link
    return copies + moved / problem.profile.cpu_adam_params_per_s
