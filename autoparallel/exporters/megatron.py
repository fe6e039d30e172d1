"""Megatron-LM: a bash script that runs `torchrun ... pretrain_gpt.py` with Megatron-LM flags.

Flags, defaults and checks follow launchers.md §1 (Megatron-LM `arguments.py` and Megatron-Core
configs). Mapping of autoparallel's layout:

| layout | Megatron-LM |
|---|---|
| dp | not a flag: Megatron derives DP = world / (TP x PP x CP) |
| tp, sp | `--tensor-model-parallel-size`, `--sequence-parallel` |
| pp, vp | `--pipeline-model-parallel-size`, `--num-layers-per-virtual-pipeline-stage L/(PP x VP)` |
| uneven split | `--decoder-first-pipeline-num-layers`, `--decoder-last-pipeline-num-layers` when each stage's layers divide by VP (and VP as `--num-virtual-stages-per-pipeline-rank`, launchers.md §1.1); else `--account-for-embedding-in-pipeline-split` / `--account-for-loss-in-pipeline-split` where counting the embedding and loss as a layer each reproduces the split (Megatron-Bridge's Llama-3.1-405B and Qwen3 recipes); else `--pipeline-model-parallel-layout` (`split_args`) |
| schedule | 1F1B, or interleaved 1F1B with VP; zero-bubble and DualPipe schedules are refused |
| cp | `--context-parallel-size`, `--cp-comm-type` of the form (`CP_COMM_TYPE`), `--hierarchical-context-parallel-sizes u r` for a2a+ring |
| ep, etp | `--expert-model-parallel-size`, `--expert-tensor-parallel-size` (parallel folding: the expert grid ETP x EP x EDP on the TP x CP x DP ranks, so EP may exceed DP) |
| zero 0 | plain DDP (no sharding flag) |
| zero 1 | `--use-distributed-optimizer` (optimizer state sharded over DP x CP) |
| zero 2 | `--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads` |
| zero 3 | `--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params` |
| recompute | `selective`: `--recompute-granularity selective --recompute-modules core_attn`; `full`: `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`; `full` of the first N layers per chunk: `--recompute-method block --recompute-num-layers N` |

Megatron-FSDP (ZeRO-2/3) is refused with interleaving and with MoE models: Megatron Bridge's
Megatron-FSDP v2 forbids several model chunks per rank and MoE (launchers.md §7 item 7), and
which FSDP version runs is Megatron's choice, not the script's.
"""

from __future__ import annotations

import shlex

from ..specs.layout import Recompute
from ._base import Exporter, Job, architecture, comments, dp_bucket_params, recompute_of

SCRIPT = "pretrain_gpt.py"
RDZV_PORT = 29500
"""Rendezvous port of the launchers.md §1.2 / §6.2 examples."""

SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
"""ZeRO stage -> Megatron-FSDP `--data-parallel-sharding-strategy` (launchers.md §1.1: the values
are ZeRO 0/1/2/3 as `no_shard`/`optim`/`optim_grads`/`optim_grads_params`)."""


class Raw(str):
    """A shell word written as is (already quoted, or meant to expand)."""


def shell_line(words) -> str:
    """Words joined for bash; plain words are quoted where needed, `Raw` ones kept."""
    return " ".join(w if isinstance(w, Raw) else shlex.quote(str(w)) for w in words)


def accounting(n_layers: int, pp: int, vp: int, stage_layers: list[int]) -> tuple[bool, bool] | None:
    """(embedding, loss) counted as a layer each if that reproduces `stage_layers`: Megatron-Core
    then places (L + e + l) / pp layers on every rank, one fewer in the first chunk of rank 0
    (`--account-for-embedding-in-pipeline-split`) and in the last chunk of rank pp - 1
    (`--account-for-loss-in-pipeline-split`), each rank's count divisible by vp
    (transformer_block.py `get_num_layers_to_build`, transformer_config.py checks, 0.16.1).
    None when no such accounting gives the split."""
    for emb, loss in ((True, True), (True, False), (False, True)):
        total = n_layers + emb + loss
        if total % pp or (total // pp) % vp:
            continue
        m = total // pp
        if list(stage_layers) == [m - emb] + [m] * (pp - 2) + [m - loss]:
            return emb, loss
    return None


def layout_string(stage_layers: list[int], vp: int) -> str:
    """Megatron-Core's `--pipeline-model-parallel-layout` for these layers per rank: stage i =
    chunk a of rank b with i = a x pp + b, `|` between stages, `E` the embedding (chunk 0 of
    rank 0), `L` the loss (last chunk of rank pp - 1), `t*k` k decoder layers, `(X|)*n` n equal
    stages (PipelineParallelLayerLayout.parse_str_to_list, 0.16.1). Each rank's layers are dealt
    over its chunks as evenly as they go, the extra layers away from the embedding and towards
    the loss end: rank 0's last chunks, the last rank's first chunks, as the accounting above
    would place them.

    Example: DeepSeek-V3's 61 layers as [15, 16, 16, 14] on vp 4 -> 'Et*3|(t*4|)*10t*3|(t*4|)*3t*3L'
    (rank 3 holds 4, 4, 3, 3 layers in its chunks)."""
    pp = len(stage_layers)
    chunks = []
    for b, n in enumerate(stage_layers):
        base, extra = divmod(n, vp)
        per = [base + (a >= vp - extra if b < pp - 1 else a < extra) for a in range(vp)]
        chunks.append(per)
    stages = []
    for a in range(vp):
        for b in range(pp):
            k = chunks[b][a]
            text = ("E" if a == b == 0 else "") + ("t" if k == 1 else f"t*{k}" if k else "")
            stages.append(text + ("L" if a == vp - 1 and b == pp - 1 else ""))
    out, i = [], 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) - 1 and stages[j + 1] == stages[i]:
            j += 1
        n = j - i + 1
        out.append(f"({stages[i]}|)*{n}" if n > 1 else stages[i] + ("|" if j < len(stages) - 1 else ""))
        i = j + 1
    return "".join(out)


def split_args(job: Job) -> list:
    """Pipeline split flags: none for the even split (`--num-layers-per-virtual-pipeline-stage`
    with vp > 1); an uneven split as Megatron-Core reads it, the first form that expresses it:
    `--decoder-first/last-pipeline-num-layers` when every stage's count is divisible by vp, the
    embedding/loss accounting (`accounting`), else `--pipeline-model-parallel-layout`
    (`layout_string`, which sets vp itself). With vp > 1 the first two take
    `--num-virtual-stages-per-pipeline-rank` (Megatron-LM arguments.py: uneven splits need it)."""
    lay = job.layout
    sl = lay.stage_layers
    if not sl:
        return ["--num-layers-per-virtual-pipeline-stage", job.layers_per_virtual_stage] if lay.vp > 1 else []
    vp_flag = ["--num-virtual-stages-per-pipeline-rank", lay.vp] if lay.vp > 1 else []
    if all(x % lay.vp == 0 for x in sl):
        return ["--decoder-first-pipeline-num-layers", sl[0],
                "--decoder-last-pipeline-num-layers", sl[-1]] + vp_flag
    counted = accounting(job.problem.model.n_layers, lay.pp, lay.vp, sl)
    if counted is not None:
        return ((["--account-for-embedding-in-pipeline-split"] if counted[0] else [])
                + (["--account-for-loss-in-pipeline-split"] if counted[1] else []) + vp_flag)
    return ["--pipeline-model-parallel-layout", layout_string(sl, lay.vp)]


DISPATCHER_FLAGS = {
    "alltoall": ["--moe-token-dispatcher-type", "alltoall"],
    "allgather": ["--moe-token-dispatcher-type", "allgather"],
    "deepep": ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"],
    "hybridep": ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
                 "hybridep"],
}
"""`JobSpec.moe_dispatcher` -> Megatron-LM flags (`--moe-token-dispatcher-type
alltoall|allgather|flex`, `--moe-flex-dispatcher-backend deepep|hybridep`; Megatron-Core MoE
README "Enable DeepEP token dispatcher")."""
CUDA_GRAPH_FLAGS = {
    "scoped": ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn",
               "moe_router", "moe_preprocess"],
    "full": ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"],
}
"""`JobSpec.cuda_graphs` -> Megatron-LM flags (TransformerConfig `cuda_graph_impl`,
`cuda_graph_scope`: Transformer Engine graphs of attention and the MoE router / preprocess, or
the local whole-iteration graph), as the stack presets source them."""


def moe_args(job: Job) -> list[list]:
    """The MoE job settings the cost model assumed, as Megatron-LM flags: the dispatcher (with
    EP > 1 or when it is not the default alltoall), the all-to-all overlap (`--overlap-moe-expert-
    parallel-comm --delay-wgrad-compute`), forced balancing (`--moe-router-force-load-balancing`)
    or token dropping padded to capacity (`--moe-expert-capacity-factor F
    --moe-pad-expert-input-to-capacity`)."""
    lay, tr = job.layout, job.problem.training
    lines = []
    if lay.ep > 1 or tr.moe_dispatcher != "alltoall":
        lines.append(list(DISPATCHER_FLAGS[tr.moe_dispatcher]))
    if tr.moe_a2a_overlap:
        lines.append(["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"])
    if tr.moe_routing == "balanced":
        lines.append(["--moe-router-force-load-balancing"])
    elif tr.moe_routing == "capacity":
        lines.append(["--moe-expert-capacity-factor", f"{tr.moe_capacity_factor:g}",
                      "--moe-pad-expert-input-to-capacity"])
    return lines


def recompute_settings(job: Job) -> dict:
    """The layout's recompute as Megatron-Core's `TransformerConfig` fields (Megatron-LM flags of
    the same names): `selective` re-runs the named modules (core_attn by default); `full` of the
    first N layers of each model chunk is method `block` with N layers, the rest keep their
    activations; `full` of every layer is method `uniform` in groups of `recompute_group` (1)."""
    lay, rc = job.layout, recompute_of(job)
    out = dict.fromkeys(("recompute_granularity", "recompute_method", "recompute_num_layers",
                         "recompute_modules"))
    if rc == Recompute.SELECTIVE:
        mods = [str(getattr(m, "value", m)) for m in (lay.recompute_modules or ["core_attn"])]
        out |= {"recompute_granularity": "selective", "recompute_modules": mods}
    elif rc == Recompute.FULL and lay.recompute_layers is not None:
        out |= {"recompute_granularity": "full", "recompute_method": "block",
                "recompute_num_layers": lay.recompute_layers}
    elif rc == Recompute.FULL:
        out |= {"recompute_granularity": "full", "recompute_method": "uniform",
                "recompute_num_layers": lay.recompute_group or 1}
    return out


def parallel_args(job: Job) -> list[list]:
    """Parallelism, sharding, overlap, recompute and batch flags, one list per script line."""
    lay, tr = job.layout, job.problem.training
    tp = ["--tensor-model-parallel-size", lay.tp] + (["--sequence-parallel"] if lay.sp else [])
    pp = ["--pipeline-model-parallel-size", lay.pp] + split_args(job)
    lines = [tp, pp, cp_args(job)]
    if job.problem.model.moe is not None:
        lines.append(["--expert-model-parallel-size", lay.ep,
                      "--expert-tensor-parallel-size", lay.expert_tp])
        lines += moe_args(job)
    if tr.cuda_graphs != "none":
        graphs = CUDA_GRAPH_FLAGS[tr.cuda_graphs]
        if job.problem.model.moe is None and tr.cuda_graphs == "scoped":
            graphs = graphs[:4]  # a dense model has no MoE router or preprocess to capture
        lines.append(list(graphs))
    # the time model overlaps data-parallel communication with compute at every ZeRO stage
    # (cost/time.py `_dp_by_zero`) and sizes the last, exposed bucket as Megatron DDP does
    if lay.zero == 1:
        lines.append(["--use-distributed-optimizer", "--overlap-grad-reduce",
                      "--overlap-param-gather"])
        lines.append(["--ddp-bucket-size", dp_bucket_params(job)])
    elif lay.zero in SHARDING:
        lines.append(["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                      SHARDING[lay.zero], "--ckpt-format", "fsdp_dtensor"])
        lines.append(["--overlap-grad-reduce", "--overlap-param-gather"])
    else:
        lines.append(["--overlap-grad-reduce", "--ddp-bucket-size", dp_bucket_params(job)])
    rc = recompute_settings(job)
    if rc["recompute_granularity"] is not None:
        words = []
        for key, value in rc.items():
            if value is not None:
                words += ["--" + key.replace("_", "-"),
                          *(value if isinstance(value, list) else [value])]
        lines.append(words)
    if lay.offload_layers:
        # layer-level activation offload (TransformerConfig.cpu_offloading_num_layers; the
        # argument parser turns cpu_offloading on when it is > 0)
        lines.append(["--cpu-offloading-num-layers", lay.offload_layers])
    if lay.optimizer_offload:
        # HybridDeviceOptimizer: needs the precision-aware optimizer (arguments.py check)
        lines.append(["--optimizer-cpu-offload", "--optimizer-offload-fraction",
                      f"{lay.optimizer_offload:g}", "--use-precision-aware-optimizer"])
    lines.append(["--micro-batch-size", lay.micro_batch, "--global-batch-size", tr.global_batch])
    lines.append(["--seq-length", tr.seq_len, "--max-position-embeddings", tr.seq_len])
    return lines


CP_COMM_TYPE = {"ring": "p2p", "a2a": "a2a", "allgather": "all_gather", "a2a+ring": "a2a+p2p"}
"""Context-parallel form -> `--cp-comm-type`. Megatron-LM passes the value unchanged through
`TransformerConfig.cp_comm_type` to Transformer Engine, whose `attn_forward_func_with_cp`
accepts `p2p`, `all_gather`, `a2a`, `a2a+p2p` (Megatron-LM's help text spells the all-gather
`allgather`, which TE rejects); a2a+p2p also needs `--hierarchical-context-parallel-sizes`
(the a2a group first: `create_hierarchical_groups` makes consecutive CP ranks its first level)."""


def cp_args(job: Job) -> list:
    """`--context-parallel-size` and, with cp > 1, the form's flags."""
    lay = job.layout
    words = ["--context-parallel-size", lay.cp]
    if lay.cp > 1:
        words += ["--cp-comm-type", CP_COMM_TYPE[lay.cp_form.value]]
        if lay.cp_a2a:
            words += ["--hierarchical-context-parallel-sizes", lay.cp_a2a, lay.cp // lay.cp_a2a]
    return words


GRAD_FLAG = {"bf16": "--grad-reduce-in-bf16", "fp32": "--accumulate-allreduce-grads-in-fp32"}
"""`training.grad_dtype` -> Megatron-LM flag. With `--bf16`, `validate_args` turns
`accumulate_allreduce_grads_in_fp32` on (fp32 main gradients, 4 bytes per parameter) unless
`--grad-reduce-in-bf16` is given, which turns it off so the main-gradient buffer keeps the bf16
parameter dtype (2 bytes); `get_megatron_ddp_config` passes it on as `grad_reduce_in_fp32`
(Megatron-LM d98e8a64 `megatron/training/arguments.py`, `training.py`)."""


PRECISION_FLAGS: dict[str, list[str]] = {
    "bf16": [], "fp16": [],
    # per-tensor current scaling (the cost model's `fp8` reads each tensor once for its amax)
    "fp8": ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
    "fp8-blockwise": ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"],
    "mxfp8": ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],
    "nvfp4": ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"],
}
"""Megatron-LM flags of each precision recipe (`--fp8-format/--fp8-recipe`,
`--fp4-format/--fp4-recipe`; Transformer Engine recipes, docs/cost-model.md "Precision")."""


def training_args(job: Job) -> list[list]:
    """The job settings of `problem.training` the cost model assumed, as flags: precision,
    gradient dtype (memory ledger: 2 or 4 bytes per gradient), low-precision parameters, TP
    communication overlap and the offloaded modules.
    Every training setting maps to Megatron-LM here, in one place."""
    lay, tr = job.layout, job.problem.training
    words = ["--fp16" if tr.precision == "fp16" else "--bf16", GRAD_FLAG[tr.grad_dtype]]
    words += PRECISION_FLAGS[tr.precision]
    if tr.fp8_param_gather and PRECISION_FLAGS[tr.precision]:
        # low-precision weights only, gathered so (DistributedDataParallelConfig.fp8_param_gather;
        # TransformerConfig.fp4_param is `--fp4-param-gather`)
        words.append("--fp4-param-gather" if tr.precision == "nvfp4" else "--fp8-param-gather")
    if lay.zero in SHARDING:  # Megatron-FSDP keeps its own main-gradient dtype
        words += ["--megatron-fsdp-main-grads-dtype", tr.grad_dtype]
    if lay.sp and tr.tp_comm_overlap:
        words.append("--tp-comm-overlap")  # asserts SP (launchers.md §1.1)
    if tr.offload_modules != "none":  # Megatron-LM arguments.py: store_true, nargs='*'
        words += ["--fine-grained-activation-offloading", "--offload-modules",
                  *tr.offload_modules.split("+")]
    return [words]


def vocab_divisor(vocab: int, tp: int) -> int | None:
    """`--make-vocab-size-divisible-by` that leaves the model's vocabulary unpadded: Megatron
    pads to a multiple of (this x TP) (`vocab_size_with_padding`); the largest power of two up to
    Megatron's default 128 that keeps `vocab` whole. None when TP does not divide `vocab`."""
    if vocab % tp:
        return None
    d = 128
    while (vocab // tp) % d:
        d //= 2
    return d


def _number(x: float) -> int | float:
    """An integral float as an int (Megatron's `--rotary-base` is `type=int`)."""
    return int(x) if float(x).is_integer() else x


def yarn_args(m) -> list:
    """YaRN beyond `--position-embedding-type yarn`: the factor (`--rotary-scaling-factor`) and
    DeepSeek's two terms (`--mscale`, `--mscale-all-dim`; Megatron-LM's defaults 1 and 0 give the
    concentration of neither being given, argument_utils `_apply_yarn_config_from_args`); an MLA
    model takes them with `--rope-type yarn` (Megatron-LM's mla group). The original context
    (4096) and betas (32, 1) are Megatron-LM's defaults, gpt-oss's and DeepSeek-V3's published
    values. [] without YaRN."""
    y = m.yarn
    if y is None:
        return []
    out = (["--rope-type", "yarn"] if m.mla is not None else []) + [
        "--rotary-scaling-factor", _number(y.factor)]
    if y.mscale is not None and y.mscale_all_dim is not None:
        out += ["--mscale", y.mscale, "--mscale-all-dim", y.mscale_all_dim]
    return out


def window_pattern(m) -> str:
    """Which layers use the sliding window: `all`, `alternate` (half of them: every family that
    has half alternates, gpt-oss and Gemma-2, the first layer windowed) or `last` (any other
    count: Qwen2's `max_window_layers`, the window from that layer on)."""
    n, L = m.sliding_layers, m.n_layers
    return "all" if n == L else "alternate" if 2 * n == L else "last"


def window_args(m) -> list:
    """Sliding-window attention as Megatron-LM takes it: `--window-size W-1,0` (Transformer
    Engine's (left, right) window, the key itself counted: Megatron-Bridge's GPT-OSS provider sets
    `(sliding_window - 1, 0)`) and, where only some layers use it (`window_pattern`),
    `--window-attn-skip-freq`: 2 for the alternation (Megatron-Core `is_layer_window_attention`:
    layer_number % 2 != 0 is windowed), else a list with the window on the last layers.
    [] without a window."""
    if not m.sliding_window:
        return []
    out = ["--window-size", f"{m.sliding_window - 1},0"]
    n, L, pattern = m.sliding_layers, m.n_layers, window_pattern(m)
    if pattern == "all":
        return out
    if pattern == "alternate":
        return out + ["--window-attn-skip-freq", 2]
    return out + ["--window-attn-skip-freq", f"([0]*{L - n}+[1]*{n})"]


def moe_layer_freq(m) -> str | None:
    """`--moe-layer-freq` as a per-layer list expression (1 = MoE; Megatron-LM `moe_freq_type`
    evaluates it and needs one entry per layer): the leading dense layers (DeepSeek
    `first_k_dense_replace`), then every `layer_step`-th layer MoE, the last of each group
    (Llama-4 `interleave_moe_layer_step`: layer_idx + 1 divisible by the step; `cost.arch`
    places them alike), dense layers left over at the end; None when every layer is MoE."""
    lead, step, L = m.moe.n_dense_layers, m.moe.layer_step, m.n_layers
    if not lead and step == 1:
        return None
    groups, rest = divmod(L - lead, step)
    parts = [f"[0]*{lead}"] if lead else []
    parts.append(f"[1]*{groups}" if step == 1 else f"([0]*{step - 1}+[1])*{groups}")
    if rest:
        parts.append(f"[0]*{rest}")
    return "(" + "+".join(parts) + ")"


def model_args(job: Job) -> list[list]:
    """The model definition, one list per script line: shapes, attention (GQA or MLA),
    normalization, position embedding and rotary base, biases, MLP type, embeddings, vocabulary
    padding, MoE (launchers.md §1; Megatron-LM `TransformerConfig` flags)."""
    m = job.problem.model
    lines = [["--num-layers", m.n_layers, "--hidden-size", m.hidden_size,
              "--ffn-hidden-size", m.ffn_hidden_size]]
    attn = ["--num-attention-heads", m.n_heads]
    if m.mla is not None:
        attn += ["--multi-latent-attention", "--q-lora-rank", m.mla.q_lora_rank,
                 "--kv-lora-rank", m.mla.kv_lora_rank]
        lines.append(attn)
        attn = ["--qk-head-dim", m.mla.qk_nope_head_dim, "--qk-pos-emb-head-dim",
                m.mla.qk_rope_head_dim, "--v-head-dim", m.mla.v_head_dim]
    else:
        if m.kv_heads < m.n_heads:
            attn += ["--group-query-attention", "--num-query-groups", m.kv_heads]
        if m.head_dim is not None and m.head_dim != m.hidden_size // m.n_heads:
            attn += ["--kv-channels", m.head_dim]
    lines.append(attn)
    arch = architecture(job)
    kind = ["--normalization", "RMSNorm" if m.layers is not None else arch.norm]
    if arch.rope_theta is not None:
        pe = "yarn" if m.yarn is not None and m.mla is None else "rope"
        kind += ["--position-embedding-type", pe, "--rotary-base", _number(arch.rope_theta)]
    elif m.layers is not None:  # Nemotron-H: no position embedding (--position-embedding-type none)
        kind += ["--position-embedding-type", "none"]
    else:
        kind += ["--position-embedding-type", "learned_absolute"]
    if not arch.bias:
        kind.append("--disable-bias-linear")
    lines.append(kind)
    lines += [extra for extra in (yarn_args(m), window_args(m)) if extra]
    misc = ["--swiglu"] if arch.gated else []
    if not m.tied_embeddings:
        misc.append("--untie-embeddings-and-output-weights")
    if not m.dropout:
        misc += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    lines.append(misc)
    divisor = vocab_divisor(m.vocab_size, job.layout.tp)
    if divisor is not None:
        lines.append(["--make-vocab-size-divisible-by", divisor])
    lines += hybrid_args(m)
    if m.moe is not None:
        moe = ["--num-experts", m.moe.n_experts, "--moe-router-topk", m.moe.top_k,
               "--moe-ffn-hidden-size", m.moe.expert_ffn_hidden_size]
        if m.moe.latent_size:
            moe += ["--moe-latent-size", m.moe.latent_size]
        if m.moe.n_shared_experts:
            moe += ["--moe-shared-expert-intermediate-size",
                    m.moe.shared_ffn_total]
        freq = moe_layer_freq(m)
        if freq:
            moe += ["--moe-layer-freq", freq]
        lines.append(moe)
    return lines


def environment(job: Job) -> list[str]:
    """`export`/`unset` lines Megatron needs (launchers.md §1.1 Environment, §7 item 14)."""
    lay = job.layout
    if lay.zero in SHARDING:
        return ["# Megatron-FSDP needs CUDA_DEVICE_MAX_CONNECTIONS not to be 1",
                "unset CUDA_DEVICE_MAX_CONNECTIONS"]
    if lay.tp > 1 or lay.cp > 1:
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    return []


def notes(job: Job) -> list[str]:
    """Comment lines that explain the mapping and what the user must still add."""
    lay, m, arch = job.layout, job.problem.model, architecture(job)
    zero = {0: "ZeRO-0: plain data parallelism (no sharding)",
            1: "ZeRO-1: Megatron's distributed optimizer (optimizer state sharded over DP x CP)",
            2: "ZeRO-2: Megatron-FSDP, sharding strategy optim_grads",
            3: "ZeRO-3: Megatron-FSDP, sharding strategy optim_grads_params"}[lay.zero]
    lines = [
        f"Megatron-LM derives DP = {job.n_gpus} / (TP {lay.tp} x PP {lay.pp} x CP {lay.cp}) = "
        f"{lay.dp} and {job.micro_batches} micro-batches per step itself.",
        zero + ".",
        f"Gradients in {job.problem.training.grad_dtype} as planned "
        f"({GRAD_FLAG[job.problem.training.grad_dtype]}).",
    ]
    if arch.rope_theta is not None and arch.rope_assumed:
        lines.append(f"The model spec gives no rope_theta: rotary base {_number(arch.rope_theta)} "
                     "(Megatron's default) is written; set rope_theta in the spec if it differs.")
    if vocab_divisor(m.vocab_size, lay.tp) is None:
        lines.append(f"Megatron pads the vocabulary {m.vocab_size} to a multiple of 128 x TP; "
                     "the plan counted it unpadded.")
    if m.sliding_window and window_pattern(m) == "last":
        lines.append(f"The spec says {m.sliding_layers} of {m.n_layers} layers use the "
                     f"{m.sliding_window}-token window, not which: the last ones are written "
                     "(Qwen2's max_window_layers); edit --window-attn-skip-freq if they differ.")
    # gpt-oss, the one model with YaRN and biased linears; its sinks and clamped GLU are not
    # ModelSpec fields, so this is the only way to know them
    if m.yarn is not None and m.linear_bias:
        lines.append("Megatron-LM's arguments have no attention sinks (softmax_type learnable) "
                     "and no clamped, offset GLU (activation_func_clamp_value, glu_linear_offset): "
                     "this script builds gpt-oss's shapes, not those; --target megatron-bridge "
                     "builds the model itself.")
    return lines + [
        "Not written here: data, tokenizer (its vocabulary should be "
        f"{m.vocab_size}), optimizer and schedule; append those Megatron-LM arguments after "
        "this script's name (they reach \"$@\").",
    ]


HYBRID_SCRIPT = "pretrain_mamba.py"
"""Megatron-LM's entry point for hybrid (Mamba) models (it builds `MambaModel` with
`mamba_stack_spec`)."""


def hybrid_args(m) -> list[list]:
    """A hybrid model's flags (Megatron-LM `pretrain_mamba.py`; the names of Megatron-LM's
    arguments and of the Nemotron-3 launch scripts): the pattern `--hybrid-override-pattern`,
    `--mamba-num-heads`, `--mamba-head-dim`, `--mamba-state-dim`, `--mamba-num-groups`, the stack
    spec, `--squared-relu` for a relu2 MLP and no position embedding without RoPE."""
    if m.layers is None:
        return []
    lines = [["--hybrid-override-pattern", "".join(m.layer_letters)]]
    if m.mamba is not None:
        lines.append(["--mamba-num-heads", m.mamba.n_heads, "--mamba-head-dim", m.mamba.head_dim,
                      "--mamba-state-dim", m.mamba.state_size,
                      "--mamba-num-groups", m.mamba.n_groups])
    lines.append(["--spec", "megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"])
    if m.activation == "relu2":
        lines.append(["--squared-relu"])
    return lines


def command_lines(job: Job, launcher: list[list]) -> list[str]:
    """Launcher lines, then `pretrain_gpt.py` (`pretrain_mamba.py` for a hybrid model) and every
    flag, as continued bash lines ending in "$@" (the user's further arguments)."""
    script = SCRIPT if job.problem.model.layers is None else HYBRID_SCRIPT
    words = (launcher[:-1] + [launcher[-1] + [script]] + parallel_args(job) + training_args(job)
             + model_args(job))
    lines = [shell_line(words[0])] + ["  " + shell_line(w) for w in words[1:]] + ['  "$@"']
    return [line + " \\" for line in lines[:-1]] + [lines[-1]]


def torchrun_words(job: Job) -> list[list]:
    """torchrun arguments (two lines) for this job run by hand on each node (launchers.md §1.2,
    §6.1): `--standalone` on one node, a c10d rendezvous on the first node otherwise."""
    if job.n_nodes == 1:
        return [["torchrun", "--standalone", "--nnodes", 1, "--nproc-per-node", job.gpus_per_node]]
    return [["torchrun", "--nnodes", job.n_nodes, "--nproc-per-node", job.gpus_per_node,
             "--rdzv-id", Raw('"${JOB_ID:-autoparallel}"'), "--rdzv-backend", "c10d"],
            ["--rdzv-endpoint", Raw(f'"${{HEAD_NODE:?set HEAD_NODE to the first node}}:{RDZV_PORT}"')]]


def megatron_limits(job: Job) -> list[str]:
    """What Megatron-LM cannot run among layouts that pass autoparallel's hard rules."""
    lay, reasons = job.layout, []
    m = job.problem.model
    if m.layers is not None and "G" in m.layer_letters:
        reasons.append("Megatron-LM 0.16's hybrid pattern has no gated DeltaNet letter (M, *, -, "
                       "E only); Qwen3-Next trains through Megatron-Bridge's GPT model")
    if m.layers is not None and lay.stage_layers and len(set(lay.stage_layers[1:-1])) > 1:
        # MambaStack reads only the first and last stage's counts and shares the rest evenly
        # (Megatron-Core 0.16.1 ssm/mamba_block.py `_select_layers_for_pipeline_parallel`)
        reasons.append("middle pipeline stages of unequal size on a hybrid pattern: "
                       "pretrain_mamba.py takes the first and last stage's layers "
                       "(--decoder-first/last-pipeline-num-layers) and shares the rest evenly")
    if lay.zero in SHARDING and lay.vp > 1:
        reasons.append(
            f"ZeRO-{lay.zero} maps to Megatron-FSDP, which does not take several model chunks "
            f"per pipeline rank (vp = {lay.vp}; docs/export.md, megatron row): use zero 0/1 or vp = 1")
    if job.problem.model.moe is not None and lay.tp > 1 and not lay.sp:
        reasons.append(
            f"an MoE model with tp = {lay.tp} and no sequence parallelism: Megatron-Core's "
            "MoELayer refuses to train it (moe_layer.py: 'MoE and tensor parallelism ... without "
            "also enabling sequence parallelism' raises ValueError); use sp on")
    if lay.zero in SHARDING and job.problem.model.moe is not None:
        reasons.append(
            f"ZeRO-{lay.zero} maps to Megatron-FSDP, which does not take MoE models "
            "(docs/export.md, megatron row): use zero 0/1")
    mla = job.problem.model.mla
    if mla is not None and mla.q_lora_rank == 0:
        reasons.append(
            "MLA without query compression (q_lora_rank = 0): Megatron-Core spells that "
            "q_lora_rank None, --q-lora-rank can only give a rank, and leaving it out keeps "
            "the MLA config default of 512 (megatron-core 0.16.1 transformer_config.py), "
            "which builds a different model")
    if lay.offload_layers and (lay.pp > 1 or lay.recompute != "none"):
        reasons.append(
            f"activation offload of {lay.offload_layers} layers with pp = {lay.pp}, recompute "
            f"{Recompute(lay.recompute).value}: Megatron-Core's layer offload runs only without "
            "pipeline parallelism and without recompute (TransformerConfig checks)")
    tr = job.problem.training
    if m.moe is not None and tr.moe_routing == "capacity" and tr.moe_dispatcher == "deepep":
        reasons.append(
            "capacity routing padded to capacity with the DeepEP dispatcher: Megatron-Core's flex "
            "dispatcher with deepep does not support moe_pad_expert_input_to_capacity "
            "(TransformerConfig check); use --moe-dispatcher alltoall or hybridep")
    if lay.offload_layers and tr.offload_modules != "none":
        reasons.append(
            f"activation offload of {lay.offload_layers} layers with offloaded modules "
            f"{tr.offload_modules}: Megatron-Core runs one of the two "
            "(TransformerConfig: 'fine_grained_activation_offloading cannot be enabled with "
            "cpu_offloading'); drop --offload-layers or --offload-modules")
    if lay.offload_layers and lay.offload_layers >= job.problem.model.n_layers:
        reasons.append(
            f"activation offload of {lay.offload_layers} layers: Megatron-Core offloads fewer "
            f"than the model's {job.problem.model.n_layers} layers")
    if lay.optimizer_offload and lay.zero != 1:
        reasons.append(
            f"optimizer offload with ZeRO-{lay.zero}: Megatron's CPU optimizer needs "
            "--use-precision-aware-optimizer, which runs only with the distributed optimizer "
            "(zero 1)")
    return reasons


MEGATRON_IGNORES = ("mb", "dp", "cp", "cc", "cu", "ep", "etp")
"""Columns `megatron_limits` and the base reasons do not read: Megatron-LM writes every data,
context-parallel (form and group) and expert degree the hard rules allow."""


class MegatronExporter(Exporter):
    """Megatron-LM `pretrain_gpt.py` under torchrun, one script run on every node."""

    name = "megatron"
    trains_hybrid = True
    ignores = MEGATRON_IGNORES
    suffix = ".sh"
    uneven_splits = True
    partial_recompute = True
    named_recompute = activation_offload = module_offload = optimizer_offload = True
    summary = "bash script: torchrun ... pretrain_gpt.py with Megatron-LM flags"

    def limits(self, job: Job) -> list[str]:
        return megatron_limits(job)

    def text(self, job: Job) -> str:
        where = (f"Run this script on each of the {job.n_nodes} nodes with HEAD_NODE set to the "
                 "first node's address (or export with --target slurm)." if job.n_nodes > 1
                 else "Single node: run this script once.")
        head = ["#!/usr/bin/env bash"] + comments(job.header + notes(job) + [where])
        body = ["set -euo pipefail"] + environment(job)
        return "\n".join(head + body + command_lines(job, torchrun_words(job))) + "\n"
