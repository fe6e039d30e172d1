"""Run inside the launcher virtual environment (see tests/test_real_launchers.py): read one
exported file with the launcher's own config classes and print what they parsed as JSON, or
{"skip": reason} when the launcher package cannot be imported here."""

import json
import os
import sys


def deepspeed(path: str, dp: int) -> dict:
    import deepspeed.runtime.config as dsc

    class MPU:  # the data-parallel group of rank 0 of a `dp`-process job (launchers.md §4.1)
        def get_data_parallel_world_size(self):
            return dp

        def get_data_parallel_rank(self):
            return 0

        def get_model_parallel_world_size(self):
            return 1

    dsc.dist.get_rank = lambda *a, **k: 0  # no process group in a test: stand in for rank 0
    c = dsc.DeepSpeedConfig(path, mpu=MPU())
    return dict(train_batch_size=c.train_batch_size, micro=c.train_micro_batch_size_per_gpu,
                accum=c.gradient_accumulation_steps, zero=c.zero_optimization_stage,
                overlap_comm=c.zero_config.overlap_comm, bf16=c.bfloat16_config.enabled,
                offload_optimizer=(getattr(c.zero_config.offload_optimizer.device, "value", c.zero_config.offload_optimizer.device)
                                   if c.zero_config.offload_optimizer else None),
                grad_accum_dtype=str(c.grad_accum_dtype),
                reduce_bucket_size=int(c.zero_config.reduce_bucket_size),
                checkpointing="activation_checkpointing" in json.load(open(path)))


def deepspeed_sp(path: str, world: int) -> dict:
    """A Ulysses config read as DeepSpeed reads it without an mpu (the Hugging Face integration's
    zero.init path): the config dict, a `world`-process job, and DeepSpeed's own data-parallel
    size `world / sequence_parallel_size` (`DeepSpeedConfig.__init__`) in its batch check."""
    import deepspeed.runtime.config as dsc

    dsc.dist.get_rank = lambda *a, **k: 0  # no process group in a test: rank 0 of `world`
    dsc.dist.get_world_size = lambda *a, **k: world
    cfg = json.load(open(path))
    c = dsc.DeepSpeedConfig(cfg)
    return dict(world_size=c.world_size, sequence_parallel_size=cfg["sequence_parallel_size"],
                train_batch_size=c.train_batch_size, micro=c.train_micro_batch_size_per_gpu,
                accum=c.gradient_accumulation_steps, zero=c.zero_optimization_stage)


def torchtitan(path: str) -> dict:
    from torchtitan.config import ConfigManager

    sys.path.insert(0, os.path.dirname(path))
    module = os.path.basename(path).removesuffix(".py")
    c = ConfigManager().parse_args(["--module", module, "--config", "autoparallel_config"])
    p, t = c.parallelism, c.training
    extra = {"moe_force_load_balance": True} if c.debug.moe_force_load_balance else {}
    return extra | dict(model=[c.model_spec.name, c.model_spec.flavor],
                dp_shard=p.data_parallel_shard_degree, dp_rep=p.data_parallel_replicate_degree,
                tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                cp=p.context_parallel_degree, layers_per_stage=p.pipeline_parallel_layers_per_stage,
                schedule=p.pipeline_parallel_schedule, local=t.local_batch_size,
                global_batch=t.global_batch_size, seq=t.seq_len,
                ac=type(c.activation_checkpoint).__qualname__)


def torchtitan_split(path: str) -> dict:
    """TorchTitan's own pipeline split of a loaded 0.3 module: the virtual-stage count from
    `_get_pipeline_metadata` and the module names per virtual stage from
    `_generate_llm_fqn_per_model_part` (both pure functions; the parallel dims are only asked
    for `pp`, so no process group is needed), folded onto ranks (virtual stage v on rank
    v % pp, the "loop" placement of single-stage and interleaved schedules)."""
    from types import SimpleNamespace

    from torchtitan.config import ConfigManager
    from torchtitan.distributed import pipeline_parallel as tpp

    sys.path.insert(0, os.path.dirname(path))
    module = os.path.basename(path).removesuffix(".py")
    c = ConfigManager().parse_args(["--module", module, "--config", "autoparallel_config"])
    p = c.parallelism
    stages, layers, first, last = tpp._get_pipeline_metadata(
        SimpleNamespace(pp=p.pipeline_parallel_degree), p, c.model_spec.model)
    parts = tpp._generate_llm_fqn_per_model_part(stages, layers, first, last)
    chunks = [sum(name.startswith("layers.") for name in part) for part in parts]
    pp = p.pipeline_parallel_degree
    return dict(stages=stages, layers=layers, first_less=first, last_less=last, chunks=chunks,
                ranks=[sum(chunks[r::pp]) for r in range(pp)],
                embedding=[i for i, part in enumerate(parts) if "tok_embeddings" in part],
                output=[i for i, part in enumerate(parts) if "lm_head" in part])


def _decoder(args: dict) -> dict:
    """TransformerConfig's decoder shape, parallel degrees and dtypes from the parsed flags."""
    import torch

    return dict(
        num_layers=args["num_layers"], hidden_size=args["hidden_size"],
        ffn_hidden_size=args["ffn_hidden_size"], num_attention_heads=args["num_attention_heads"],
        num_query_groups=args["num_query_groups"], normalization=args["normalization"],
        add_bias_linear=args["add_bias_linear"], gated_linear_unit=args["swiglu"],
        tensor_model_parallel_size=args["tensor_model_parallel_size"],
        pipeline_model_parallel_size=args["pipeline_model_parallel_size"],
        sequence_parallel=args["sequence_parallel"], bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        hidden_dropout=args["hidden_dropout"], attention_dropout=args["attention_dropout"])


def megatron_core(args: dict) -> dict:
    """Build Megatron-Core's TransformerConfig and DDP config from the parsed flags (the
    mapping of Megatron-LM's `core_transformer_config_from_args` / `get_megatron_ddp_config`)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    tc = TransformerConfig(
        **_decoder(args),
        recompute_granularity=args["recompute_granularity"],
        recompute_method=args["recompute_method"], recompute_num_layers=args["recompute_num_layers"],
        recompute_modules=args.get("recompute_modules"),
        cpu_offloading=args.get("cpu_offloading_num_layers", 0) > 0,
        cpu_offloading_num_layers=args.get("cpu_offloading_num_layers", 0),
        fine_grained_activation_offloading=args.get("fine_grained_activation_offloading", False),
        offload_modules=args.get("offload_modules") or [])
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=not args["grad_reduce_in_bf16"],
        overlap_grad_reduce=args["overlap_grad_reduce"],
        overlap_param_gather=args["overlap_param_gather"],
        use_distributed_optimizer=args["use_distributed_optimizer"],
        bucket_size=args["ddp_bucket_size"])
    import megatron.core.optimizer.optimizer_config as oc
    from megatron.core.optimizer import OptimizerConfig
    from packaging.version import Version

    # Transformer Engine (a CUDA build) is not installable here: stand in for TE 2.1, the version
    # the precision-aware optimizer asks for (OptimizerConfig.__post_init__)
    oc.is_te_min_version = lambda v, *a, **k: Version("2.1.0") >= Version(v)

    opt = OptimizerConfig(
        optimizer_cpu_offload=args.get("optimizer_cpu_offload", False),
        optimizer_offload_fraction=args.get("optimizer_offload_fraction", 1.0),
        use_precision_aware_optimizer=args.get("use_precision_aware_optimizer", False),
        use_distributed_optimizer=args["use_distributed_optimizer"])
    out = dict(normalization=tc.normalization, add_bias_linear=tc.add_bias_linear,
               gated=tc.gated_linear_unit, groups=tc.num_query_groups, kv=tc.kv_channels,
               ffn=tc.ffn_hidden_size, grad_reduce_in_fp32=ddp.grad_reduce_in_fp32,
               dist_opt=ddp.use_distributed_optimizer, bucket=ddp.bucket_size)
    out |= dict(recompute_modules=tc.recompute_modules,
                cpu_offloading_num_layers=tc.cpu_offloading_num_layers if tc.cpu_offloading else 0,
                optimizer_cpu_offload=opt.optimizer_cpu_offload,
                optimizer_offload_fraction=opt.optimizer_offload_fraction)
    if tc.fine_grained_activation_offloading:
        out["offload_modules"] = list(tc.offload_modules)
    return out


def megatron_core_cp(args: dict) -> dict:
    """Megatron-Core's TransformerConfig (and its ModelParallelConfig part) built with the
    parsed context-parallel flags, as `core_transformer_config_from_args` passes them (one
    --cp-comm-type value: a string), with its own checks."""
    import torch
    from megatron.core.transformer import TransformerConfig

    comm = args["cp_comm_type"]
    tc = TransformerConfig(
        num_layers=args["num_layers"], hidden_size=args["hidden_size"],
        num_attention_heads=args["num_attention_heads"],
        num_query_groups=args["num_query_groups"],
        tensor_model_parallel_size=args["tensor_model_parallel_size"],
        context_parallel_size=args["context_parallel_size"],
        hierarchical_context_parallel_sizes=args["hierarchical_context_parallel_sizes"],
        cp_comm_type=comm[0] if len(comm) == 1 else comm,
        sequence_parallel=args["sequence_parallel"], bf16=True, params_dtype=torch.bfloat16)
    return dict(cp=tc.context_parallel_size, cp_comm_type=tc.cp_comm_type,
                hierarchical=tc.hierarchical_context_parallel_sizes)


def megatron_groups(args: dict) -> dict:
    """Megatron-Core's own rank grids (parallel_state.RankGenerator, as initialize_model_parallel
    builds them: the dense grid tp-cp-ep-dp-pp with ep = 1, the expert grid with tp = etp, ep,
    dp = edp, cp = 1, both in the default order), and for each group kind the size, the most
    ranks of one group on one node and the nodes one group spans (nodes of `per_node` GPUs)."""
    from megatron.core.parallel_state import RankGenerator

    tp, cp, dp, pp = args["tp"], args["cp"], args["dp"], args["pp"]
    etp, ep, per_node = args["etp"], args["ep"], args["per_node"]
    world = tp * cp * dp * pp
    edp = world // (etp * ep * pp)
    order = "tp-cp-ep-dp-pp"
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    expert = RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=order)
    assert dense.get_ranks("pp") == expert.get_ranks("pp")

    def shape(groups):
        nodes = [{r // per_node for r in g} for g in groups]
        per = [max(sum(1 for r in g if r // per_node == n) for n in ns) for g, ns in zip(groups, nodes)]
        return dict(size=len(groups[0]), per_node=max(per), nodes=max(len(n) for n in nodes))

    return dict(tp=shape(dense.get_ranks("tp")), cp=shape(dense.get_ranks("cp")),
                dpcp=shape(dense.get_ranks("dp-cp")), etp=shape(expert.get_ranks("tp")),
                ep=shape(expert.get_ranks("ep")), edp=shape(expert.get_ranks("dp")),
                pp=shape(dense.get_ranks("pp")))


def megatron_split(args: dict) -> dict:
    """Decoder layers Megatron-Core builds on each pipeline rank and model chunk from the parsed
    pipeline flags: TransformerConfig (with its split checks) and `get_num_layers_to_build`, the
    function each rank calls when it builds its TransformerBlock; the pipeline layout's vp is
    taken from the string as Megatron-LM's validate_args does. Ranks are set one at a time in
    parallel_state, so no process group is needed."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp, layout = args["pipeline_model_parallel_size"], args.get("pipeline_model_parallel_layout")
    vp = args.get("num_virtual_stages_per_pipeline_rank") or 1
    if layout is not None:
        vp = PipelineParallelLayerLayout.get_num_stages_from_str(layout) // pp
    tc = TransformerConfig(
        num_layers=args["num_layers"], hidden_size=args["hidden_size"],
        num_attention_heads=args["num_attention_heads"], pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
        num_layers_in_first_pipeline_stage=args.get("decoder_first_pipeline_num_layers"),
        num_layers_in_last_pipeline_stage=args.get("decoder_last_pipeline_num_layers"),
        account_for_embedding_in_pipeline_split=args.get("account_for_embedding_in_pipeline_split", False),
        account_for_loss_in_pipeline_split=args.get("account_for_loss_in_pipeline_split", False),
        pipeline_model_parallel_layout=layout, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16)
    ps.set_virtual_pipeline_model_parallel_world_size(vp if vp > 1 else None)
    chunks = []
    for rank in range(pp):
        ps.set_pipeline_model_parallel_rank(rank)
        chunks.append([get_num_layers_to_build(tc, vp_stage=a if vp > 1 else None, pp_rank=rank)
                       for a in range(vp)])
    return dict(vp=vp, chunks=chunks, ranks=[sum(c) for c in chunks])


MOE_FLAGS = ("expert_model_parallel_size", "moe_router_topk", "moe_ffn_hidden_size",
             "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
             "moe_router_force_load_balancing", "moe_expert_capacity_factor",
             "moe_pad_expert_input_to_capacity", "overlap_moe_expert_parallel_comm",
             "delay_wgrad_compute", "cuda_graph_impl")
"""Parsed Megatron-LM flags that TransformerConfig takes under the same name."""


def megatron_moe(args: dict) -> dict:
    """Megatron-Core's TransformerConfig from the exported MoE flags (its __post_init__ checks
    the dispatcher, capacity padding, the EP overlap and CUDA graph scopes); what it kept."""
    from megatron.core.transformer import TransformerConfig

    tc = TransformerConfig(**_decoder(args), num_moe_experts=args["num_experts"],
                           cuda_graph_scope=args["cuda_graph_scope"] or "full",
                           **{k: args[k] for k in MOE_FLAGS})
    return dict(dispatcher=tc.moe_token_dispatcher_type, backend=tc.moe_flex_dispatcher_backend,
                balanced=tc.moe_router_force_load_balancing,
                capacity=tc.moe_expert_capacity_factor, pad=tc.moe_pad_expert_input_to_capacity,
                overlap=tc.overlap_moe_expert_parallel_comm, graphs=tc.cuda_graph_impl,
                scope=[str(getattr(x, "name", x)) for x in (tc.cuda_graph_scope or [])])


def nanotron(path: str) -> dict:
    import yaml
    from nanotron.config.parallelism_config import ParallelismArgs

    cfg = yaml.safe_load(open(path))
    par = ParallelismArgs(**cfg["parallelism"])
    return dict(dp=par.dp, tp=par.tp, pp=par.pp)


# Megatron-Bridge v0.6.0 field names of the sections that are Megatron-Bridge's own classes (the
# model, ddp and optimizer sections are Megatron-Core's, checked with the real classes below):
# training/comm_overlap.py CommOverlapConfig, training/mixed_precision.py MixedPrecisionConfig,
# Megatron-LM megatron/training/config/training_config.py TrainingConfig / CheckpointConfig
# (which Megatron-Bridge's extend), training/config.py GPTDatasetConfig.seq_length and
# models/gpt_provider.py GPTModelProvider.seq_length (the one model field beyond TransformerConfig)
BRIDGE_FIELDS = {
    "comm_overlap": "tp_comm_overlap tp_comm_overlap_cfg tp_comm_bootstrap_backend overlap_p2p_comm "
                    "batch_p2p_comm overlap_grad_reduce overlap_param_gather "
                    "overlap_param_gather_with_optimizer_step align_param_gather bucket_size "
                    "defer_embedding_wgrad_compute wgrad_deferral_limit data_parallel_size "
                    "overlap_moe_expert_parallel_comm delay_wgrad_compute",
    "mixed_precision": "fp32 fp16 bf16 params_dtype pipeline_dtype autocast_dtype autocast_enabled "
                       "grad_reduce_in_fp32 fp8 fp8_recipe first_last_layers_bf16 fp8_margin "
                       "fp8_amax_history_len fp8_amax_compute_algo fp8_wgrad "
                       "fp8_dot_product_attention fp8_multi_head_attention fp8_param "
                       "fp8_param_gather fp4 fp4_recipe fp4_param fp4_param_gather loss_scale "
                       "initial_loss_scale min_loss_scale loss_scale_window hysteresis "
                       "num_layers_at_start_in_bf16 num_layers_at_end_in_bf16 "
                       "reuse_grad_buf_for_mxfp8_param_ag",
    "train": "micro_batch_size global_batch_size train_iters",
    "checkpoint": "ckpt_format save load",
    "dataset": "seq_length",
}
BRIDGE_PRECISIONS = {  # training/mixed_precision.py v0.6.0 @register presets: (fp8, recipe, fp4)
    "bf16_mixed": (None, None, None), "fp16_mixed": (None, None, None),
    "bf16_with_fp8_current_scaling_mixed": ("hybrid", "tensorwise", None),
    "bf16_with_fp8_subchannel_scaling_mixed": ("hybrid", "blockwise", None),
    "bf16_with_mxfp8_mixed": ("e4m3", "mxfp8", None),
    "bf16_with_nvfp4_mixed": (None, None, "e2m1"),
}


class Strict:
    """A Megatron-Bridge config section that takes only its v0.6.0 field names."""

    def __init__(self, section: str, **values):
        object.__setattr__(self, "_names", set(BRIDGE_FIELDS[section].split()))
        object.__setattr__(self, "_section", section)
        for k, v in values.items():
            setattr(self, k, v)

    def __setattr__(self, key, value):
        if key not in self._names:
            raise AttributeError(f"{self._section} has no field {key!r} (Megatron-Bridge v0.6.0)")
        object.__setattr__(self, key, value)


def megatron_bridge(path: str, shape: dict) -> dict:
    """Run the exported module's `autoparallel_config()` against Megatron-Bridge's interfaces: the
    recipe function, `CommOverlapConfig` and `get_mixed_precision_config` are stand-ins taking only
    v0.6.0's names, the model, ddp and optimizer sections are Megatron-Core's own classes (an
    unknown field shows as a new attribute). The model section is then rebuilt, which runs
    TransformerConfig's checks, and asked for each pipeline rank's layers."""
    import dataclasses
    import runpy
    import types

    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    moe = dict(num_moe_experts=shape["experts"], moe_router_topk=shape["topk"],
               moe_ffn_hidden_size=shape["moe_ffn"]) if shape.get("experts") else {}
    model = TransformerConfig(
        num_layers=shape["layers"], hidden_size=shape["hidden"], ffn_hidden_size=shape["ffn"],
        num_attention_heads=shape["heads"], num_query_groups=shape["groups"], bf16=True,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, **moe)
    cfg = types.SimpleNamespace(model=model, ddp=DistributedDataParallelConfig(),
                                optimizer=OptimizerConfig(), train=Strict("train"),
                                dataset=Strict("dataset"), checkpoint=Strict("checkpoint"),
                                mixed_precision=None, comm_overlap=None)
    called = []

    def recipe():
        called.append(True)
        return cfg

    def get_mixed_precision_config(name):
        fp8, recipe_name, fp4 = BRIDGE_PRECISIONS[name]  # KeyError: no such preset
        return Strict("mixed_precision", fp8=fp8, fp8_recipe=recipe_name or "tensorwise", fp4=fp4,
                      grad_reduce_in_fp32=True, bf16=not name.startswith("fp16"))

    class CommOverlapConfig(Strict):
        def __init__(self, **values):
            super().__init__("comm_overlap", **values)

    stubs = {"megatron.bridge": {}, "megatron.bridge.recipes": {},
             f"megatron.bridge.recipes.{shape['package']}": {f"{shape['stem']}_pretrain_config": recipe},
             "megatron.bridge.training": {},
             "megatron.bridge.training.comm_overlap": {"CommOverlapConfig": CommOverlapConfig},
             "megatron.bridge.training.mixed_precision":
                 {"get_mixed_precision_config": get_mixed_precision_config}}
    for name, attrs in stubs.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
    before = {sec: set(vars(getattr(cfg, sec))) for sec in ("model", "ddp", "optimizer")}
    got = runpy.run_path(path, run_name="autoparallel_export")["autoparallel_config"]()
    assert got is cfg and called
    for sec, names in before.items():
        extra = set(vars(getattr(cfg, sec))) - names - ({"seq_length"} if sec == "model" else set())
        assert not extra, f"{sec}: not Megatron-Core fields: {sorted(extra)}"
    init = {f.name: getattr(model, f.name) for f in dataclasses.fields(TransformerConfig) if f.init}
    tc = TransformerConfig(**init)  # __post_init__: the split, CP, MoE and recompute checks
    vp = tc.virtual_pipeline_model_parallel_size or 1  # a layout string sets it (post_init)
    ps.set_virtual_pipeline_model_parallel_world_size(vp if vp > 1 else None)
    ranks = []
    for rank in range(tc.pipeline_model_parallel_size):
        ps.set_pipeline_model_parallel_rank(rank)
        ranks.append(sum(get_num_layers_to_build(tc, vp_stage=a if vp > 1 else None, pp_rank=rank)
                         for a in range(vp)))
    mp, co = cfg.mixed_precision, cfg.comm_overlap
    return dict(tp=tc.tensor_model_parallel_size, sp=tc.sequence_parallel,
                pp=tc.pipeline_model_parallel_size, vp=vp, ranks=ranks,
                cp=tc.context_parallel_size, cp_comm_type=tc.cp_comm_type,
                ep=tc.expert_model_parallel_size, etp=tc.expert_tensor_parallel_size,
                dispatcher=tc.moe_token_dispatcher_type, backend=tc.moe_flex_dispatcher_backend,
                recompute=tc.recompute_granularity, recompute_modules=tc.recompute_modules,
                seq=model.seq_length, mb=cfg.train.micro_batch_size,
                gbs=cfg.train.global_batch_size, dist_opt=cfg.ddp.use_distributed_optimizer,
                fsdp=cfg.ddp.use_megatron_fsdp,
                sharding=cfg.ddp.data_parallel_sharding_strategy,
                ddp_fp32=cfg.ddp.grad_reduce_in_fp32, mp_fp32=mp.grad_reduce_in_fp32,
                fp8=mp.fp8, fp8_recipe=mp.fp8_recipe, fp4=mp.fp4,
                tp_overlap=co.tp_comm_overlap, a2a_overlap=co.overlap_moe_expert_parallel_comm)


if __name__ == "__main__":
    kind, arg = sys.argv[1], sys.argv[2]
    loaders = {"deepspeed": lambda: deepspeed(arg, int(sys.argv[3])),
               "deepspeed_sp": lambda: deepspeed_sp(arg, int(sys.argv[3])),
               "torchtitan": lambda: torchtitan(arg),
               "torchtitan_split": lambda: torchtitan_split(arg),
               "megatron_core": lambda: megatron_core(json.loads(arg)),
               "megatron_core_cp": lambda: megatron_core_cp(json.loads(arg)),
               "megatron_groups": lambda: [megatron_groups(a) for a in json.loads(arg)],
               "megatron_split": lambda: megatron_split(json.loads(arg)),
               "megatron_moe": lambda: megatron_moe(json.loads(arg)),
               "megatron_bridge": lambda: megatron_bridge(arg, json.loads(sys.argv[3])),
               "nanotron": lambda: nanotron(arg)}
    try:
        out = loaders[kind]()
    except ImportError as exc:  # the package is not installable / importable here
        out = {"skip": f"{type(exc).__name__}: {exc}"}
    print("AUTOPARALLEL-RESULT " + json.dumps(out))
