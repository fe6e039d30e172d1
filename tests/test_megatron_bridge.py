"""The `megatron-bridge` stack (NVIDIA's tuned Megatron-Core recipes), its low-precision
parameters, the recipe settings `validate` joins to the Megatron-Bridge rows, the SFU
exponential term of attention, and the Blackwell Ultra presets in the profile resolution.
Expected numbers are derived by hand in each test from the sources the code cites."""

import dataclasses

import numpy as np
import pytest

from autoparallel import Layout, estimate, make_problem
from autoparallel.cost.model_arch import build_arch
from autoparallel.cost.compute import attention_time
from autoparallel.data import PUBLISHED_RUNS
from autoparallel.evaluate import evaluate
from autoparallel.presets import load_gpu
from autoparallel.specs.model import ModelSpec
from autoparallel.validation.recipes import match, recipes
from autoparallel.validation.runs import RULES, case_from_row, read_runs

GiB = 2**30


@pytest.fixture(scope="module")
def rows():
    frame = read_runs(PUBLISHED_RUNS)
    return {r["row_id"]: {k: (None if v == "" else v) for k, v in r.items()}
            for r in frame.to_dict("records")}


def test_stack_defaults_are_the_recipes():
    # Megatron-Bridge perf recipes: grad_reduce_in_fp32 = False (bf16 main grads, 16 bytes per
    # parameter), TP overlap, fp8/fp4 parameter gather; plain Megatron-Core: 18 bytes, no gather
    bridge = make_problem("llama3-70b", "gb200", 64, 8192, 256, stack="megatron-bridge",
                          precision="mxfp8")
    core = make_problem("llama3-70b", "gb200", 64, 8192, 256, precision="mxfp8")
    assert (bridge.training.grad_dtype, bridge.training.grad_reduce_dtype) == ("bf16", "bf16")
    assert bridge.training.bytes_per_param == 16 and core.training.bytes_per_param == 18
    assert bridge.training.tp_comm_overlap and bridge.training.fp8_param_gather
    assert not core.training.fp8_param_gather
    assert bridge.training.attention == "cudnn" == core.training.attention
    # one kernel family: the two stacks carry the same fitted knobs on a GPU both were fitted on
    assert bridge.profile == core.profile


LLAMA8B_LINEAR = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
"""Llama-3-8B linear weights: per layer Q and output 4096x4096, K and V 4096x1024 (8 KV heads of
128), SwiGLU 3 x 4096 x 14336; 32 layers = 6.98e9 (the embedding and output layer stay BF16)."""


@pytest.mark.parametrize("zero,precision,saved_per_linear", [
    (1, "fp8", 2.0),          # the 16-bit copy of every linear weight is gone
    (1, "nvfp4", 2.0),
    (3, "fp8", (2.0 - 1.0) / 8),  # ZeRO-3 shard over dp 8 kept in fp8 instead of bf16
    (3, "mxfp8", (2.0 - (1.0 + 1 / 32)) / 8),  # MX: one E8M0 scale per 32 elements
])
def test_fp8_param_gather_memory_by_hand(zero, precision, saved_per_linear):
    kw = dict(stack="megatron-bridge", precision=precision)
    lay = Layout(tp=1, pp=1, zero=zero, recompute="full")
    on = estimate(make_problem("llama3-8b", "b200", 8, 8192, 64, **kw), lay)
    off = estimate(make_problem("llama3-8b", "b200", 8, 8192, 64, fp8_param_gather=False, **kw),
                   lay)
    saved = (off["memory_gib"]["params"] - on["memory_gib"]["params"]) * GiB
    # the code counts the 266,240 norm weights with the linear ones: within 4e-5
    assert saved == pytest.approx(saved_per_linear * LLAMA8B_LINEAR, rel=1e-4)
    for item in ("grads", "optimizer", "activations"):
        assert on["memory_gib"][item] == off["memory_gib"][item]


def test_fp8_param_gather_halves_the_parameter_all_gather():
    # ZeRO-1 all-gathers the updated parameters once per step; with dp_overlap = 0 nothing hides
    # it, so the step differs by the ring all-gather of 1 byte less per parameter: 8 GPUs of one
    # NVLink 5 domain, bus factor 7/8, at 0.76 x 900 GB/s (the b200 preset's ring efficiency)
    def dp(gather):
        p = make_problem("llama3-8b", "b200", 8, 8192, 64, stack="megatron-bridge",
                         precision="fp8", fp8_param_gather=gather)
        p = p.model_copy(update={"profile": p.profile.model_copy(update={"dp_overlap": 0.0})})
        return estimate(p, Layout(tp=1, zero=1))["time_s"]["dp_comm"]

    psi = build_arch(make_problem("llama3-8b", "b200", 8, 8192, 64).model).n_params
    gpu = load_gpu("b200")
    expected = 7 / 8 * psi * 1.0 / (gpu.profile["scaleup_efficiency"] * 900e9)
    assert dp(False) - dp(True) == pytest.approx(expected, rel=1e-6)


def test_recipes_table_holds_what_the_recipe_files_say():
    # transcribed from scripts/performance/configs/llama/llama3_workload_base_configs.py @v0.5.0:
    # LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2 = replace(BASE_..._GBS256, micro_batch_size=2,
    #     use_megatron_fsdp=True, cpu_offloading_num_layers=40)
    t = recipes()
    r = t[(t["config"] == "LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2")
          & (t["first_tag"] <= "v0.5.0") & (t["last_tag"] >= "v0.5.0")].iloc[0]
    assert (r["num_gpus"], r["gbs"], r["mbs"], r["tp"], r["pp"]) == ("64", "256", "2", "1", "1")
    assert (r["use_megatron_fsdp"], r["cpu_offloading_num_layers"]) == ("True", "40")
    # llama31_workload_base_configs.py @v0.5.0: GB200 NVFP4 V1, recompute_num_layers=1
    r = t[(t["config"] == "LLAMA31_405B_PRETRAIN_CONFIG_GB200_NVFP4_V1")
          & (t["first_tag"] <= "v0.5.0") & (t["last_tag"] >= "v0.5.0")].iloc[0]
    assert (r["tp"], r["pp"], r["vp"], r["recompute_num_layers"]) == ("4", "16", "8", "1")
    assert r["tp_comm_overlap"] == "False"  # llama31_llm_pretrain.py: off for nvfp4


def test_rows_take_the_settings_of_the_recipe_they_match(rows):
    # GT0815: Llama-3 70B FP8-CS on 64 GB200, Megatron FSDP, MBS 2, GBS 256 (NeMo 26.04.01):
    # the recipe offloads 40 layers' activations and recomputes nothing
    c = case_from_row(rows["GT0815"])
    assert c.stack == "megatron-bridge" and c.gpu == "gb200"
    assert (c.layout.offload_layers, c.layout.recompute.value, c.layout.zero) == (40, "none", 3)
    assert "Megatron-Bridge recipe (v0.4.2): recompute none, activation offload 40 layers" \
        in c.assumptions
    assert match(rows["GT0815"], "gb200", dict(tp=1, pp=1, cp=1, vp=1, ep=1, micro_batch=2)
                 ).config == "LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2"
    # GT0776: 405B NVFP4 on 256 GB200 (26.06): TP overlap off in the NVFP4 recipes
    c = case_from_row(rows["GT0776"])
    assert c.job["tp_comm_overlap"] is False and c.layout.recompute.value == "none"
    # GT0911: the same model at VP 4, which no recipe ran: the stack's defaults, recompute none
    c = case_from_row(rows["GT0911"])
    assert not any(a.startswith("Megatron-Bridge recipe") for a in c.assumptions)
    assert "tp_comm_overlap" not in c.job
    assert "recompute not stated: none (the megatron-bridge recipes' default)" in c.assumptions
    # NeMo 24.07 rows (the NeMo launcher's configs) are the same stack, without a recipe table
    c = case_from_row(rows["GT0547"])
    assert c.stack == "megatron-bridge" and match(rows["GT0547"], c.gpu, {}) is None


def test_a_printed_layout_the_recipe_file_contradicts_is_replaced_and_said(rows):
    # GT0903: Llama-3 70B NVFP4 on 64 GB300, NeMo 26.02.01. Its table prints PP 1, MBS 2
    # without FSDP, and the Llama recipes recompute nothing: every layer's activations at MBS 2
    # stay on one GPU. The v0.4.0 recipe (LLAMA3_70B_PRETRAIN_CONFIG_GB300_NVFP4_V2) and the
    # 26.02 / 26.04 tables say PP 4, VP 5, MBS 1: the side table's `pp`, `vp`, `micro_batch`
    # replace the printed degrees, dp follows (64 / 4 = 16), and the exact recipe match then
    # applies (v0.4.0, recompute none)
    c = case_from_row(rows["GT0903"])
    lay = c.layout
    assert (lay.dp, lay.tp, lay.pp, lay.vp, lay.micro_batch) == (16, 1, 4, 5, 1)
    assert ("layout from the recipe file (moe_settings.csv): pp 4 (printed 1), vp 5 (printed 1), "
            "micro-batch 1 (printed 2)") in c.assumptions
    assert any(a.startswith("Megatron-Bridge recipe (v0.4.0)") for a in c.assumptions)
    m = evaluate(c.problem(), c.table(), RULES).memory
    assert m["fit_peak"][0] <= m["usable"][0]
    # the printed layout as the table gives it does not fit: weights and gradients alone
    printed = dict(rows["GT0903"], setting_pp=None, setting_vp=None, setting_micro_batch=None)
    cp = case_from_row(printed)
    assert (cp.layout.pp, cp.layout.micro_batch) == (1, 2)
    mp = evaluate(cp.problem(), cp.table(), RULES).memory
    # by hand, a lower bound: the bf16 inputs of the four linears of a layer alone, 2 bytes x
    # s b (3 h + ffn) = 2 x 8192 x 2 x (3 x 8192 + 28672) = 1.74e9 B, x 80 layers = 130 GiB,
    # beside 207 GiB of bf16 gradients and fp4/bf16 weights the ledger holds in 267 usable
    assert mp["activations"][0] >= 2 * 8192 * 2 * (3 * 8192 + 28672) * 80
    assert mp["fit_peak"][0] > mp["usable"][0] + 100 * GiB
    # a row without corrections keeps its printed degrees (GT0939: 26.02, printed PP 4 VP 5)
    c = case_from_row(rows["GT0939"])
    assert (c.layout.pp, c.layout.vp) == (4, 5)
    assert not any(a.startswith("layout from the recipe file") for a in c.assumptions)


@pytest.mark.parametrize("row_id", ["GT0548", "GT0561", "GT0777"])
def test_dgx_cloud_recipes_fit_with_the_stack_and_not_with_fp32_gradients(rows, row_id):
    # Llama-3 8B (8 H100, CP2) and 405B (1024 H100, TP8 PP8 VP8 CP2), no recompute: they ran; with
    # Megatron-Core's fp32 main gradients the ledger has 4 bytes more per local parameter
    c = case_from_row(rows[row_id])
    assert c.layout.recompute.value == "none"
    for stack, fits in (("megatron-bridge", True), ("megatron-core", False)):
        cc = dataclasses.replace(c, job=dict(c.job, stack=stack))
        m = evaluate(cc.problem(), cc.table(), RULES).memory
        assert bool(m["fit_peak"][0] <= m["usable"][0]) is fits, stack


def _attention(gpu, head_dim, trained=False):
    """The kernel at the GPU's forward benchmark (the reference profile), or (`trained`) at the
    shipped profile's efficiency, what training keeps of it (`attention_prior`)."""
    model = ModelSpec(name="d", n_layers=2, hidden_size=16 * head_dim, n_heads=16,
                      ffn_hidden_size=4096, vocab_size=1000)
    p = make_problem(model, gpu, 8, 8192, 8)
    if not trained:
        p = p.model_copy(update={"profile": p.cluster.gpu.reference()})
    flops = 1.0e12  # forward matmul FLOPs: 4 x head_dim per causal score
    scores = flops / (4 * head_dim)
    eta = p.profile.cudnn_attention_efficiency
    mma = flops / (eta * p.cluster.gpu.bf16_tflops * 1e12)
    exp = scores / (p.cluster.gpu.sfu_exp_tera_per_s * 1e12)
    got = (float(attention_time(p, flops, scores)),
           float(attention_time(p, flops, scores, backward=True)))
    return got, mma, exp


def test_softmax_exponentials_bind_where_the_sfus_are_slower_than_the_tensor_cores():
    # head dim 64 (256 FLOPs per score): on B200 5e12 exponentials/s take 2.0e-13 s per score,
    # longer than the matmuls (256 / (eta 2.25e15)); B300's 10.7e12 make the matmuls bind again
    (b200, b200_bwd), mma, exp = _attention("b200", 64)
    assert exp > mma and b200 == pytest.approx(exp, rel=1e-12)
    assert b200_bwd == pytest.approx(2.5 * mma, rel=1e-12)  # one exp per score, 2.5x matmuls
    (b300, _), mma3, exp3 = _attention("b300", 64)
    assert exp3 < mma3 and b300 == pytest.approx(mma3, rel=1e-12)
    assert b200 / b300 == pytest.approx(exp / mma3, rel=1e-12)
    # Hopper at head dim 128: 989 TFLOP/s against 3.9e12/s, the matmuls always bind
    (h100, _), mma, exp = _attention("h100", 128)
    assert exp < mma and h100 == pytest.approx(mma, rel=1e-12)
    # a GPU without the rate (MI300X) keeps the matmul time only
    assert load_gpu("mi300x").sfu_exp_tera_per_s is None
    # at what training keeps of the kernel (the shipped B200 profile, about 0.58 of the
    # benchmark) the matmul time exceeds the exponentials' even at head dim 64
    (b200t, _), mma_t, exp_t = _attention("b200", 64, trained=True)
    assert exp_t < mma_t and b200t == pytest.approx(mma_t, rel=1e-12)


def test_one_chip_one_fit_and_the_nearest_peaks_for_the_rest():
    # B300's Megatron-Bridge runs are all MoE: it shares the fit of its chip group, GB300 (the
    # same Blackwell Ultra GPU on a Grace superchip), as fractions of its own peaks; B200 that of
    # GB200
    from autoparallel.problem import gpu_nearness
    from autoparallel.validation.loso import group_of

    assert group_of("b300") == ("b300", "gb300") and group_of("b200") == ("b200", "gb200")
    for gpu, twin in (("b300", "gb300"), ("b200", "gb200")):
        p, q = (make_problem("llama3-8b", g, 8, 8192, 64, stack="megatron-bridge", precision="fp8")
                for g in (gpu, twin))
        assert p.profile_basis == f"megatron-bridge fitted on {gpu}"
        assert p.profile.fp8_gemm_efficiency == q.profile.fp8_gemm_efficiency
        assert np.isfinite(estimate(p, Layout(tp=1))["time_s"]["step"])
    # a GPU with no fit takes the nearest: same generation, then the closest peaks. From B300
    # (BF16/FP8/FP4 2250/4500/13500): GB300 |ln 2500/2250| x 2 + |ln 15000/13500| = 0.316,
    # B200 |ln 13500/9000| = 0.405, GB200 0.211 + |ln 13500/10000| = 0.511; H100 is Hopper
    b300 = load_gpu("b300")
    order = sorted(("b200", "gb200", "gb300", "h100"), key=lambda g: gpu_nearness(b300, load_gpu(g)))
    assert order == ["gb300", "b200", "gb200", "h100"]
    h800 = make_problem("llama3-8b", "h800", 8, 8192, 64, stack="megatron-bridge", precision="fp8")
    assert h800.profile_basis.startswith("megatron-bridge fitted on h100 (nearest GPU")


def test_full_iteration_graph_presets_are_mined_as_full_graphs(rows):
    # Megatron-Bridge v0.5.x: GPT_OSS_120B_PRETRAIN_CONFIG_GB300_FP8_MX_V2 sets
    # cuda_graph_impl="full_iteration", cuda_graph_scope=[] (scripts/performance/configs/gpt_oss/
    # gpt_oss_workload_base_configs.py); megatron/bridge/utils/cuda_graph.py
    # is_full_iteration_cuda_graph: impl "full_iteration" -> True whatever the scope. It was
    # mined as no graphs (the empty scope read as "none")
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "benchmarks" / "mine_bridge_recipes.py"
    spec = importlib.util.spec_from_file_location("mine_bridge_recipes", path)
    mine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mine)
    base = {"tensor_model_parallel_size": 1, "expert_tensor_parallel_size": 1}
    graphs = {impl_scope: mine.settings(dict(base, cuda_graph_impl=impl_scope[0],
                                             cuda_graph_scope=list(impl_scope[1])))["cuda_graphs"]
              for impl_scope in [("full_iteration", ()), ("none", ("full_iteration",)),
                                 ("local", ("full_iteration",)),
                                 ("transformer_engine", ("full_iteration",)),
                                 ("transformer_engine", ("attn", "full_iteration")),
                                 ("transformer_engine", ("attn", "moe_router")), (None, ())]}
    assert graphs == {("full_iteration", ()): "full", ("none", ("full_iteration",)): "none",
                      ("local", ("full_iteration",)): "full",
                      # is_full_iteration_cuda_graph is False for impl transformer_engine
                      ("transformer_engine", ("full_iteration",)): "none",
                      ("transformer_engine", ("attn", "full_iteration")): "scoped",
                      ("transformer_engine", ("attn", "moe_router")): "scoped",
                      (None, ()): "none"}
    # the shipped side table agrees: GT0743 (26.08, that preset) runs with full graphs and
    # HybridEP, so its MoE layers have static shapes and no exposed host time
    c = case_from_row(rows["GT0743"])
    assert (c.job["cuda_graphs"], c.job["moe_dispatcher"]) == ("full", "hybridep")
    ev = evaluate(c.problem(), c.table(), RULES)
    assert ev.time["host"][0] == 0.0


def test_scan_writer_replaces_the_line_after_the_moe_knobs():
    # benchmarks/fit_moe.py writes the MoE knobs at the top of each profile table and
    # benchmarks/calibrate_stacks.py keeps them there, then the scan ceiling: the scan writer
    # (benchmarks/fit_scan_efficiency.py) must replace that line, not add a second one after
    # the header (a duplicate key: the preset would no longer parse)
    import importlib.util
    import pathlib
    import tomllib

    root = pathlib.Path(__file__).parents[1]
    spec = importlib.util.spec_from_file_location(
        "fit_scan_efficiency", root / "benchmarks" / "fit_scan_efficiency.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (root / "autoparallel" / "presets" / "stacks" / "megatron-bridge.toml").read_text()
    shipped = tomllib.loads(text)["profile"]
    assert "moe_host_overhead_us" in shipped["b200"] and "scan_efficiency" in shipped["b200"]
    new = mod.with_scan_line(text, "b200", "scan_efficiency = 0.0500\n")
    new = mod.with_scan_line(new, "h100", "scan_efficiency = 0.0620\n")  # none there before
    new = mod.with_scan_line(new, "gb200", "")  # bound by memory: no knob
    prof = tomllib.loads(new)["profile"]
    assert prof["b200"]["scan_efficiency"] == 0.05 and prof["h100"]["scan_efficiency"] == 0.062
    assert "scan_efficiency" not in prof["gb200"]
    for gpu, table in prof.items():  # nothing else moved
        rest = {k: v for k, v in table.items() if k != "scan_efficiency"}
        assert rest == {k: v for k, v in shipped[gpu].items() if k != "scan_efficiency"}


def test_a_deepep_recipe_in_a_container_without_deepep_runs_alltoall(rows):
    # Megatron-Bridge docs/releases/known-issues.md, 26.02: "DeepEP is not supported in the
    # current NeMo framework 26.02 container". GT0966 (Qwen3-30B-A3B on 16 H100, 26.02) and
    # GT0929 (the same layout and v0.3.0 recipe, 26.02.01) both mine the recipe's DeepEP
    # dispatcher; only the 26.02 row can not have run it
    c66, c29 = case_from_row(rows["GT0966"]), case_from_row(rows["GT0929"])
    assert c66.job["moe_dispatcher"] == "alltoall"
    assert ("alltoall dispatcher: no DeepEP in the NeMo 26.02 container (Megatron-Bridge known "
            "issues)") in c66.assumptions
    assert c29.job["moe_dispatcher"] == "deepep"
    assert not any("no DeepEP" in a for a in c29.assumptions)
    # the recipe's all-to-all overlap is kept; alltoall's all-to-all costs more than DeepEP's
    t66 = evaluate(c66.problem(), c66.table(), RULES).time["ep_comm"][0]
    t29 = evaluate(c29.problem(), c29.table(), RULES).time["ep_comm"][0]
    assert t66 > t29
