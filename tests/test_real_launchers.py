"""The golden exports read by the launchers' own config classes (DeepSpeed `DeepSpeedConfig`,
TorchTitan 0.3 `ConfigManager`, Megatron-Core `TransformerConfig` / `DistributedDataParallelConfig`,
Nanotron `ParallelismArgs`), compared field by field with the plan.

The launchers live in a separate virtual environment (they need torch): set
AUTOPARALLEL_LAUNCHER_PYTHON to its python (.ci/run builds one with tests/real_launchers/
requirements.txt). Without it every test here skips and says so; a package that cannot be
imported there skips its test with the import error.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from autoparallel import Layout, make_problem
from autoparallel.exporters import render
from launcher_checks import megatron_script_layout

HERE = Path(__file__).parent
GOLDEN = HERE / "golden" / "reference"
PYTHON = os.environ.get("AUTOPARALLEL_LAUNCHER_PYTHON")
pytestmark = pytest.mark.skipif(
    not PYTHON, reason="AUTOPARALLEL_LAUNCHER_PYTHON is not set: no virtual environment with "
    "deepspeed, torchtitan, megatron-core, nanotron (.ci/run builds one)")


def parse(kind: str, *args: str) -> dict:
    r = subprocess.run([PYTHON, str(HERE / "real_launchers" / "check.py"), kind, *args],
                       capture_output=True, text=True, timeout=300)
    line = next((x for x in r.stdout.splitlines() if x.startswith("AUTOPARALLEL-RESULT ")), None)
    assert line is not None, f"{kind} parser failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    out = json.loads(line.removeprefix("AUTOPARALLEL-RESULT "))
    if "skip" in out:
        pytest.skip(f"{kind} cannot be imported in {PYTHON}: {out['skip']}")
    return out


def test_deepspeed_config_accepts_the_zero3_full_recompute_golden():
    got = parse("deepspeed", str(GOLDEN / "deepspeed-dp64-z3-full.json"), "64")
    assert got == dict(train_batch_size=512, micro=1, accum=8, zero=3, overlap_comm=True,
                       bf16=True, offload_optimizer=None, grad_accum_dtype="bf16",
                       reduce_bucket_size=64_000_000, checkpointing=True)


def test_deepspeed_config_accepts_the_optimizer_offload_export(tmp_path):
    p = make_problem("llama3-8b", "h100", 8, seq_len=4096, global_batch=64, stack="deepspeed")
    path = tmp_path / "ds.json"
    path.write_text(render("deepspeed", p, Layout(dp=8, zero=2, optimizer_offload=1.0)))
    got = parse("deepspeed", str(path), "8")
    assert (got["zero"], got["offload_optimizer"], got["micro"]) == (2, "cpu", 1)


def test_megatron_core_accepts_offload_and_named_recompute_exports():
    """TransformerConfig.__post_init__ and OptimizerConfig take the exported offload and named-
    module flags (CPU offloading only without PP and recompute, as Megatron-Core checks)."""
    p = make_problem("llama3-8b", "h100", 8, seq_len=4096, global_batch=64)
    for lay, want in [
        (Layout(tp=1, zero=1, offload_layers=4, optimizer_offload=0.5),
         dict(recompute_modules=["core_attn"], cpu_offloading_num_layers=4,
              optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)),
        (Layout(tp=2, zero=1, recompute="selective", recompute_modules=["layernorm", "mlp"]),
         dict(recompute_modules=["layernorm", "mlp"], cpu_offloading_num_layers=0,
              optimizer_cpu_offload=False, optimizer_offload_fraction=1.0)),
    ]:
        g = vars(megatron_script_layout(render("megatron", p, lay))["args"])
        got = parse("megatron_core", json.dumps(g))
        assert {k: got[k] for k in want} == want


def test_megatron_core_accepts_the_offloaded_modules_export():
    """TransformerConfig.__post_init__ takes the exported fine-grained offload flags (its allowed
    modules, not with layer offload)."""
    p = make_problem("qwen3-30b-a3b", "h100", 8, seq_len=4096, global_batch=64,
                     offload_modules="expert_fc1+moe_act")
    g = vars(megatron_script_layout(render("megatron", p, Layout(tp=1, ep=8, zero=1)))["args"])
    got = parse("megatron_core", json.dumps(g))
    assert got["offload_modules"] == ["expert_fc1", "moe_act"]
    assert got["cpu_offloading_num_layers"] == 0


@pytest.mark.parametrize("job, want", [
    (dict(moe_dispatcher="hybridep", moe_routing="balanced", cuda_graphs="scoped"),
     dict(dispatcher="flex", backend="hybridep", balanced=True, capacity=None, pad=False,
          overlap=False, graphs="transformer_engine")),
    (dict(moe_dispatcher="alltoall", moe_a2a_overlap=True, moe_routing="capacity",
          moe_capacity_factor=1.5),
     dict(dispatcher="alltoall", balanced=False, capacity=1.5, pad=True, overlap=True,
          graphs="none")),
])
def test_megatron_core_accepts_the_moe_settings_export(job, want):
    """TransformerConfig.__post_init__ takes the exported dispatcher, routing, EP overlap and
    CUDA graph flags of an MoE plan (Qwen3-30B-A3B, EP 8)."""
    p = make_problem("qwen3-30b-a3b", "h100", 8, seq_len=4096, global_batch=64, **job)
    g = vars(megatron_script_layout(render("megatron", p, Layout(tp=1, ep=8, zero=1)))["args"])
    got = parse("megatron_moe", json.dumps(g))
    assert {k: got[k] for k in want} == want


def test_torchtitan_03_config_manager_loads_the_golden_module(tmp_path):
    module = tmp_path / "ap_golden.py"
    module.write_text((GOLDEN / "torchtitan.py").read_text())
    got = parse("torchtitan", str(module))
    assert got == dict(model=["llama3", "70B"], dp_shard=2, dp_rep=1, tp=8, pp=4, cp=1,
                       layers_per_stage=4, schedule="Interleaved1F1B", local=256,
                       global_batch=512, seq=8192, ac="SelectiveAC.Config")


def test_torchtitan_03_loads_forced_balanced_routing(tmp_path):
    """A plan that assumed forced-balanced routing (Qwen3-30B-A3B, EP 8) exports it, and
    TorchTitan 0.3's ConfigManager reads it back (DebugConfig.moe_force_load_balance)."""
    p = make_problem("qwen3-30b-a3b", "h100", 8, seq_len=4096, global_batch=64,
                     stack="torchtitan", moe_routing="balanced")
    module = tmp_path / "ap_balanced.py"
    module.write_text(render("torchtitan", p, Layout(tp=1, ep=8, zero=3)))
    got = parse("torchtitan", str(module))
    assert got["moe_force_load_balance"] is True and got["model"] == ["qwen3", "30B-A3B"]


@pytest.mark.parametrize("split, less", [
    ([21, 20, 20, 19], (0, 1)),  # E = 81 over 4 stages: 20 each, the remainder to the first
    ([19, 21, 21, 19], (2, 2)),  # E = 84 over 4 stages: 21 each, embedding and output weigh 2
])
def test_torchtitan_03_splits_an_uneven_export_as_planned(tmp_path, split, less):
    """TorchTitan 0.3's ConfigManager loads an uneven-split export of Llama-3-70B (80 layers,
    pp 4), and TorchTitan's own split functions place exactly `stage_layers` on the ranks, the
    embedding on the first stage and the output on the last. (The 405B registry config needs
    torchao for its float8 converter, absent here; the split code does not depend on the size.)"""
    p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
    module = tmp_path / "ap_uneven.py"
    module.write_text(render("torchtitan", p, Layout(tp=8, pp=4, zero=1, stage_layers=split)))
    got = parse("torchtitan_split", str(module))
    assert got == dict(stages=4, layers=80, first_less=less[0], last_less=less[1],
                       chunks=split, ranks=split, embedding=[0], output=[3])


@pytest.mark.parametrize("grad_dtype", ["bf16", "fp32"])
def test_megatron_core_builds_the_planned_model_from_the_script(grad_dtype):
    """Megatron-LM's own parser is not in the megatron-core wheel (megatron/training is not
    packaged); the flags, read by tests/launcher_checks.py's mirror of it, build Megatron-Core's
    TransformerConfig and DDP config as Megatron-LM does."""
    p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512,
                     grad_dtype=grad_dtype)
    lay = Layout(tp=8, pp=4, vp=5, zero=1, recompute="selective")
    # the golden is the megatron-core stack's default (fp32 main gradients)
    text = (GOLDEN / "megatron.sh").read_text() if grad_dtype == "fp32" else render("megatron", p, lay)
    g = vars(megatron_script_layout(text)["args"])
    got = parse("megatron_core", json.dumps(g))
    assert got == dict(normalization="RMSNorm", add_bias_linear=False, gated=True, groups=8,
                       kv=128, ffn=28672, grad_reduce_in_fp32=grad_dtype == "fp32",
                       dist_opt=True, bucket=40_000_000, recompute_modules=["core_attn"],
                       cpu_offloading_num_layers=0, optimizer_cpu_offload=False,
                       optimizer_offload_fraction=1.0)


@pytest.mark.parametrize("model, gpus, pp, vp, split, flag", [
    # Llama-3.1-405B, 126 layers: (126 + 2) / 16 = 8 per rank with the embedding and loss
    # counted as layers (Megatron-Bridge's 405B recipes), rank 0's first and rank 15's last
    # chunk one short; vp 1 takes the first/last-stage counts
    ("llama3-405b", 2048, 16, 8, [7] + [8] * 14 + [7], "--account-for-embedding-in-pipeline-split"),
    ("llama3-405b", 2048, 16, 1, [7] + [8] * 14 + [7], "--decoder-first-pipeline-num-layers"),
    ("llama3-405b", 2048, 16, 2, [8] * 15 + [6], "--decoder-first-pipeline-num-layers"),
    # Llama-3-70B, 80 layers on pp 4 vp 4 as 19, 20, 20, 21: neither form reaches it, the
    # layout string deals rank 3's 21 layers as 6, 5, 5, 5
    ("llama3-70b", 64, 4, 4, [19, 20, 20, 21], "--pipeline-model-parallel-layout"),
])
def test_megatron_core_builds_the_planned_split_on_every_rank(model, gpus, pp, vp, split, flag):
    """Megatron-Core's TransformerConfig takes the exported split flags (its own consistency
    checks) and `get_num_layers_to_build`, which each rank calls for each model chunk, places
    exactly the planned layers per rank, with the chunks of a rank within one layer."""
    p = make_problem(model, "h100", gpus, seq_len=8192, global_batch=2048)
    text = render("megatron", p, Layout(tp=8, pp=pp, vp=vp, zero=1, stage_layers=split))
    assert flag in text
    g = vars(megatron_script_layout(text)["args"])
    got = parse("megatron_split", json.dumps(g))
    assert got["vp"] == vp and got["ranks"] == split
    assert all(max(c) - min(c) <= 1 for c in got["chunks"])


def test_nanotron_parallelism_args_accept_the_golden():
    got = parse("nanotron", str(GOLDEN / "nanotron-vp1-no-recompute.yaml"))
    assert got == dict(dp=2, tp=8, pp=4)


def test_deepspeed_reads_a_ulysses_export_with_its_own_config_parser(tmp_path):
    """A DeepSpeed-Ulysses layout (cp 8 as a2a, ZeRO-3) exports `sequence_parallel_size`; DeepSpeed's
    DeepSpeedConfig, built as the Hugging Face integration builds it (a dict, no mpu), takes the
    data-parallel size as world / sequence_parallel_size = 64 / 8 and its batch check holds
    (16 = 1 x 2 x 8); without the key the same file fails that check."""
    p = make_problem("llama3-8b", "h100", 64, seq_len=32768, global_batch=16, stack="deepspeed")
    path = tmp_path / "ds.json"
    path.write_text(render("deepspeed", p, Layout(cp=8, cp_comm="a2a", zero=3)))
    got = parse("deepspeed_sp", str(path), "64")
    assert got == dict(world_size=8, sequence_parallel_size=8, train_batch_size=16, micro=1,
                       accum=2, zero=3)
    bad = json.loads(path.read_text())
    bad["sequence_parallel_size"] = 1  # a world of 64 data-parallel ranks: 16 != 1 x 2 x 64
    path.write_text(json.dumps(bad))
    r = subprocess.run([PYTHON, str(HERE / "real_launchers" / "check.py"), "deepspeed_sp",
                        str(path), "64"], capture_output=True, text=True, timeout=300)
    assert "AUTOPARALLEL-RESULT" not in r.stdout and "train_batch_size" in r.stderr


@pytest.mark.parametrize("layout, comm, hier", [
    (Layout(tp=2, cp=4, cp_comm="a2a+ring", cp_a2a=2), "a2a+p2p", [2, 2]),
    (Layout(tp=1, cp=8, cp_comm="a2a"), "a2a", None),
    (Layout(tp=2, cp=4, cp_comm="allgather"), "all_gather", None),
    (Layout(tp=2, cp=4), "p2p", None),
])
def test_megatron_core_takes_the_exported_cp_form(layout, comm, hier):
    """Megatron-Core's TransformerConfig accepts the exported --cp-comm-type (the value Transformer
    Engine's attn_forward_func_with_cp accepts) and hierarchical sizes."""
    p = make_problem("llama3-8b", "h100", 64, seq_len=32768, global_batch=16)
    g = vars(megatron_script_layout(render("megatron", p, layout))["args"])
    got = parse("megatron_core_cp", json.dumps(g))
    assert got == dict(cp=layout.cp, cp_comm_type=comm, hierarchical=hier)


def test_torchtitan_03_loads_an_allgather_cp_export(tmp_path):
    """TorchTitan 0.3's ConfigManager loads a cp 8 export (its one form, the all-gather)."""
    p = make_problem("llama3-8b", "h100", 64, seq_len=32768, global_batch=16, stack="torchtitan")
    module = tmp_path / "ap_cp.py"
    module.write_text(render("torchtitan", p, Layout(tp=8, cp=8, cp_comm="allgather", zero=1)))
    got = parse("torchtitan", str(module))
    assert (got["cp"], got["tp"], got["dp_shard"]) == (8, 8, 1)


BRIDGE_SHAPES = {
    "llama3-70b": dict(layers=80, hidden=8192, ffn=28672, heads=64, groups=8,
                       package="llama", stem="llama3_70b"),
    "qwen3-235b-a22b": dict(layers=94, hidden=4096, ffn=12288, heads=64, groups=4, experts=128,
                            topk=8, moe_ffn=1536, package="qwen", stem="qwen3_235b_a22b"),
}
"""Shapes of the Hugging Face configs the recipes build (config.json of meta-llama/Meta-Llama-3-70B
and Qwen/Qwen3-235B-A22B), for Megatron-Core's TransformerConfig."""


@pytest.mark.parametrize("model, n, lay, precision, want", [
    ("llama3-70b", 64, Layout(tp=8, pp=4, vp=5, recompute="selective"), "mxfp8",
     dict(tp=8, sp=True, pp=4, vp=5, ranks=[20] * 4, fp8="e4m3", fp8_recipe="mxfp8",
          recompute="selective", recompute_modules=["core_attn"], dist_opt=True, fsdp=False)),
    ("llama3-70b", 64, Layout(tp=8, pp=1, cp=8, cp_comm="allgather", zero=3, recompute="full"), "bf16",
     dict(tp=8, pp=1, cp=8, cp_comm_type="all_gather", fsdp=True, sharding="optim_grads_params",
          dist_opt=False, recompute="full", fp8=None)),
    ("qwen3-235b-a22b", 256, Layout(tp=1, pp=8, vp=4, ep=8, stage_layers=[12] * 7 + [10]), "fp8",
     dict(pp=8, vp=4, ranks=[12] * 7 + [10], ep=8, etp=1, dispatcher="alltoall",
          fp8="hybrid", fp8_recipe="tensorwise", tp_overlap=False)),
])
def test_megatron_core_builds_the_megatron_bridge_module(tmp_path, model, n, lay, precision, want):
    """The megatron-bridge module run against Megatron-Core's TransformerConfig, DDP and optimizer
    configs (and stand-ins that take only Megatron-Bridge v0.6.0's own field and preset names):
    every field exists, TransformerConfig's checks pass on the result, and each pipeline rank
    builds the planned layers."""
    gpu = "b200" if precision == "mxfp8" else "h100"
    p = make_problem(model, gpu, n, seq_len=8192 if model == "llama3-70b" else 4096,
                     global_batch=512 if n == 64 else 2048, stack="megatron-bridge",
                     precision=precision)
    path = tmp_path / "train_bridge.py"
    path.write_text(render("megatron-bridge", p, lay))
    got = parse("megatron_bridge", str(path), json.dumps(BRIDGE_SHAPES[model]))
    assert {k: got[k] for k in want} == want
    assert (got["ddp_fp32"], got["mp_fp32"]) == (False, False)  # the stack's bf16 gradients
    assert (got["seq"], got["mb"]) == (p.training.seq_len, 1)
