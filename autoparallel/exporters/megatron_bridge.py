"""Megatron-Bridge: a Python module that builds the model's library recipe and sets the planned
layout and job settings on its `ConfigContainer`, run with torchrun.

Megatron-Bridge (NeMo's training library on Megatron-Core, the `megatron-bridge` stack) trains
from recipe functions returning a `ConfigContainer`; its examples and `scripts/training/
run_recipe.py` start from one and change fields (NVIDIA-NeMo/Megatron-Bridge v0.6.0). The module
written here imports the model's library recipe (`RECIPES`, matched by shape), sets every field
the plan decided, and calls `megatron.bridge.training.pretrain.pretrain` with the GPT forward
step when run as a script. Every field is set explicitly, so a recipe's own tuning (its split,
recompute, overlap, graphs) cannot leak into the launched layout.

| layout / job | ConfigContainer field |
|---|---|
| tp, sp | `model.tensor_model_parallel_size`, `model.sequence_parallel` |
| pp, vp | `model.pipeline_model_parallel_size`, `model.virtual_pipeline_model_parallel_size` (None for 1) |
| uneven split | `model.num_layers_in_first/last_pipeline_stage` when every stage divides by vp, else the embedding / loss accounting (`model.account_for_embedding/loss_in_pipeline_split`), else `model.pipeline_model_parallel_layout` (the same forms as the megatron target, Megatron-Core `TransformerConfig`) |
| cp | `model.context_parallel_size`, `model.cp_comm_type`, `model.hierarchical_context_parallel_sizes` |
| ep, etp | `model.expert_model_parallel_size`, `model.expert_tensor_parallel_size` |
| zero 0 / 1 | `ddp.use_distributed_optimizer` False / True (and `optimizer.use_distributed_optimizer`) |
| zero 2 / 3 | `ddp.use_megatron_fsdp`, `ddp.data_parallel_sharding_strategy` optim_grads / optim_grads_params, `checkpoint.ckpt_format` fsdp_dtensor |
| recompute | `model.recompute_granularity`, `recompute_method`, `recompute_num_layers`, `recompute_modules` |
| precision | `mixed_precision = get_mixed_precision_config(name)` (`PRECISIONS`), then `grad_reduce_in_fp32` and the low-precision parameter gather as planned |
| TP and MoE overlap | `comm_overlap = CommOverlapConfig(tp_comm_overlap=..., overlap_moe_expert_parallel_comm=..., delay_wgrad_compute=...)` |
| batch, sequence | `train.micro_batch_size`, `train.global_batch_size`, `dataset.seq_length` and `model.seq_length` |

Field names: Megatron-Core 0.16.1 `TransformerConfig`, `DistributedDataParallelConfig`,
`OptimizerConfig` (the `model`, `ddp` and `optimizer` sections); Megatron-Bridge v0.6.0
`training/config.py` (`ConfigContainer`), `training/comm_overlap.py` (`CommOverlapConfig`),
`training/mixed_precision.py` (`MixedPrecisionConfig` and its named presets); Megatron-LM
`megatron/training/config/training_config.py` (`TrainingConfig.micro_batch_size`,
`global_batch_size`, `CheckpointConfig.ckpt_format`), which Megatron-Bridge's classes extend.
"""

from __future__ import annotations

from ._base import Exporter, Job, comments, dp_bucket_params
from .megatron import (
    CP_COMM_TYPE,
    CUDA_GRAPH_FLAGS,
    MEGATRON_IGNORES,
    SHARDING,
    accounting,
    layout_string,
    megatron_limits,
    recompute_settings,
    shell_line,
    torchrun_words,
)

FILE = "train_bridge.py"
"""The module's file name in the run line (`plan`'s suggested `--output`)."""
RELEASE = "v0.6.0"
"""The Megatron-Bridge release whose recipe names and config fields the module uses."""

RECIPES = {
    # (layers, hidden, heads, KV heads, FFN, vocab, routed experts) -> (package, recipe stem);
    # the library recipes of Megatron-Bridge v0.6.0 (src/megatron/bridge/recipes/<package>/
    # __init__.py __all__) and the Hugging Face model each builds (AutoBridge.from_hf_pretrained)
    (32, 4096, 32, 8, 14336, 128256, 0): ("llama", "llama3_8b"),  # meta-llama/Meta-Llama-3-8B
    (80, 8192, 64, 8, 28672, 128256, 0): ("llama", "llama3_70b"),  # meta-llama/Meta-Llama-3-70B
    (126, 16384, 128, 8, 53248, 128256, 0): ("llama", "llama31_405b"),  # Meta-Llama-3.1-405B
    (48, 2048, 32, 4, 6144, 151936, 128): ("qwen", "qwen3_30b_a3b"),  # Qwen/Qwen3-30B-A3B
    (94, 4096, 64, 4, 12288, 151936, 128): ("qwen", "qwen3_235b_a22b"),  # Qwen/Qwen3-235B-A22B
    (61, 7168, 128, 128, 18432, 129280, 256): ("deepseek", "deepseek_v3"),  # deepseek-ai/DeepSeek-V3
    (61, 7168, 64, 64, 18432, 163840, 384): ("kimi", "kimi_k2"),  # moonshotai/Kimi-K2-Instruct
    (36, 2880, 64, 8, 2880, 201088, 128): ("gpt_oss", "gpt_oss_120b"),  # openai/gpt-oss-120b
    (24, 2880, 64, 8, 2880, 201088, 32): ("gpt_oss", "gpt_oss_20b"),  # openai/gpt-oss-20b
}
"""Models autoparallel can name a Megatron-Bridge library recipe for, by shape."""

PRECISIONS = {
    "bf16": "bf16_mixed", "fp16": "fp16_mixed",
    "fp8": "bf16_with_fp8_current_scaling_mixed",  # per-tensor current scaling (tensorwise)
    "fp8-blockwise": "bf16_with_fp8_subchannel_scaling_mixed",  # 128x128 / 1x128 blocks
    "mxfp8": "bf16_with_mxfp8_mixed",
    "nvfp4": "bf16_with_nvfp4_mixed",
}
"""Precision recipe -> Megatron-Bridge named `MixedPrecisionConfig` (training/mixed_precision.py,
v0.6.0 `@register` functions)."""

DISPATCHER = {"alltoall": ("alltoall", None), "allgather": ("allgather", None),
              "deepep": ("flex", "deepep"), "hybridep": ("flex", "hybridep")}
"""`JobSpec.moe_dispatcher` -> (`moe_token_dispatcher_type`, `moe_flex_dispatcher_backend`)."""


def recipe_of(job: Job) -> tuple[str, str] | None:
    """(package, recipe stem) of the job's model, matched by shape; None when none matches."""
    m = job.problem.model
    key = (m.n_layers, m.hidden_size, m.n_heads, m.kv_heads, m.ffn_hidden_size, m.vocab_size,
           m.moe.n_experts if m.moe is not None else 0)
    return RECIPES.get(key)


def split_fields(job: Job) -> dict:
    """The pipeline split as `TransformerConfig` fields, every one given (the recipe's own split
    reset): the same forms, in the same order, as the megatron target's flags (`split_args`)."""
    lay = job.layout
    sl = lay.stage_layers
    out = {"pipeline_model_parallel_size": lay.pp,
           "virtual_pipeline_model_parallel_size": lay.vp if lay.vp > 1 else None,
           "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None,
           "account_for_embedding_in_pipeline_split": False,
           "account_for_loss_in_pipeline_split": False, "pipeline_model_parallel_layout": None}
    if not sl:
        return out
    if all(x % lay.vp == 0 for x in sl):
        return out | {"num_layers_in_first_pipeline_stage": sl[0],
                      "num_layers_in_last_pipeline_stage": sl[-1]}
    counted = accounting(job.problem.model.n_layers, lay.pp, lay.vp, sl)
    if counted is not None:
        return out | {"account_for_embedding_in_pipeline_split": counted[0],
                      "account_for_loss_in_pipeline_split": counted[1]}
    # the layout string sets the virtual stages itself (TransformerConfig: vp must be None)
    return out | {"virtual_pipeline_model_parallel_size": None,
                  "pipeline_model_parallel_layout": layout_string(sl, lay.vp)}


def model_fields(job: Job) -> dict:
    """`cfg.model` fields: parallelism, split, recompute, offload, MoE and CUDA graphs."""
    lay, tr, m = job.layout, job.problem.training, job.problem.model
    out = {"tensor_model_parallel_size": lay.tp, "sequence_parallel": bool(lay.sp)}
    out |= split_fields(job)
    out |= {"context_parallel_size": lay.cp,
            "cp_comm_type": CP_COMM_TYPE[lay.cp_form.value] if lay.cp > 1 else "p2p",
            "hierarchical_context_parallel_sizes": (
                [lay.cp_a2a, lay.cp // lay.cp_a2a] if lay.cp > 1 and lay.cp_a2a else None)}
    if m.moe is not None:
        kind, backend = DISPATCHER[tr.moe_dispatcher]
        capacity = tr.moe_routing == "capacity"
        out |= {"expert_model_parallel_size": lay.ep, "expert_tensor_parallel_size": lay.expert_tp,
                "moe_token_dispatcher_type": kind, "moe_flex_dispatcher_backend": backend,
                "moe_router_force_load_balancing": tr.moe_routing == "balanced",
                "moe_expert_capacity_factor": tr.moe_capacity_factor if capacity else None,
                "moe_pad_expert_input_to_capacity": capacity}
    out |= recompute_settings(job)
    mods = tr.offload_modules
    out |= {"cpu_offloading": bool(lay.offload_layers),
            "cpu_offloading_num_layers": lay.offload_layers or 0,
            "fine_grained_activation_offloading": mods != "none",
            "offload_modules": mods.split("+") if mods != "none" else None}
    if tr.cuda_graphs == "none":
        out["cuda_graph_impl"] = "none"  # the recipe's scope is then unused
    else:
        flags = CUDA_GRAPH_FLAGS[tr.cuda_graphs]  # [--impl, impl, --scope, scope...]
        scope = flags[3:] if m.moe is not None or tr.cuda_graphs == "full" else flags[3:4]
        out |= {"cuda_graph_impl": flags[1], "cuda_graph_scope": list(scope)}
    out["seq_length"] = job.problem.training.seq_len
    return out


def container_fields(job: Job) -> dict[str, dict]:
    """The other sections: `train`, `dataset`, `ddp`, `optimizer`, `checkpoint`,
    `mixed_precision` (after the named preset) -> field -> value."""
    lay, tr = job.layout, job.problem.training
    sharded = lay.zero in SHARDING
    ddp = {"use_distributed_optimizer": lay.zero == 1, "overlap_grad_reduce": True,
           "overlap_param_gather": lay.zero >= 1, "bucket_size": dp_bucket_params(job),
           "use_megatron_fsdp": sharded, "grad_reduce_in_fp32": tr.grad_dtype == "fp32"}
    if sharded:
        ddp["data_parallel_sharding_strategy"] = SHARDING[lay.zero]
    low = tr.precision not in ("bf16", "fp16")
    mp = {"grad_reduce_in_fp32": tr.grad_dtype == "fp32"}
    if tr.precision == "fp8":
        mp["first_last_layers_bf16"] = False  # the plan costs every layer in the recipe
    if low:
        key = "fp4_param_gather" if tr.precision == "nvfp4" else "fp8_param_gather"
        mp[key] = bool(tr.fp8_param_gather)
    opt = {"use_distributed_optimizer": lay.zero == 1,
           "optimizer_cpu_offload": bool(lay.optimizer_offload),
           "optimizer_offload_fraction": float(lay.optimizer_offload or 1.0),
           "use_precision_aware_optimizer": bool(lay.optimizer_offload)}
    out = {"train": {"micro_batch_size": lay.micro_batch, "global_batch_size": tr.global_batch},
           "dataset": {"seq_length": tr.seq_len}, "ddp": ddp, "optimizer": opt,
           "mixed_precision": mp}
    if sharded:
        out["checkpoint"] = {"ckpt_format": "fsdp_dtensor"}
    return out


def comm_overlap_args(job: Job) -> dict:
    """`CommOverlapConfig` arguments: TP overlap (with SP, as Megatron-Core asserts), the EP
    all-to-all overlap with delayed weight gradients, and the data-parallel overlap."""
    lay, tr = job.layout, job.problem.training
    return {"tp_comm_overlap": bool(lay.sp and tr.tp_comm_overlap),
            "overlap_moe_expert_parallel_comm": bool(tr.moe_a2a_overlap),
            "delay_wgrad_compute": bool(tr.moe_a2a_overlap), "overlap_grad_reduce": True,
            "overlap_param_gather": lay.zero >= 1, "bucket_size": dp_bucket_params(job)}


def bridge_limits(job: Job) -> list[str]:
    """What this target cannot write among layouts that pass autoparallel's hard rules: a model
    with no library recipe, and what Megatron-Core refuses (the megatron target's limits)."""
    reasons = []
    if recipe_of(job) is None:
        known = ", ".join(stem for _, stem in RECIPES.values())
        reasons.append(
            f"no Megatron-Bridge {RELEASE} library recipe is known for {job.problem.model.name} "
            f"(the module starts from one: {known}); use --target megatron, which writes the "
            "model's shapes as flags")
    skip = ("MLA without query compression",)  # the recipe builds the model, not flags
    return reasons + [r for r in megatron_limits(job) if not r.startswith(skip)]


class MegatronBridgeExporter(Exporter):
    """A Megatron-Bridge recipe module (`autoparallel_config()` -> `ConfigContainer`) run by
    torchrun on every node."""

    name = "megatron-bridge"
    ignores = MEGATRON_IGNORES
    trains_hybrid = True  # Megatron-Bridge builds hybrid models; none has a recipe here yet
    suffix = ".py"
    uneven_splits = True
    partial_recompute = True
    named_recompute = activation_offload = module_offload = optimizer_offload = True
    summary = "Python module: a Megatron-Bridge library recipe with the plan's ConfigContainer fields"

    def limits(self, job: Job) -> list[str]:
        return bridge_limits(job)

    def text(self, job: Job) -> str:
        package, stem = recipe_of(job)
        recipe = f"{stem}_pretrain_config"
        words = torchrun_words(job)
        words[-1] = words[-1] + [FILE]
        run = [shell_line(w) + (" \\" if i < len(words) - 1 else "")
               for i, w in enumerate(words)]
        notes = [
            (f"Megatron-Bridge {RELEASE}: the library recipe {recipe} with the planned layout "
             "and job settings set field by field (every one, so the recipe's own tuning does "
             "not change the layout)."),
            (f"Megatron derives DP = {job.n_gpus} / (TP {job.layout.tp} x PP {job.layout.pp} x "
             f"CP {job.layout.cp}) = {job.layout.dp} and {job.micro_batches} micro-batches per "
             "step."),
            ("Not set here: data (the recipe's, mock data by default), tokenizer, optimizer "
             "schedule and checkpoints; change them on the returned config."),
            f"Run it (saved as {FILE}) on each node:"]
        head = comments(job.header + notes) + ["#   " + line for line in run]
        imports = [f"from megatron.bridge.recipes.{package} import {recipe}",
                   "from megatron.bridge.training.comm_overlap import CommOverlapConfig",
                   "from megatron.bridge.training.mixed_precision import get_mixed_precision_config"]
        lines = head + ['"""Megatron-Bridge recipe written by autoparallel export."""', "",
                        *imports, "", "", "def autoparallel_config():",
                        f'    """{recipe}() with the plan\'s fields."""', f"    cfg = {recipe}()"]
        lines += [f"    cfg.model.{k} = {v!r}" for k, v in model_fields(job).items()]
        tr = job.problem.training
        lines.append(f"    cfg.mixed_precision = get_mixed_precision_config("
                     f"{PRECISIONS[tr.precision]!r})")
        for section, fields in container_fields(job).items():
            lines += [f"    cfg.{section}.{k} = {v!r}" for k, v in fields.items()]
        lines.append("    cfg.comm_overlap = CommOverlapConfig(")
        lines += [f"        {k}={v!r}," for k, v in comm_overlap_args(job).items()]
        lines.append("    )")
        lines += ["    return cfg", "", "",
                  'if __name__ == "__main__":',
                  "    from megatron.bridge.training.gpt_step import forward_step",
                  "    from megatron.bridge.training.pretrain import pretrain",
                  "",
                  "    pretrain(config=autoparallel_config(), forward_step_func=forward_step)"]
        return "\n".join(lines) + "\n"
