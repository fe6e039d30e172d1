"""Exporters: every file they write is read back by an independent reader of that launcher
(tests/launcher_checks.py, written from launchers.md) and must start exactly the layout that was
exported; what a target refuses, it refuses with reasons and without writing anything."""

import numpy as np
import pytest

from autoparallel import ExportError, Layout, make_problem
from autoparallel.errors import SpecError
from autoparallel.exporters import EXPORTERS, Job, check, render, targets_for
from autoparallel.exporters._base import HARD_RULES
from autoparallel.cost.model_arch import build_arch
from autoparallel.rules import RULE_BY_NAME, check_rules
from autoparallel.search.enumerate import enumerate_layouts
from launcher_checks import (
    LaunchRejected, deepspeed_layout, megatron_bridge_layout, megatron_script_layout,
    nanotron_layout, sbatch_layout,
    torchtitan_layout, torchtitan_module_layout,
)
from autoparallel.exporters.megatron_bridge import recipe_of
from autoparallel.exporters.torchtitan import flavor_of

PROBLEMS = {
    "llama3-70b/64": ("llama3-70b", "h100", 64, 8192, 512),
    "llama3-8b/8": ("llama3-8b", "h100", 8, 4096, 64),
    "llama3-8b/4": ("llama3-8b", "h100", 4, 2048, 32),
    "mixtral/64": ("mixtral-8x7b", "h100", 64, 4096, 256),
    "deepseek-v3/256": ("deepseek-v3", "h100", 256, 4096, 1024),
    "gpt3/128": ("gpt3-175b", "a100-80gb", 128, 2048, 1536),
}
AXES = ("dp", "tp", "pp", "vp", "cp", "cp_comm", "cp_a2a", "ep", "etp", "zero", "recompute",
        "sp", "micro_batch")


def sample_layouts(problem, n=120, seed=0):
    """A deterministic sample of the layouts that pass autoparallel's hard rules."""
    table = enumerate_layouts(problem)
    rules = tuple(RULE_BY_NAME[r] for r in HARD_RULES)
    ok = np.flatnonzero(check_rules(problem, build_arch(problem.model), table, rules) == 0)
    pick = np.random.default_rng(seed).choice(ok, size=min(n, len(ok)), replace=False)
    return [table.row(int(i)) for i in sorted(pick)]


def read_back(target, text, problem):
    """The layout the launcher would start from `text`."""
    world = problem.cluster.n_gpus
    if target == "megatron":
        return megatron_script_layout(text)
    if target == "slurm":
        return sbatch_layout(text)
    if target == "torchtitan":
        return torchtitan_module_layout(text, world, problem.model.n_layers)
    if target == "torchtitan@0.2.2":
        return torchtitan_layout(text, world, problem.model.n_layers)
    if target == "deepspeed":
        return deepspeed_layout(text, world)
    if target == "megatron-bridge":
        return megatron_bridge_layout(text, problem.model)
    return nanotron_layout(text, world)


TORCHTITAN_ZERO = {0: 0, 1: 2, 2: 2, 3: 3}
"""The documented mapping (docs/export.md): TorchTitan has no ZeRO-1 mode; ZeRO-1 becomes FSDP
with parameters kept after forward (ZeRO-2 behaviour). With no data-parallel group there is
nothing to shard and FSDP is off."""


def expected(problem, layout, target):
    job = Job.of(problem, layout)
    lay = job.layout.model_dump()
    lay["recompute"] = str(job.layout.recompute)
    lay["cp_comm"] = job.layout.cp_form.value if job.layout.cp > 1 else None
    lay["etp"] = job.layout.expert_tp
    axes = AXES
    if target.startswith("torchtitan"):
        lay["zero"] = TORCHTITAN_ZERO[lay["zero"]] if job.data_group > 1 else 0
    if target.startswith(("torchtitan", "megatron", "slurm")):  # megatron-bridge too
        axes += ("stage_layers",)  # the reader replays the launcher's own split
    return {k: lay[k] for k in axes} | {"micro_batches": job.micro_batches, "world": job.n_gpus}


def assert_same_layout(got, problem, layout, target):
    want = expected(problem, layout, target)
    assert {k: got[k] for k in want} == want
    if "global_batch" in got:
        assert got["global_batch"] == problem.training.global_batch


@pytest.mark.parametrize("name", PROBLEMS)
@pytest.mark.parametrize("target", list(EXPORTERS) + ["torchtitan@0.2.2"])
def test_every_export_reads_back_as_the_same_layout(name, target):
    problem = make_problem(*PROBLEMS[name][:3], seq_len=PROBLEMS[name][3],
                           global_batch=PROBLEMS[name][4])
    written = refused = 0
    base, _, version = target.partition("@")
    for layout in sample_layouts(problem):
        reasons = check(base, problem, layout, version or None)
        if reasons:
            refused += 1
            with pytest.raises(ExportError) as exc:
                render(base, problem, layout, version or None)
            assert all(r in str(exc.value) for r in reasons)
            continue
        text = render(base, problem, layout, version or None)
        got = read_back(target, text, problem)
        assert_same_layout(got, problem, layout, target)
        written += 1
    assert written + refused > 0
    if base == "torchtitan" and flavor_of(Job.of(problem, Layout())) is None:
        # TorchTitan builds models from its registry only: no flavor, no export (docs/export.md)
        assert written == 0
    elif base in ("megatron", "slurm", "torchtitan"):
        assert written > 0, f"{target} wrote nothing for {name}"
    elif base == "megatron-bridge" and recipe_of(Job.of(problem, Layout())) is not None:
        assert written > 0, f"{target} wrote nothing for {name}"


@pytest.mark.parametrize("name", PROBLEMS)
def test_what_deepspeed_and_nanotron_can_express(name):
    """launchers.md §0/§4/§5: DeepSpeed's JSON = data parallelism + ZeRO only; Nanotron has no VP,
    no selective recompute, no EP, ZeRO 0/1, KV heads >= TP."""
    problem = make_problem(*PROBLEMS[name][:3], seq_len=PROBLEMS[name][3],
                           global_batch=PROBLEMS[name][4])
    for layout in sample_layouts(problem, n=60, seed=1):
        lay = layout.resolved(problem.cluster.n_gpus)
        # DeepSpeed's one context-parallel form is Ulysses (sequence_parallel_size: a2a)
        ulysses = lay.cp == 1 or lay.cp_form.value == "a2a"
        pure_dp = (lay.tp, lay.pp, lay.ep, lay.expert_tp) == (1, 1, 1, 1) and ulysses \
            and lay.recompute != "selective"
        assert (not check("deepspeed", problem, layout)) == pure_dp, lay.slug
        nano_ok = (lay.vp == 1 and lay.recompute != "selective" and lay.ep == 1 and lay.zero <= 1
                   and lay.etp is None  # no parallel folding: experts follow TP
                   and lay.pipeline_schedule == "1f1b" and not lay.stage_layers
                   and not (lay.zero == 1 and lay.cp > 1) and problem.model.kv_heads >= lay.tp
                   and problem.model.activation == "swiglu"  # Nanotron's Llama is gated-SiLU
                   and (lay.cp == 1 or lay.cp_form.value == "allgather"))  # llama3_ring_attention
        assert (not check("nanotron", problem, layout)) == nano_ok, lay.slug


def test_megatron_model_shape_flags():
    """The model flags describe the model: GQA groups, MoE experts, top-k, shared experts and the
    dense-then-MoE layer pattern, MLA ranks."""
    problem = make_problem("deepseek-v3", "h100", 256, seq_len=4096, global_batch=1024)
    g = megatron_script_layout(render("megatron", problem, Layout(tp=8, ep=8, recompute="full")))["args"]
    m = problem.model
    assert (g.num_layers, g.hidden_size, g.ffn_hidden_size, g.num_attention_heads) == (
        m.n_layers, m.hidden_size, m.ffn_hidden_size, m.n_heads)
    assert (g.num_experts, g.moe_router_topk, g.moe_ffn_hidden_size) == (256, 8, 2048)
    assert g.moe_shared_expert_intermediate_size == 2048
    # Megatron evaluates the pattern string as a Python list expression (`moe_freq_type`)
    assert eval(g.moe_layer_freq, {"__builtins__": {}}) == [0] * 3 + [1] * 58
    assert g.multi_latent_attention and (g.q_lora_rank, g.kv_lora_rank) == (1536, 512)
    assert (g.qk_head_dim, g.qk_pos_emb_head_dim, g.v_head_dim) == (128, 64, 128)
    # HF rope_scaling: YaRN factor 40, mscale = mscale_all_dim = 1 (MLA's own arguments)
    assert (g.rope_type, g.rotary_scaling_factor, g.mscale, g.mscale_all_dim) == ("yarn", 40, 1, 1)
    assert g.moe_token_dispatcher_type == "alltoall" and g.swiglu
    assert g.untie_embeddings_and_output_weights and g.attention_dropout == 0.0

    dense = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
    g = megatron_script_layout(render("megatron", dense, Layout(tp=8, pp=4)))["args"]
    assert g.group_query_attention and g.num_query_groups == 8 and g.num_experts is None


def test_megatron_moe_layer_pattern_of_interleaved_models():
    """Llama-4 Maverick (HF `interleave_moe_layer_step` 2: layer_idx + 1 divisible by 2 is MoE):
    24 dense and 24 MoE layers alternating, dense first, as the cost model places them
    (`Arch.n_moe_layers`); a made-up step 3 after 4 leading dense layers leaves the 2 layers after
    the last whole group dense."""
    problem = make_problem("llama4-maverick", "h100", 128, seq_len=8192, global_batch=512)
    g = megatron_script_layout(render("megatron", problem, Layout(tp=8, ep=16, recompute="full")))["args"]
    pattern = eval(g.moe_layer_freq, {"__builtins__": {}})
    assert pattern == [0, 1] * 24 and sum(pattern) == build_arch(problem.model).n_moe_layers
    spec = problem.model.model_copy(update={"moe": problem.model.moe.model_copy(
        update={"layer_step": 3, "n_dense_layers": 4})})
    odd = make_problem(spec, "h100", 128, seq_len=8192, global_batch=512)
    g = megatron_script_layout(render("megatron", odd, Layout(tp=8, ep=16, recompute="full")))["args"]
    pattern = eval(g.moe_layer_freq, {"__builtins__": {}})
    assert pattern == [0] * 4 + [0, 0, 1] * 14 + [0] * 2
    assert sum(pattern) == build_arch(odd.model).n_moe_layers == 14


def test_megatron_refuses_fsdp_with_interleaving_and_moe():
    p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
    reasons = check("megatron", p, Layout(tp=8, pp=4, vp=5, zero=3))
    assert len(reasons) == 1 and "Megatron-FSDP" in reasons[0] and "vp = 5" in reasons[0]
    assert not check("megatron", p, Layout(tp=8, pp=4, zero=3))
    moe = make_problem("mixtral-8x7b", "h100", 64, seq_len=4096, global_batch=256)
    assert "MoE" in check("megatron", moe, Layout(tp=2, pp=4, zero=2))[0]


def test_torchtitan_zero_mapping_and_refusals():
    p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
    for zero, reshard in ((1, "never"), (2, "never"), (3, "always")):
        cfg = torchtitan_layout(render("torchtitan", p, Layout(tp=8, pp=4, zero=zero), "0.2"),
                                64, 80)
        assert cfg["config"]["parallelism"]["fsdp_reshard_after_forward"] == reshard
        assert f"ZeRO-{zero} -> FSDP" in render("torchtitan", p, Layout(tp=8, pp=4, zero=zero))
    assert "without sequence parallelism" in check("torchtitan", p, Layout(tp=8, pp=4, sp=False))[0]
    assert "1-D only" in check("torchtitan", p, Layout(tp=8, pp=4, zero=0))[0]
    small = make_problem("llama3-8b", "h100", 8, seq_len=4096, global_batch=64)
    ddp = torchtitan_layout(render("torchtitan", small, Layout(zero=0), "0.2.2"), 8, 32)
    assert ddp["config"]["parallelism"]["data_parallel_replicate_degree"] == 8 and ddp["zero"] == 0


def test_render_refusal_names_reasons_and_the_targets_that_can():
    p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
    lay = Layout(tp=8, pp=4, vp=5, recompute="selective")
    with pytest.raises(ExportError) as exc:
        render("deepspeed", p, lay)
    msg = str(exc.value)
    assert msg.splitlines()[0] == "deepspeed cannot launch dp2-tp8-pp4-vp5-cp1-ep1-z1-rselective-sp-mb1:"
    assert "tensor parallelism (tp = 8)" in msg and "pipeline parallelism (pp = 4, vp = 5)" in msg
    assert msg.splitlines()[-1] == ("targets that can launch it: megatron, torchtitan, slurm, "
                                   "megatron-bridge")
    assert targets_for(p, lay) == ["megatron", "torchtitan", "slurm", "megatron-bridge"]
    with pytest.raises(ExportError, match="no target can launch it"):
        render("megatron", p, Layout(tp=8, pp=3))
    with pytest.raises(ExportError, match="unknown export target 'titan'"):
        render("titan", p, lay)


def test_single_node_script_is_standalone_and_multi_node_uses_c10d():
    small = make_problem("llama3-8b", "h100", 4, seq_len=2048, global_batch=32)
    text = render("megatron", small, Layout(tp=2))
    assert "torchrun --standalone --nnodes 1 --nproc-per-node 4" in text
    got = megatron_script_layout(text)
    assert (got["nodes"], got["per_node"], got["world"]) == (1, 4, 4)
    sb = sbatch_layout(render("slurm", small, Layout(tp=2)))
    assert (sb["nodes"], sb["per_node"]) == (1, 4)


def test_nvl72_jobs_come_in_trays_of_four_gpus():
    """A GB200/GB300 NVL72 rack is 18 compute trays of 4 GPUs (NVIDIA GB200 NVL72 product page;
    every shipped GB200/GB300 run states 4 GPUs per node): without --gpus-per-node a job on 72
    of them is 18 nodes of 4, which the Slurm and torchrun lines ask for, and half a rack (36)
    is whole nodes. HGX/DGX boards stay 8 per node, and 36 H100 are refused with the counts of
    whole nodes around it."""
    rack = make_problem("llama3-8b", "gb200", 72, seq_len=4096, global_batch=72)
    assert rack.cluster.gpus_per_node == 4
    assert make_problem("llama3-8b", "gb300", 36, seq_len=4096, global_batch=72).cluster.gpus_per_node == 4
    assert make_problem("llama3-8b", "b200", 64, seq_len=4096, global_batch=64).cluster.gpus_per_node == 8
    sb = sbatch_layout(render("slurm", rack, Layout(tp=4)))
    assert (sb["nodes"], sb["per_node"]) == (18, 4)
    got = megatron_script_layout(render("megatron", rack, Layout(tp=4)))
    assert (got["nodes"], got["per_node"], got["world"]) == (18, 4, 72)
    # an explicit node size still wins, and the TP rule follows the NVLink domain (72), not the tray
    assert make_problem("llama3-8b", "gb200", 72, seq_len=4096, global_batch=72,
                        gpus_per_node=8).cluster.gpus_per_node == 8
    assert rack.cluster.nvlink_domain == 72
    with pytest.raises(SpecError, match=r"not a multiple of `gpus_per_node` \(8\).*try 32 or 40"):
        make_problem("llama3-8b", "h100", 36, seq_len=4096, global_batch=72)


def test_reader_rejects_a_tampered_export():
    """The readers are not rubber stamps: a file edited into an invalid launch is rejected."""
    p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
    text = render("megatron", p, Layout(tp=8, pp=4, vp=5, recompute="selective"))
    with pytest.raises(LaunchRejected, match="M >= PP"):
        megatron_script_layout(text.replace("--global-batch-size 512", "--global-batch-size 6"))
    with pytest.raises(LaunchRejected, match="CUDA_DEVICE_MAX_CONNECTIONS"):
        megatron_script_layout(text.replace("export CUDA_DEVICE_MAX_CONNECTIONS=1\n", ""))
    with pytest.raises(LaunchRejected, match="unrecognized arguments"):
        megatron_script_layout(text.replace("--bf16", "--bf16 --not-a-megatron-flag"))
    toml = render("torchtitan", p, Layout(tp=8, pp=4, vp=5), "0.2.2")
    with pytest.raises(LaunchRejected, match="stages"):
        torchtitan_layout(toml.replace("less_layers = 0", "less_layers = 1"), 64, 80)
    module = render("torchtitan", p, Layout(tp=8, pp=4, vp=5))
    with pytest.raises(LaunchRejected, match="CUDA graphs"):
        torchtitan_module_layout(module.replace("disable_cuda_graphs = True", "steps = 10"), 64, 80)
    small = make_problem("llama3-8b", "h100", 8, seq_len=4096, global_batch=64)
    js = render("deepspeed", small, Layout(zero=2))
    with pytest.raises(LaunchRejected, match="train_batch_size"):
        deepspeed_layout(js.replace('"gradient_accumulation_steps": 8', '"gradient_accumulation_steps": 4'), 8)


@pytest.mark.parametrize("name", PROBLEMS)
def test_deepspeed_writes_every_pure_data_parallel_layout(name):
    problem = make_problem(*PROBLEMS[name][:3], seq_len=PROBLEMS[name][3],
                           global_batch=PROBLEMS[name][4])
    table = enumerate_layouts(problem)
    rules = tuple(RULE_BY_NAME[r] for r in HARD_RULES)
    ok = check_rules(problem, build_arch(problem.model), table, rules) == 0
    pure = ok & (table["tp"] == 1) & (table["pp"] == 1) & (table["cp"] == 1) & (table["ep"] == 1)
    pure &= table["etp"] == 1  # no expert TP either (parallel folding is Megatron's)
    pure &= table["rc"] != 1  # selective recompute is the model's business in DeepSpeed
    rows = np.flatnonzero(pure)
    assert len(rows) > 0
    for i in rows:
        layout = table.row(int(i))
        got = deepspeed_layout(render("deepspeed", problem, layout), problem.cluster.n_gpus)
        assert_same_layout(got, problem, layout, "deepspeed")


@pytest.mark.parametrize("name", list(EXPORTERS))
def test_exporter_contract(name):
    """Registry entries follow the `Exporter` contract: name, suffix, summary, check -> list of
    reasons, render -> text in the suffix's format (or ExportError with the reasons)."""
    exporter = EXPORTERS[name]
    assert exporter.name == name and exporter.suffix in (".sh", ".toml", ".py", ".json", ".yaml")
    assert exporter.summary
    small = make_problem("llama3-8b", "h100", 8, seq_len=4096, global_batch=64)
    layout = Layout(zero=1)  # plain data parallelism: every target can express it
    assert exporter.check(small, layout) == []
    text = exporter.render(small, layout)
    assert text == render(name, small, layout) and text.endswith("\n")
    if exporter.suffix == ".sh":
        assert text.startswith("#!")
    bad = Layout(tp=3)
    assert exporter.check(small, bad) and all(isinstance(r, str) for r in exporter.check(small, bad))
    with pytest.raises(ExportError):
        exporter.render(small, bad)


@pytest.mark.parametrize("value", ["90", "45:30", "2:00:00", "1:90:00", "3-12", "1-0:30",
                                   "2-04:00:00", "UNLIMITED", "infinite"])
def test_sbatch_time_takes_every_form_sbatch_parses(value):
    """sbatch(1) --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, and no limit as
    INFINITE / UNLIMITED in any case (SLURM src/common/parse_time.c `time_str2secs`, which sums
    the fields unbounded, so 1:90:00 is 2 h 30 min). Each is written as given."""
    small = make_problem("llama3-8b", "h100", 16, seq_len=2048, global_batch=32)
    text = render("slurm", small, Layout(tp=2), time=value)
    assert f"#SBATCH --time={value}\n" in text
    assert sbatch_layout(text)["nodes"] == 2


@pytest.mark.parametrize("option, value", [("time", "2h"), ("time", "1:2:3:4"), ("time", "1:100:0"),
                                           ("time", "-1-2"), ("partition", "gpu queue"),
                                           ("account", "a;rm"), ("qos", "'high'")])
def test_sbatch_options_refuse_what_sbatch_would_not_read_naming_the_option(option, value):
    small = make_problem("llama3-8b", "h100", 16, seq_len=2048, global_batch=32)
    with pytest.raises(ExportError, match=rf"^--{option} .*: sbatch takes "):
        render("slurm", small, Layout(tp=2), **{option: value})


@pytest.mark.parametrize("model, n, seq, gbs", [("llama3-70b", 64, 8192, 512),
                                                 ("qwen3-30b-a3b", 16, 4096, 512)])
def test_launchable_agrees_with_checking_every_row(model, n, seq, gbs):
    """`plan --target` looks for a target's reasons once per row distinct on the columns they
    read (all but the target's `Exporter.ignores`): the verdicts equal `check` on each row, for
    every target, on plan survivors (which pass the hard rules) with several micro-batches, CP
    forms and expert degrees per layout."""
    from autoparallel.exporters import launchable
    from autoparallel.search.plan import plan

    p = make_problem(model, "h100", n, seq_len=seq, global_batch=gbs)
    t = plan(p).survivors.table
    assert all(len(np.unique(t[c])) > 1 for c in ("mb", "cp", "cc", "dp"))
    rows = np.random.default_rng(3).choice(len(t), size=min(300, len(t)), replace=False)
    for target in EXPORTERS:
        ok = launchable(target, p, t)
        want = [not check(target, p, t.row(int(i))) for i in rows]
        assert ok[rows].tolist() == want, target
        assert 0 < ok.sum() < len(t) or target in ("deepspeed", "nanotron")
