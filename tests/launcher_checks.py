"""Independent readers of the exported files, written from the launcher reference (launchers.md,
section numbers below), not from the exporters: each parses a file the way its launcher would and
applies the launcher's own checks, then says which layout the launcher would run.

`*_layout(...)` return a dict with the layout axes (dp, tp, pp, vp, cp, ep, etp, zero, recompute, sp,
micro_batch) plus `micro_batches` (per step per replica) and `world` (GPUs the launch starts),
or raise `LaunchRejected` with the check that failed.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import tomllib

import yaml


class LaunchRejected(AssertionError):
    """The launcher would refuse this file."""


def _need(cond: bool, why: str) -> None:
    if not cond:
        raise LaunchRejected(why)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # unknown flag or bad value: the launcher would stop
        raise LaunchRejected(f"{self.prog}: {message}")


# --------------------------------------------------------------------------- shell scripts

def split_script(text: str, program: str = "pretrain_gpt.py"):
    """(environment changes, launcher words before `program`, words after it) of a bash script
    whose command continues over lines ending in a backslash."""
    env: dict[str, str | None] = {}
    joined, pending = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    command = None
    for line in joined:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            key, value = stripped[len("export "):].split("=", 1)
            env[key] = value
        elif stripped.startswith("unset "):
            env[stripped.split()[1]] = None
        elif program in stripped:
            _need(command is None, "two launch commands")
            command = shlex.split(stripped)
    _need(command is not None, f"no command running {program}")
    i = command.index(program)
    after = command[i + 1:]
    _need(after[-1:] == ["$@"], 'the command should end with "$@" for the user\'s arguments')
    return env, command[:i], after[:-1]


def torchrun_args(words: list[str]) -> argparse.Namespace:
    """torchrun's flags (launchers.md §6.1, `torch/distributed/run.py`)."""
    _need(words and words[0] == "torchrun", f"not a torchrun command: {words[:1]}")
    p = _Parser(prog="torchrun", allow_abbrev=False)
    p.add_argument("--nnodes", default="1:1")
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    p.add_argument("--rdzv-backend", "--rdzv_backend", default="static")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default="")
    p.add_argument("--rdzv-id", "--rdzv_id", default="none")
    p.add_argument("--standalone", action="store_true")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0)
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1")
    p.add_argument("--master-port", "--master_port", type=int, default=29500)
    args = p.parse_args(words[1:])
    _need(args.nnodes.isdigit() and args.nproc_per_node.isdigit(), "fixed node/process counts")
    if int(args.nnodes) > 1:
        _need(args.rdzv_backend == "c10d" and ":" in args.rdzv_endpoint,
              "multi-node runs need a c10d rendezvous host:port (launchers.md §6.1)")
    return args


def megatron_parser() -> _Parser:
    """Megatron-LM's flags used for a layout (launchers.md §1.1-§1.2; MoE/MLA shape flags as
    Megatron-LM's arguments.py spells them)."""
    p = _Parser(prog="pretrain_gpt.py", allow_abbrev=False)
    a = p.add_argument
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--sequence-parallel", action="store_true")
    a("--tp-comm-overlap", action="store_true")  # launchers.md §1.1: asserts SP
    a("--pipeline-model-parallel-size", type=int, default=1)
    vp = p.add_mutually_exclusive_group()
    vp.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    vp.add_argument("--num-virtual-stages-per-pipeline-rank", type=int, default=None)
    vp.add_argument("--pipeline-model-parallel-layout", default=None)
    a("--decoder-first-pipeline-num-layers", type=int, default=None)
    a("--decoder-last-pipeline-num-layers", type=int, default=None)
    # TransformerConfig booleans, store_true flags (Megatron-LM argument_utils.py)
    a("--account-for-embedding-in-pipeline-split", action="store_true")
    a("--account-for-loss-in-pipeline-split", action="store_true")
    a("--context-parallel-size", type=int, default=1)
    a("--cp-comm-type", nargs="+", default=["p2p"])
    a("--hierarchical-context-parallel-sizes", nargs="+", type=int, default=None)
    a("--expert-model-parallel-size", type=int, default=1)
    a("--expert-tensor-parallel-size", type=int, default=None)
    a("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"], default="allgather")
    # MoE settings (Megatron-LM arguments.py; TransformerConfig fields of the same names)
    a("--moe-flex-dispatcher-backend", choices=["deepep", "hybridep"], default="deepep")
    a("--overlap-moe-expert-parallel-comm", action="store_true")
    a("--delay-wgrad-compute", action="store_true")
    a("--moe-router-force-load-balancing", action="store_true")
    a("--moe-expert-capacity-factor", type=float, default=None)
    a("--moe-pad-expert-input-to-capacity", action="store_true")
    a("--cuda-graph-impl", choices=["none", "local", "transformer_engine"], default="none")
    a("--cuda-graph-scope", nargs="*", default=None)
    a("--use-distributed-optimizer", action="store_true")
    a("--overlap-grad-reduce", action="store_true")
    a("--overlap-param-gather", action="store_true")
    a("--use-megatron-fsdp", action="store_true")
    a("--data-parallel-sharding-strategy", default="optim_grads_params",
      choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    a("--ckpt-format", default="torch_dist")
    a("--recompute-granularity", choices=["full", "selective"], default=None)
    a("--recompute-method", choices=["uniform", "block"], default=None)
    a("--recompute-num-layers", type=int, default=None)
    a("--recompute-modules", nargs="*", default=None)
    # offload (Megatron-LM d98e8a6 arguments.py / TransformerConfig)
    a("--cpu-offloading-num-layers", type=int, default=0)
    a("--optimizer-cpu-offload", action="store_true")
    a("--optimizer-offload-fraction", type=float, default=1.0)
    a("--fine-grained-activation-offloading", action="store_true")
    a("--offload-modules", nargs="*", default=[])
    a("--use-precision-aware-optimizer", action="store_true")
    a("--micro-batch-size", type=int, required=True)
    a("--global-batch-size", type=int, default=None)
    a("--seq-length", type=int, required=True)
    a("--max-position-embeddings", type=int, default=None)
    prec = p.add_mutually_exclusive_group()
    prec.add_argument("--bf16", action="store_true")
    prec.add_argument("--fp16", action="store_true")
    a("--fp8-format", choices=["e4m3", "hybrid"], default=None)
    a("--fp8-recipe", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"],
      default="delayed")
    a("--fp4-format", choices=["e2m1"], default=None)
    a("--fp4-recipe", choices=["nvfp4", "custom"], default="nvfp4")
    a("--fp8-param-gather", action="store_true")
    a("--fp4-param-gather", action="store_true", dest="fp4_param")
    a("--num-layers", type=int, required=True)
    a("--hidden-size", type=int, required=True)
    a("--ffn-hidden-size", type=int, default=None)
    a("--num-attention-heads", type=int, required=True)
    a("--group-query-attention", action="store_true")
    a("--num-query-groups", type=int, default=1)
    a("--kv-channels", type=int, default=None)
    a("--swiglu", action="store_true")
    a("--untie-embeddings-and-output-weights", action="store_true")
    a("--attention-dropout", type=float, default=0.1)
    a("--hidden-dropout", type=float, default=0.1)
    a("--num-experts", type=int, default=None)
    a("--moe-router-topk", type=int, default=2)
    a("--moe-ffn-hidden-size", type=int, default=None)
    a("--moe-shared-expert-intermediate-size", type=int, default=None)
    a("--moe-layer-freq", default="1")
    # model definition (TransformerConfig fields; Megatron-LM d98e8a64 arguments.py)
    a("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm")
    a("--position-embedding-type", default="learned_absolute",
      choices=["learned_absolute", "rope", "yarn", "mrope", "relative", "none"])
    a("--rotary-base", type=int, default=10000)
    a("--rotary-scaling-factor", type=float, default=1.0)
    a("--rope-type", choices=["rope", "yarn"], default=None)
    a("--mscale", type=float, default=1.0)
    a("--mscale-all-dim", type=float, default=0.0)
    a("--window-size", type=lambda x: tuple(int(i) for i in x.strip("()").split(",")),
      default=None)
    a("--window-attn-skip-freq", default=None)
    a("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    a("--make-vocab-size-divisible-by", type=int, default=128)
    # gradient dtype and data-parallel buckets (mixed precision / distributed groups)
    a("--grad-reduce-in-bf16", action="store_true")
    a("--accumulate-allreduce-grads-in-fp32", action="store_true")
    a("--megatron-fsdp-main-grads-dtype", choices=["fp32", "bf16", "fp16", "auto"],
      default="auto")
    a("--ddp-bucket-size", type=int, default=None)
    a("--multi-latent-attention", action="store_true")
    a("--q-lora-rank", type=int, default=None)
    a("--kv-lora-rank", type=int, default=None)
    a("--qk-head-dim", type=int, default=None)
    a("--qk-pos-emb-head-dim", type=int, default=None)
    a("--v-head-dim", type=int, default=None)
    return p


def megatron_layout(words: list[str], world: int, env: dict) -> dict:
    """Parse Megatron-LM arguments and apply its checks (launchers.md §1.3, §7)."""
    g = megatron_parser().parse_args(words)
    tp, pp, cp, ep = (g.tensor_model_parallel_size, g.pipeline_model_parallel_size,
                      g.context_parallel_size, g.expert_model_parallel_size)
    _need(world % (tp * pp * cp) == 0, "world % (TP*PP*CP) != 0")
    dp = world // (tp * pp * cp)
    heads = g.num_attention_heads
    groups = g.num_query_groups if g.group_query_attention else heads
    _need(heads % tp == 0, "num_attention_heads % TP != 0")
    _need(groups % tp == 0 or tp % groups == 0, "num_query_groups vs TP")
    _need(not g.sequence_parallel or tp > 1, "SP with TP = 1 is silently dropped")
    _need(not g.tp_comm_overlap or g.sequence_parallel, "--tp-comm-overlap asserts SP (§1.1)")
    if cp > 1:
        _need(g.seq_length % (2 * cp) == 0, "seq_length % (2*CP) != 0")
    # context-parallel form: one --cp-comm-type for every layer, passed unchanged to Transformer
    # Engine's attn_forward_func_with_cp (p2p, all_gather, a2a, a2a+p2p); a2a+p2p needs the
    # hierarchical sizes, whose product is CP (Megatron-LM validate_args)
    _need(len(g.cp_comm_type) == 1 or len(g.cp_comm_type) == g.num_layers,
          "--cp-comm-type: one value or one per layer")
    comm = g.cp_comm_type[0]
    _need(comm in ("p2p", "all_gather", "a2a", "a2a+p2p"),
          f"Transformer Engine: unsupported cp_comm_type {comm!r}")
    hier = g.hierarchical_context_parallel_sizes
    if hier:
        _need(math.prod(hier) == cp, "prod(hierarchical-context-parallel-sizes) != CP")
    if comm == "a2a+p2p":
        _need(hier is not None and len(hier) == 2, "a2a+p2p needs two hierarchical CP sizes")
    a2a = {"a2a": cp, "a2a+p2p": hier[0] if hier else 1}.get(comm, 1)
    if cp > 1 and a2a > 1:  # TE: "requires num_heads % cp_size == 0 for Q, K, V"
        _need((heads // tp) % a2a == 0, "query heads per TP rank % a2a group != 0")
        _need(max(groups // tp, 1) % a2a == 0, "KV heads per TP rank % a2a group != 0")
    cp_comm = {"p2p": "ring", "all_gather": "allgather", "a2a": "a2a",
               "a2a+p2p": "a2a+ring"}[comm] if cp > 1 else None
    layers = g.num_layers
    first, last = g.decoder_first_pipeline_num_layers, g.decoder_last_pipeline_num_layers
    emb, loss = g.account_for_embedding_in_pipeline_split, g.account_for_loss_in_pipeline_split
    split = None
    if g.pipeline_model_parallel_layout is not None:
        _need(first is None and last is None and not emb and not loss,
              "pipeline_model_parallel_layout cannot be set with other pipeline layout arguments")
        split, vp_layout = pipeline_layout_split(g.pipeline_model_parallel_layout, pp, layers)
    elif emb or loss:  # TransformerConfig.__post_init__ / get_num_layers_to_build
        _need(first is None and last is None,
              "first/last pipeline-stage layers cannot be set with the embedding/loss accounting")
        total = layers + emb + loss
        _need(total % pp == 0, "num_layers (+ embedding, + loss) % PP != 0")
        per_rank = total // pp
        chunks = g.num_virtual_stages_per_pipeline_rank or 1
        if g.num_layers_per_virtual_pipeline_stage:
            _need(per_rank % g.num_layers_per_virtual_pipeline_stage == 0,
                  "layers per rank % layers per virtual stage != 0")
            chunks = per_rank // g.num_layers_per_virtual_pipeline_stage
        _need(per_rank % chunks == 0, "layers per rank (after the accounting) % VP != 0")
        _need(per_rank // chunks - max(emb, loss) >= 0, "not enough layers in an end chunk")
        split = [per_rank - emb] + [per_rank] * (pp - 2) + [per_rank - loss]
    elif first is None and last is None:
        _need(layers % pp == 0, "num_layers % PP != 0")
    else:  # uneven split (Megatron validate_args): the middle stages share the rest evenly
        _need(pp > 1, "first/last pipeline-stage layers need PP > 1")
        _need(not g.num_layers_per_virtual_pipeline_stage,
              "uneven PP takes --num-virtual-stages-per-pipeline-rank, not layers per stage")
        middle = layers - (first or 0) - (last or 0)
        middle_ranks = pp - (first is not None) - (last is not None)
        _need(middle >= 0 and (middle_ranks == 0 and middle == 0
                               or middle_ranks > 0 and middle % middle_ranks == 0),
              "layers left for the middle stages not divisible by their count")
        chunks = g.num_virtual_stages_per_pipeline_rank or 1
        counts = [c for c in (first, last, middle // middle_ranks if middle_ranks else None)
                  if c is not None]
        _need(all(c % chunks == 0 for c in counts), "a stage's layers % virtual stages != 0")
        mid = middle // middle_ranks if middle_ranks else None
        split = [first if first is not None else mid] + [mid] * (pp - 2) + [
            last if last is not None else mid]
    vp = 1
    if g.pipeline_model_parallel_layout is not None:
        _need(not g.num_layers_per_virtual_pipeline_stage and not g.num_virtual_stages_per_pipeline_rank,
              "no more than one of layers-per-virtual-stage, virtual-stages-per-rank, layout")
        vp = vp_layout
    elif g.num_layers_per_virtual_pipeline_stage and (emb or loss):
        vp = (layers + emb + loss) // pp // g.num_layers_per_virtual_pipeline_stage
    elif g.num_layers_per_virtual_pipeline_stage:
        _need((layers // pp) % g.num_layers_per_virtual_pipeline_stage == 0,
              "(num_layers/PP) % layers-per-virtual-stage != 0")
        vp = layers // pp // g.num_layers_per_virtual_pipeline_stage
    elif g.num_virtual_stages_per_pipeline_rank:
        vp = g.num_virtual_stages_per_pipeline_rank
    _need(vp == 1 or pp > 1, "VP needs PP > 1")
    mbs = g.micro_batch_size
    gbs = g.global_batch_size or mbs * dp
    _need(gbs % (mbs * dp) == 0, "GBS % (MBS*DP) != 0")
    m = gbs // (mbs * dp)
    if vp > 1:
        _need(m >= pp and m % pp == 0, "interleaved schedule needs M >= PP and M % PP == 0")
    if g.overlap_param_gather:
        _need((g.use_distributed_optimizer or g.use_megatron_fsdp) and g.overlap_grad_reduce,
              "--overlap-param-gather needs dist-opt/FSDP and --overlap-grad-reduce")
    if g.recompute_granularity == "full":
        _need(g.recompute_method and g.recompute_num_layers, "full recompute needs method+layers")
        _need(g.recompute_num_layers <= layers // pp, "recompute-num-layers > layers per stage")
    else:
        _need(g.recompute_method is None and g.recompute_num_layers is None,
              "method/num-layers only with full recompute")
    if g.cpu_offloading_num_layers > 0:  # TransformerConfig.__post_init__
        _need(g.cpu_offloading_num_layers < layers, "cpu-offloading-num-layers >= num_layers")
        _need(pp == 1, "CPU offloading with pipeline parallelism")
        _need(g.recompute_granularity is None, "CPU offloading with activation recomputation")
    if g.moe_pad_expert_input_to_capacity:  # TransformerConfig.__post_init__
        _need(g.moe_expert_capacity_factor is not None,
              "moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor")
        _need(not (g.moe_token_dispatcher_type == "flex"
                   and g.moe_flex_dispatcher_backend == "deepep"),
              "flex/deepep does not support moe_pad_expert_input_to_capacity")
    if g.delay_wgrad_compute:
        _need(g.overlap_moe_expert_parallel_comm, "delay_wgrad_compute without the EP overlap")
    if g.overlap_moe_expert_parallel_comm:
        _need(g.moe_token_dispatcher_type in ("alltoall", "flex"),
              "EP overlap needs the alltoall or flex dispatcher")
    if g.cuda_graph_impl == "transformer_engine":
        _need(set(g.cuda_graph_scope or []) <= {"attn", "mlp", "moe", "moe_router",
                                                  "moe_preprocess", "mamba"},
              "unknown Transformer Engine CUDA graph scope")
    if g.cuda_graph_impl == "local":
        _need((g.cuda_graph_scope or []) in ([], ["full_iteration"]), "unknown local graph scope")
    if g.fine_grained_activation_offloading:  # TransformerConfig.__post_init__
        _need(g.cpu_offloading_num_layers == 0, "fine-grained offload with cpu_offloading")
        _need(len(g.offload_modules) > 0, "fine-grained offload without offload_modules")
        _need(set(g.offload_modules) <= {"attn_norm", "qkv_linear", "core_attn", "attn_proj",
                                         "mlp_norm", "expert_fc1", "moe_act"},
              "unknown offload_modules")
    if g.optimizer_cpu_offload:  # arguments.py validate_args
        _need(g.use_precision_aware_optimizer,
              "--optimizer-cpu-offload needs --use-precision-aware-optimizer")
        _need(0.0 <= g.optimizer_offload_fraction <= 1.0, "optimizer-offload-fraction not in [0, 1]")
    # arguments.py: expert_tensor_parallel_size defaults to TP; parallel_state builds the expert
    # grid (etp, ep, edp, pp) over the world, world % (etp * ep * pp) == 0
    etp = g.expert_tensor_parallel_size or tp
    _need(world % (etp * ep * pp) == 0, "world % (ETP*EP*PP) != 0")
    if ep > 1:
        _need(g.num_experts is not None and g.num_experts % ep == 0, "num_experts % EP != 0")
    _need(g.max_position_embeddings is None or g.max_position_embeddings >= g.seq_length,
          "max-position-embeddings < seq-length")
    _need(g.bf16 or g.fp16, "16-bit parameters (--bf16 or --fp16)")
    # TransformerConfig.__post_init__: "fp8_param must be used together with fp8 mode", the
    # same for fp4_param
    _need(not g.fp8_param_gather or g.fp8_format, "--fp8-param-gather without --fp8-format")
    _need(not g.fp4_param or g.fp4_format, "--fp4-param-gather without --fp4-format")
    if g.fp4_format:
        precision = "nvfp4"
    elif g.fp8_format:
        precision = {"tensorwise": "fp8", "delayed": "fp8", "blockwise": "fp8-blockwise",
                     "mxfp8": "mxfp8"}[g.fp8_recipe]
    else:
        precision = "fp16" if g.fp16 else "bf16"
    if g.use_megatron_fsdp:
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2,
                "optim_grads_params": 3}[g.data_parallel_sharding_strategy]
        _need(env.get("CUDA_DEVICE_MAX_CONNECTIONS", None) != "1",
              "FSDP needs CUDA_DEVICE_MAX_CONNECTIONS != 1")
    else:
        zero = 1 if g.use_distributed_optimizer else 0
        if tp > 1 or cp > 1:
            _need(env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1",
                  "TP/CP on Hopper asserts CUDA_DEVICE_MAX_CONNECTIONS=1")
    # validate_args: with --bf16, fp32 main grads unless --grad-reduce-in-bf16; Megatron-FSDP's
    # `auto` main-grad dtype is the bf16 parameter dtype
    # (--grad-reduce-in-bf16 wins over --accumulate-allreduce-grads-in-fp32 there)
    grad = "bf16" if g.grad_reduce_in_bf16 else "fp32"
    if g.use_megatron_fsdp:
        grad = {"auto": "bf16"}.get(g.megatron_fsdp_main_grads_dtype,
                                    g.megatron_fsdp_main_grads_dtype)
    rc = g.recompute_granularity or "none"
    if split is not None and pp > 1 and len(set(split)) == 1:
        split = None  # an even split
    return dict(grad_dtype=grad, precision=precision,
                fp8_param_gather=bool(g.fp8_param_gather or g.fp4_param),
                dp=dp, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=etp,
                cp_comm=cp_comm, cp_a2a=hier[0] if cp_comm == "a2a+ring" else None,
                zero=zero, recompute=rc, stage_layers=split,
                sp=bool(g.sequence_parallel and tp > 1), micro_batch=mbs, micro_batches=m,
                world=world, args=g)


def pipeline_layout_split(text: str, pp: int, layers: int) -> tuple[list[int], int]:
    """(decoder layers per pipeline rank, vp) of a `--pipeline-model-parallel-layout` string, as
    Megatron-Core's PipelineParallelLayerLayout reads it (docstring of TransformerConfig.
    pipeline_model_parallel_layout): commas are cosmetic, `(...)*n` and `x*n` repeat, `|` splits
    stages, stage i is virtual stage i // pp of rank i % pp; `E` embedding first and once, `L`
    loss last and once, `t` a decoder layer, their count = num_layers."""
    import re

    flat = text.replace(",", "")
    while True:
        unrolled = re.sub(r"\(([^()]+)\)\*(\d+)", lambda m: m[1] * int(m[2]), flat)
        if unrolled == flat:
            break
        flat = unrolled
    flat = re.sub(r"(.)\*(\d+)", lambda m: m[1] * int(m[2]), flat)
    stages = flat.split("|")
    _need(len(stages) % pp == 0, "layout stages % PP != 0")
    _need(set(flat) <= set("EtLm|"), f"unknown layer symbol in the layout {text!r}")
    _need(flat.count("E") == 1 and stages[0].startswith("E"), "embedding first, exactly once")
    _need(flat.count("L") == 1 and stages[-1].endswith("L"), "loss last, exactly once")
    _need(flat.count("t") == layers, f"layout decoder layers {flat.count('t')} != num_layers {layers}")
    ranks = [0] * pp
    for i, stage in enumerate(stages):
        ranks[i % pp] += stage.count("t")
    return ranks, len(stages) // pp


def megatron_script_layout(text: str) -> dict:
    """The layout a Megatron-LM launch script starts (torchrun on each node)."""
    env, launcher, words = split_script(text)
    t = torchrun_args(launcher)
    world = int(t.nnodes) * int(t.nproc_per_node)
    out = megatron_layout(words, world, env)
    out["nodes"], out["per_node"] = int(t.nnodes), int(t.nproc_per_node)
    return out


def sbatch_layout(text: str) -> dict:
    """The layout an sbatch script starts: #SBATCH lines, then srun torchrun (launchers.md §6.2
    convention 1: one task per node)."""
    opts = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH "):].partition("=")
            opts[key] = value
    _need(opts.get("--ntasks-per-node") == "1", "one torchrun task per node")
    env, launcher, words = split_script(text)
    _need(launcher[:1] == ["srun"], "srun starts the per-node torchrun")
    t = torchrun_args(launcher[1:])
    _need(int(t.nnodes) == int(opts["--nodes"]), "torchrun --nnodes != #SBATCH --nodes")
    _need(int(t.nproc_per_node) == int(opts["--gpus-per-node"]),
          "torchrun --nproc-per-node != #SBATCH --gpus-per-node")
    world = int(opts["--nodes"]) * int(opts["--gpus-per-node"])
    out = megatron_layout(words, world, env)
    out["nodes"], out["per_node"] = int(opts["--nodes"]), int(opts["--gpus-per-node"])
    return out


# --------------------------------------------------------------------------- TorchTitan TOML

TITAN_KEYS = {  # launchers.md §3.2 (legacy JobConfig sections)
    "model": {"name", "flavor"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "dtype",
                 "mixed_precision_param", "mixed_precision_reduce", "steps"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_layers_per_stage",
                    "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "module_fqns_per_model_part",
                    "pipeline_parallel_microbatch_size", "context_parallel_degree",
                    "context_parallel_load_balancer", "context_parallel_rotate_method",
                    "expert_parallel_degree", "expert_tensor_parallel_degree",
                    "expert_parallel_comm_backend"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
}
SINGLE_STAGE = {"1F1B", "GPipe"}


def _titan_chunks(n_layers: int, stages: int, first: int, last: int) -> list[int]:
    """Layers per virtual stage from TorchTitan's automatic split (v0.2.2
    `generate_llm_fqn_per_model_part`, unchanged in 0.3.0): embedding and output weigh `first`
    and `last` layers; the effective layers are dealt out evenly, the remainder to the first
    stages; its ValueErrors become rejections."""
    eff = n_layers + first + last
    per, extra = divmod(eff, stages)
    _need(stages <= eff and per > 0, "empty pipeline stages")
    _need(first <= per and last <= per, "input/output weight exceeds the layers per stage")
    out = [per + (i < extra) for i in range(stages)]
    out[0] -= first
    out[-1] -= last
    return out


def torchtitan_layout(text: str, world: int, n_layers: int) -> dict:
    """Parse a TorchTitan job TOML and apply its checks (launchers.md §3.2-§3.3)."""
    cfg = tomllib.loads(text)
    for table, values in cfg.items():
        _need(table in TITAN_KEYS, f"unknown table [{table}]")
        unknown = set(values) - TITAN_KEYS[table]
        _need(not unknown, f"unknown keys {unknown} in [{table}]")
    tr, par = cfg.get("training", {}), cfg.get("parallelism", {})
    rep = par.get("data_parallel_replicate_degree", 1)
    tp = par.get("tensor_parallel_degree", 1)
    pp = par.get("pipeline_parallel_degree", 1)
    cp = par.get("context_parallel_degree", 1)
    shard = par.get("data_parallel_shard_degree", -1)
    if shard == -1:
        shard = world // (rep * cp * tp * pp)
    _need(rep * shard * cp * tp * pp == world, "dp_replicate*dp_shard*cp*tp*pp != world")
    dp = rep * shard
    local = tr.get("local_batch_size", 8)
    gbs = tr.get("global_batch_size", -1)
    gbs = local * dp if gbs < 0 else gbs
    _need(gbs % (local * dp) == 0, "global_batch_size % (local_batch_size * DP) != 0")
    accum = gbs // (local * dp)
    seq = tr.get("seq_len", 2048)
    vp, mbs, stage_layers = 1, local, None
    if pp > 1:
        mbs = par.get("pipeline_parallel_microbatch_size", 1)
        _need(local % mbs == 0, "local_batch_size % pipeline_parallel_microbatch_size != 0")
        lps = par.get("pipeline_parallel_layers_per_stage")
        _need(lps is not None, "this reader needs pipeline_parallel_layers_per_stage")
        first = par.get("pipeline_parallel_first_stage_less_layers", 1)
        last = par.get("pipeline_parallel_last_stage_less_layers", 1)
        stages = math.ceil((n_layers + first + last) / lps)
        _need(stages % pp == 0, "virtual stages % PP != 0")
        vp = stages // pp
        schedule = par.get("pipeline_parallel_schedule", "1F1B")
        _need(vp == 1 if schedule in SINGLE_STAGE else vp >= 2, f"{schedule} with {vp} stages/rank")
        chunks = _titan_chunks(n_layers, stages, first, last)
        ranks = [sum(chunks[r::pp]) for r in range(pp)]
        _need(all(c == chunks[r % pp] for r, c in enumerate(chunks)),
              "a rank's model chunks must hold equal layer counts to match the plan")
        stage_layers = None if len(set(ranks)) == 1 else ranks
        m = accum * (local // mbs)
    else:
        m = accum
    _need(seq % (tp * 2 * cp) == 0, "seq_len % (tp * 2 * cp) != 0 (v0.2.2 seq_len_divisor)")
    ep = par.get("expert_parallel_degree", 1)
    etp = par.get("expert_tensor_parallel_degree", 1)
    if ep > 1:
        _need(etp in (1, tp), "expert_tensor_parallel_degree must be 1 or TP")
        _need((shard * cp * tp) % (ep * etp) == 0, "efsdp would not be whole")
    fsdp = shard * cp > 1
    if not fsdp and rep > 1:
        _need(rep == world, "DDP has not supported > 1D parallelism")
    reshard = par.get("fsdp_reshard_after_forward", "default")
    zero = 0 if not fsdp else (3 if reshard == "always" else 2 if reshard == "never" else None)
    _need(zero is not None, "reshard policy 'default' depends on PP; the exporter should pin it")
    if fsdp:
        _need(rep == 1, "HSDP is not what the plan costs")
    mode = cfg.get("activation_checkpoint", {}).get("mode", "selective")
    model = cfg.get("model", {})
    # K, V exchange of PyTorch's context-parallel SDPA (launchers.md §3.2): all-gather once
    # (default) or around the ring by all-to-all permutes
    rotate = par.get("context_parallel_rotate_method", "allgather")
    _need(rotate in ("allgather", "alltoall"), f"context_parallel_rotate_method {rotate!r}")
    cp_comm = {"allgather": "allgather", "alltoall": "ring"}[rotate] if cp > 1 else None
    # without EP the experts follow TP; with EP the sparse mesh's etp axis (0.2.x; 1 in 0.3,
    # whose ParallelismConfig has no such key)
    return dict(dp=dp, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=etp if ep > 1 else tp, zero=zero,
                recompute=mode, sp=tp > 1, cp_comm=cp_comm, cp_a2a=None,
                stage_layers=stage_layers, micro_batch=mbs, micro_batches=m, world=world, seq_len=seq, global_batch=gbs,
                model=(model.get("name", "llama3"), model.get("flavor", "debugmodel")),
                grad_dtype=tr.get("mixed_precision_reduce", "float32"), config=cfg)


def torchtitan_module_values(text: str) -> dict:
    """The TOML-equivalent tables of a 0.3 config module, read with Python's `ast` (not run):
    `config.training.X = v` lines, the `ParallelismConfig(...)` keywords, the activation
    checkpoint class and the registry function imported. Feed them to `torchtitan_layout` as
    TOML text to apply the same checks."""
    import ast

    tree = ast.parse(text)
    training, parallelism, ac, model = {}, {}, "none", None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and ".config_registry" in node.module:
            model = (node.module.split(".")[2], node.names[0].name)
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            target = ast.unparse(node.targets[0])
            if target.startswith("config.training."):
                training[target.rsplit(".", 1)[1]] = ast.literal_eval(node.value)
            elif target == "config.parallelism":
                _need(ast.unparse(node.value.func) == "ParallelismConfig", "ParallelismConfig")
                parallelism = {k.arg: ast.literal_eval(k.value) for k in node.value.keywords}
            elif target == "config.activation_checkpoint":
                ac = {"None": "none", "SelectiveAC.Config()": "selective",
                      "FullAC.Config()": "full"}[ast.unparse(node.value)]
    _need(model is not None, "no registry config imported: the model is not named")
    return dict(training=training, parallelism=parallelism, ac=ac, model=model)


def torchtitan_module_layout(text: str, world: int, n_layers: int) -> dict:
    """The layout a 0.3 config module starts (same checks as the TOML reader)."""
    v = module = torchtitan_module_values(text)
    tr = {k: x for k, x in v["training"].items() if k != "disable_cuda_graphs"}
    par = {k: x for k, x in v["parallelism"].items() if k != "enable_sequence_parallel"}
    _need("context_parallel_rotate_method" not in par,
          "0.3 ParallelismConfig has no context_parallel_rotate_method (launchers.md §3.1)")
    if par.get("pipeline_parallel_degree", 1) > 1:
        _need(v["training"].get("disable_cuda_graphs") is True,
              "0.3.0: CUDA graphs do not support pipeline parallelism")
    lines = ["[training]"] + [f"{k} = {json.dumps(x)}" for k, x in tr.items()]
    lines += ["[parallelism]"] + [f"{k} = {json.dumps(x)}" for k, x in par.items()]
    lines += ["[activation_checkpoint]", f'mode = "{v["ac"]}"']
    out = torchtitan_layout("\n".join(lines), world, n_layers)
    out["model"] = module["model"]
    return out


# --------------------------------------------------------------------------- DeepSpeed JSON

DS_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
           "bf16", "zero_optimization", "data_types", "activation_checkpointing",
           "sequence_parallel_size"}


def deepspeed_layout(text: str, world: int) -> dict:
    """Parse a DeepSpeed config and apply `_batch_assertion` with the data-parallel size of a
    run without mpu or mesh: the world size, or world / sequence_parallel_size when that key is
    there (Ulysses; launchers.md §4.1, §4.3)."""
    cfg = json.loads(text)
    _need(set(cfg) <= DS_KEYS, f"unexpected keys {set(cfg) - DS_KEYS}")
    gbs, mbs = cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"]
    accum = cfg["gradient_accumulation_steps"]
    sp = cfg.get("sequence_parallel_size", 1)
    _need(isinstance(sp, int) and sp >= 1 and world % sp == 0, "world % sequence_parallel_size")
    dp = world // sp
    _need(gbs == mbs * accum * dp, "train_batch_size != micro * grad_acc * world / sp")
    stage = cfg.get("zero_optimization", {}).get("stage", 0)
    _need(stage in (0, 1, 2, 3), "zero stage")
    _need(cfg.get("bf16", {}).get("enabled") is True, "the plan assumes bf16")
    recompute = "full" if "activation_checkpointing" in cfg else "none"
    grad = cfg.get("data_types", {}).get("grad_accum_dtype")
    return dict(dp=dp, tp=1, pp=1, vp=1, cp=sp, cp_comm="a2a" if sp > 1 else None, cp_a2a=None,
                ep=1, etp=1, zero=stage, recompute=recompute,
                sp=False, micro_batch=mbs, micro_batches=accum, world=world, global_batch=gbs,
                grad_dtype=grad, overlap_comm=cfg["zero_optimization"].get("overlap_comm"),
                config=cfg)


# --------------------------------------------------------------------------- Nanotron YAML

NANO_PARALLELISM = {"dp", "tp", "pp", "pp_engine", "tp_mode", "tp_linear_async_communication",
                    "tp_recompute_allgather", "recompute_layer", "context_parallel_size",
                    "expert_parallel_size"}


def nanotron_layout(text: str, world: int) -> dict:
    """Parse Nanotron config keys and apply its checks (launchers.md §5)."""
    cfg = yaml.safe_load(text)
    par = cfg["parallelism"]
    _need(set(par) <= NANO_PARALLELISM, f"unknown parallelism keys {set(par) - NANO_PARALLELISM}")
    dp, tp, pp = par["dp"], par["tp"], par["pp"]
    cp, ep = par.get("context_parallel_size", 1), par.get("expert_parallel_size", 1)
    _need(tp * cp * dp * pp == world, "tp*cp*dp*pp != WORLD_SIZE")
    _need(ep == 1, "EP > 1 does not fit Nanotron's rank grid")
    mode = par.get("tp_mode", "ALL_REDUCE")
    _need(mode in ("ALL_REDUCE", "REDUCE_SCATTER"), "tp_mode")
    if par.get("tp_linear_async_communication"):
        _need(mode == "REDUCE_SCATTER", "async TP comm only with REDUCE_SCATTER")
    _need(par.get("pp_engine", "afab") in ("afab", "1f1b"), "pp_engine")
    tok = cfg["tokens"]
    zero = cfg.get("optimizer", {}).get("zero_stage", 0)
    _need(zero in (0, 1), "zero_stage in {0, 1}")
    mc = cfg["model"]["model_config"]
    heads, kv = mc["num_attention_heads"], mc["num_key_value_heads"]
    _need(heads % tp == 0 and kv >= tp and heads % kv == 0, "head checks")
    seq = tok["sequence_length"]
    if cp > 1:
        _need(seq % cp == 0, "tokens % cp != 0")
        _need(mc.get("_attn_implementation") == "llama3_ring_attention", "CP needs ring attention")
    mbs, accum = tok["micro_batch_size"], tok["batch_accumulation_per_replica"]
    return dict(dp=dp, tp=tp, pp=pp, vp=1, cp=cp, ep=ep, etp=tp, zero=zero,
                cp_comm="allgather" if cp > 1 else None, cp_a2a=None,
                recompute="full" if par.get("recompute_layer") else "none",
                sp=mode == "REDUCE_SCATTER", micro_batch=mbs, micro_batches=accum, world=world,
                grad_dtype="fp32" if cfg["optimizer"].get("accumulate_grad_in_fp32") else "bf16",
                global_batch=mbs * accum * dp, pp_engine=par.get("pp_engine", "afab"), config=cfg)


# --------------------------------------------------------------------------- Megatron-Bridge

BRIDGE_PRECISION_FLAGS = {  # Megatron-Bridge v0.6.0 training/mixed_precision.py presets
    "bf16_mixed": ["--bf16"], "fp16_mixed": ["--fp16"],
    "bf16_with_fp8_current_scaling_mixed": ["--bf16", "--fp8-format", "hybrid",
                                            "--fp8-recipe", "tensorwise"],
    "bf16_with_fp8_subchannel_scaling_mixed": ["--bf16", "--fp8-format", "hybrid",
                                               "--fp8-recipe", "blockwise"],
    "bf16_with_mxfp8_mixed": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],
    "bf16_with_nvfp4_mixed": ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"],
}
BRIDGE_TO_FLAG = {  # ConfigContainer model field -> the Megatron-LM flag of the same setting
    "num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
    "num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
    "virtual_pipeline_model_parallel_size": "--num-virtual-stages-per-pipeline-rank",
}


class _Record:
    """A config section that records what is set on it."""

    def __init__(self, **values):
        self.__dict__.update(values)


def bridge_module_values(text: str) -> tuple[dict, str, str, dict]:
    """Run an exported Megatron-Bridge module (its `autoparallel_config()`) with stand-in
    `megatron.bridge` modules: (sections -> fields set, the recipe imported, the mixed-precision
    preset named, the `CommOverlapConfig` arguments)."""
    import re
    import sys
    import types

    found = re.search(r"^from megatron\.bridge\.recipes\.(\w+) import (\w+)$", text, re.M)
    _need(found is not None, "no library recipe import")
    cfg = _Record(model=_Record(), ddp=_Record(), optimizer=_Record(), train=_Record(),
                  dataset=_Record(), checkpoint=_Record(), mixed_precision=None, comm_overlap=None)
    named: list[str] = []

    def preset(name):
        _need(name in BRIDGE_PRECISION_FLAGS, f"no mixed-precision preset {name!r}")
        named.append(name)
        return _Record()

    mods = {"megatron": {}, "megatron.bridge": {}, "megatron.bridge.recipes": {},
            f"megatron.bridge.recipes.{found[1]}": {found[2]: lambda: cfg},
            "megatron.bridge.training": {},
            "megatron.bridge.training.comm_overlap": {"CommOverlapConfig": _Record},
            "megatron.bridge.training.mixed_precision": {"get_mixed_precision_config": preset}}
    saved = {k: sys.modules.get(k) for k in mods}
    try:
        for name, attrs in mods.items():
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
        scope: dict = {"__name__": "exported"}
        exec(compile(text, "train_bridge.py", "exec"), scope)
        _need(scope["autoparallel_config"]() is cfg, "autoparallel_config() returns the recipe's config")
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    _need(len(named) == 1, "one mixed-precision preset")
    sections = {k: dict(vars(getattr(cfg, k))) for k in ("model", "ddp", "optimizer", "train",
                                                          "dataset", "checkpoint")}
    sections["mixed_precision"] = dict(vars(cfg.mixed_precision))
    return sections, found[2], named[0], dict(vars(cfg.comm_overlap))


def megatron_bridge_layout(text: str, model) -> dict:
    """The layout a Megatron-Bridge module starts: the torchrun line of its comments gives the
    world; its ConfigContainer fields are Megatron-Core's TransformerConfig / DDP / optimizer
    fields, which Megatron-LM sets from flags of the same names, so they are read back through
    the Megatron-LM reader and its checks (`megatron_layout`). The model's shapes come from the
    recipe (the Hugging Face model it builds), given here as `model` (a ModelSpec)."""
    run = [line[len("#   "):] for line in text.splitlines() if line.startswith("#   torchrun")
           or line.startswith("#   --rdzv")]
    _need(bool(run), "no torchrun line")
    launch = shlex.split(" ".join(x.rstrip("\\").strip() for x in run))
    _need(launch[-1] == "train_bridge.py", "torchrun runs the module")
    t = torchrun_args(launch[:-1])
    world = int(t.nnodes) * int(t.nproc_per_node)
    sec, _recipe, preset, overlap = bridge_module_values(text)
    m, ddp, opt, mp = sec["model"], sec["ddp"], sec["optimizer"], sec["mixed_precision"]
    _need(m["seq_length"] == sec["dataset"]["seq_length"], "model and dataset sequence lengths")
    _need(ddp["use_distributed_optimizer"] == opt["use_distributed_optimizer"],
          "ddp and optimizer disagree on the distributed optimizer")
    _need(ddp["grad_reduce_in_fp32"] == mp["grad_reduce_in_fp32"],
          "MixedPrecisionConfig.setup copies grad_reduce_in_fp32 onto ddp: they must agree")
    _need(overlap["tp_comm_overlap"] is False or m["sequence_parallel"],
          "tp_comm_overlap asserts sequence parallelism")
    words = ["--num-layers", str(model.n_layers), "--hidden-size", str(model.hidden_size),
             "--num-attention-heads", str(model.n_heads),
             "--seq-length", str(m["seq_length"]),
             "--micro-batch-size", str(sec["train"]["micro_batch_size"]),
             "--global-batch-size", str(sec["train"]["global_batch_size"])]
    if model.kv_heads < model.n_heads:
        words += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.moe is not None:
        words += ["--num-experts", str(model.moe.n_experts)]
    words += BRIDGE_PRECISION_FLAGS[preset]
    if not mp["grad_reduce_in_fp32"]:
        words.append("--grad-reduce-in-bf16")
    if mp.get("fp8_param_gather"):
        words.append("--fp8-param-gather")
    if mp.get("fp4_param_gather"):
        words.append("--fp4-param-gather")
    for key, value in m.items():
        if key == "seq_length" or value is None or value is False:
            continue
        flag = BRIDGE_TO_FLAG.get(key, "--" + key.replace("_", "-"))
        if key == "cuda_graph_impl" and value == "none":
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            words += [flag, *map(str, value)]
        elif key == "cpu_offloading":
            continue
        else:
            words += [flag, str(value)]
    for key in ("use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
                "use_megatron_fsdp"):
        if ddp.get(key):
            words.append("--" + key.replace("_", "-"))
    if ddp.get("use_megatron_fsdp"):
        _need(sec["checkpoint"].get("ckpt_format") == "fsdp_dtensor",
              "Megatron-FSDP checkpoints in fsdp_dtensor")
        words += ["--data-parallel-sharding-strategy", ddp["data_parallel_sharding_strategy"],
                  "--megatron-fsdp-main-grads-dtype",
                  "fp32" if ddp["grad_reduce_in_fp32"] else "bf16"]
    if opt.get("optimizer_cpu_offload"):
        words += ["--optimizer-cpu-offload", "--optimizer-offload-fraction",
                  str(opt["optimizer_offload_fraction"]), "--use-precision-aware-optimizer"]
    if overlap.get("overlap_moe_expert_parallel_comm"):
        words.append("--overlap-moe-expert-parallel-comm")
    if overlap.get("delay_wgrad_compute"):
        words.append("--delay-wgrad-compute")
    if overlap.get("tp_comm_overlap"):
        words.append("--tp-comm-overlap")
    # Megatron-Bridge sets the process environment itself (recipe env_vars, run_recipe's
    # runtime environment); the Megatron-LM reader's environment checks are met as it does
    env = {} if ddp.get("use_megatron_fsdp") else {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    out = megatron_layout(words, world, env)
    out["nodes"], out["per_node"] = int(t.nnodes), int(t.nproc_per_node)
    return out
