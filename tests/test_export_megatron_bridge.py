"""The megatron-bridge export target: a Python module that builds a Megatron-Bridge v0.6.0 library
recipe and sets the plan's fields on its ConfigContainer.

Here the module runs against stand-ins that record what it sets (tests/launcher_checks.py) (the expected values are the
layout's own numbers and Megatron-Bridge's names, written out below from its v0.6.0 sources, not
read from the exporter); `test_real_launchers.py` runs it against Megatron-Core's real
TransformerConfig, DDP and optimizer configs.
"""

import re
import types

import pytest
from launcher_checks import bridge_module_values

from autoparallel import Layout, make_problem
from autoparallel.errors import ExportError
from autoparallel.exporters import render, targets_for


def run_module(text: str, package: str, recipe: str):
    """The exported module run with stand-in Megatron-Bridge modules (`launcher_checks`): the
    config sections it set (attributes) and the named precision preset."""
    assert f"from megatron.bridge.recipes.{package} import {recipe}" in text
    sections, imported, preset, overlap = bridge_module_values(text)
    assert imported == recipe
    cfg = types.SimpleNamespace(**{k: types.SimpleNamespace(**v) for k, v in sections.items()},
                                comm_overlap=types.SimpleNamespace(**overlap))
    return cfg, [preset]


def test_dense_interleaved_fp8_layout_sets_every_planned_field():
    """Llama-3 70B on 64 H100, TP8 PP4 VP5 with selective recompute, FP8 on the megatron-bridge
    stack (bf16 gradients, TP overlap, fp8 parameter gather: its preset)."""
    p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512,
                     stack="megatron-bridge", precision="fp8")
    text = render("megatron-bridge", p, Layout(tp=8, pp=4, vp=5, recompute="selective"))
    assert "from megatron.bridge.recipes.llama import llama3_70b_pretrain_config" in text
    cfg, presets = run_module(text, "llama", "llama3_70b_pretrain_config")
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.sequence_parallel, m.pipeline_model_parallel_size,
            m.virtual_pipeline_model_parallel_size, m.context_parallel_size) == (8, True, 4, 5, 1)
    assert (m.num_layers_in_first_pipeline_stage, m.pipeline_model_parallel_layout) == (None, None)
    assert (m.recompute_granularity, m.recompute_modules) == ("selective", ["core_attn"])
    assert m.seq_length == cfg.dataset.seq_length == 8192
    assert (cfg.train.micro_batch_size, cfg.train.global_batch_size) == (1, 512)
    # ZeRO-1 = the distributed optimizer; bf16 gradients in both places Megatron-Bridge keeps them
    assert cfg.ddp.use_distributed_optimizer and not cfg.ddp.use_megatron_fsdp
    assert cfg.ddp.grad_reduce_in_fp32 is False and cfg.mixed_precision.grad_reduce_in_fp32 is False
    assert presets == ["bf16_with_fp8_current_scaling_mixed"]  # per-tensor current scaling
    assert cfg.mixed_precision.fp8_param_gather is True
    assert cfg.comm_overlap.tp_comm_overlap is True
    assert not hasattr(m, "expert_model_parallel_size")  # a dense model writes no MoE field


def test_deepseek_v3_folded_uneven_layout_of_issue_20():
    """The DeepSeek-V3 layout of issue 20 (TP2 PP16 EP64 ETP1 DP32, 61 layers): the balanced
    uneven split as first / last stage layers, parallel folding, the DeepEP flex dispatcher."""
    p = make_problem("deepseek-v3", "h100", 1024, seq_len=4096, global_batch=8192,
                     stack="megatron-bridge", moe_dispatcher="deepep")
    lay = Layout(tp=2, pp=16, ep=64, etp=1, dp=32, zero=1, recompute="selective")
    cfg, presets = run_module(render("megatron-bridge", p, lay), "deepseek",
                              "deepseek_v3_pretrain_config")
    m = cfg.model
    first, last = m.num_layers_in_first_pipeline_stage, m.num_layers_in_last_pipeline_stage
    assert first + last + 14 * ((61 - first - last) // 14) == 61  # the middle stages even
    assert (m.expert_model_parallel_size, m.expert_tensor_parallel_size) == (64, 1)
    assert (m.moe_token_dispatcher_type, m.moe_flex_dispatcher_backend) == ("flex", "deepep")
    assert m.moe_router_force_load_balancing is True  # the stack's balanced routing
    assert presets == ["bf16_mixed"]


def test_zero3_writes_megatron_fsdp_and_its_checkpoint_format():
    p = make_problem("llama3-8b", "h100", 8, seq_len=4096, global_batch=64,
                     stack="megatron-bridge")
    cfg, _ = run_module(render("megatron-bridge", p, Layout(dp=8, zero=3, recompute="full")),
                        "llama", "llama3_8b_pretrain_config")
    assert cfg.ddp.use_megatron_fsdp and not cfg.ddp.use_distributed_optimizer
    assert cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params"
    assert cfg.checkpoint.ckpt_format == "fsdp_dtensor"
    assert (cfg.model.recompute_granularity, cfg.model.recompute_method,
            cfg.model.recompute_num_layers) == ("full", "uniform", 1)


def test_a_layout_string_split_leaves_vp_to_the_layout():
    """Qwen3-235B (94 layers) on PP8 VP4: the split no first/last counts or accounting can give is
    written as Megatron-Core's layout string, which sets VP itself (vp must then be None or
    equal)."""
    p = make_problem("qwen3-235b-a22b", "h100", 256, seq_len=4096, global_batch=2048,
                     stack="megatron-bridge")
    lay = Layout(tp=1, pp=8, vp=4, ep=8, stage_layers=[12] * 7 + [10])
    cfg, _ = run_module(render("megatron-bridge", p, lay), "qwen", "qwen3_235b_a22b_pretrain_config")
    m = cfg.model
    assert m.virtual_pipeline_model_parallel_size is None
    assert m.num_layers_in_first_pipeline_stage is None and not m.account_for_loss_in_pipeline_split
    # expand Megatron-Core's '(X|)*n' repeats; stage i is a chunk of rank i % pp
    text = re.sub(r"\(([^()|]*)\|\)\*(\d+)", lambda g: (g[1] + "|") * int(g[2]),
                  m.pipeline_model_parallel_layout)
    stages = text.split("|")
    assert len(stages) == 8 * 4
    layers = [sum(int(k or 1) for k in re.findall(r"t(?:\*(\d+))?", st)) for st in stages]
    assert [sum(layers[r::8]) for r in range(8)] == [12] * 7 + [10]
    assert stages[0].startswith("E") and stages[-1].endswith("L")


def test_models_without_a_recipe_are_refused_naming_the_ones_with():
    p = make_problem("llama4-scout", "h100", 64, seq_len=8192, global_batch=512)
    with pytest.raises(ExportError) as e:
        render("megatron-bridge", p, Layout(tp=8, recompute="full"))
    msg = str(e.value)
    assert "library recipe" in msg and "llama3_70b" in msg and "--target megatron" in msg
    assert "megatron-bridge" not in targets_for(p, Layout(tp=8, recompute="full"))


def test_megatron_fsdp_with_moe_is_refused_as_megatron_core_refuses_it():
    p = make_problem("qwen3-30b-a3b", "h100", 16, seq_len=4096, global_batch=512,
                     stack="megatron-bridge")
    with pytest.raises(ExportError, match="Megatron-FSDP"):
        render("megatron-bridge", p, Layout(dp=16, ep=8, zero=3, recompute="full"))
