"""Every setting the cost model assumed is in the written file: each target's export, read back
by its launcher reader (tests/launcher_checks.py), gives the gradient dtype of the memory ledger,
the ZeRO stage, recompute, degrees, micro-batch, global batch and the model definition of the
problem the estimate was made for."""

import pytest

from autoparallel import Layout, make_problem
from autoparallel.exporters import Job, render
from autoparallel.search.plan import plan
from launcher_checks import (
    deepspeed_layout, megatron_script_layout, nanotron_layout, sbatch_layout,
    torchtitan_layout, torchtitan_module_layout,
)

REFERENCE = Layout(tp=8, pp=4, vp=5, zero=1, recompute="selective", micro_batch=1)
"""launchers.md §0: TP8 PP4 VP5 DP2, distributed optimizer, selective recompute."""


def llama70b(grad_dtype="bf16"):
    return make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512,
                        grad_dtype=grad_dtype)


def plan_first(problem):
    return plan(problem, top=1, target="megatron").ranked.table.row(0)


@pytest.mark.parametrize("grad_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("which", ["reference", "plan #1"])
def test_megatron_export_is_the_llama3_70b_the_estimate_assumed(grad_dtype, which):
    """Issue 12's acceptance: RMSNorm, RoPE base 500000 (Llama 3 config.json rope_theta), SwiGLU,
    no bias, 8 query groups, untied embeddings, unpadded vocabulary, and the gradient dtype of the
    estimate, for the reference layout and for plan's #1."""
    problem = llama70b(grad_dtype)
    layout = REFERENCE if which == "reference" else plan_first(problem)
    for reader, target in ((megatron_script_layout, "megatron"), (sbatch_layout, "slurm")):
        got = reader(render(target, problem, layout))
        g = got["args"]
        assert g.normalization == "RMSNorm"
        assert g.position_embedding_type == "rope" and g.rotary_base == 500000
        assert g.swiglu and not g.add_bias_linear
        assert g.group_query_attention and g.num_query_groups == 8
        assert g.untie_embeddings_and_output_weights
        # Megatron pads the vocabulary to a multiple of divisor x TP (vocab_size_with_padding)
        multiple = g.make_vocab_size_divisible_by * g.tensor_model_parallel_size
        assert 128256 % multiple == 0
        assert got["grad_dtype"] == grad_dtype
        job = Job.of(problem, layout)
        assert (got["zero"], got["recompute"]) == (job.layout.zero, str(job.layout.recompute))
        assert (got["tp"], got["pp"], got["vp"], got["dp"]) == (
            job.layout.tp, job.layout.pp, job.layout.vp, job.layout.dp)
        assert (g.micro_batch_size, g.global_batch_size) == (job.layout.micro_batch, 512)
        assert (g.num_layers, g.hidden_size, g.ffn_hidden_size, g.num_attention_heads) == (
            80, 8192, 28672, 64)
        if job.layout.zero <= 1:  # Megatron DDP: the bucket the time model prices
            assert g.ddp_bucket_size == max(40_000_000, 1_000_000 * job.data_group)
        assert g.overlap_grad_reduce


@pytest.mark.parametrize("grad_dtype", ["bf16", "fp32"])
def test_megatron_fsdp_writes_its_main_grad_dtype(grad_dtype):
    got = megatron_script_layout(render("megatron", llama70b(grad_dtype),
                                        Layout(tp=8, pp=4, zero=3)))
    assert got["zero"] == 3 and got["grad_dtype"] == grad_dtype
    assert got["args"].megatron_fsdp_main_grads_dtype == grad_dtype


def test_gpt3_export_is_a_gpt_model():
    """GeLU models are the GPT family: LayerNorm, learned absolute positions, biases, tied."""
    p = make_problem("gpt3-175b", "a100-80gb", 128, seq_len=2048, global_batch=1536)
    g = megatron_script_layout(render("megatron", p, Layout(tp=8, pp=8)))["args"]
    assert (g.normalization, g.position_embedding_type) == ("LayerNorm", "learned_absolute")
    assert g.add_bias_linear and not g.swiglu and not g.untie_embeddings_and_output_weights
    assert g.make_vocab_size_divisible_by * 8 == 1024 and 51200 % 1024 == 0


@pytest.mark.parametrize("grad_dtype", ["bf16", "fp32"])
def test_deepspeed_zero3_full_recompute_writes_overlap_and_grad_dtype(grad_dtype):
    problem = llama70b(grad_dtype)
    layout = Layout(dp=64, zero=3, recompute="full")
    got = deepspeed_layout(render("deepspeed", problem, layout), 64)
    assert (got["dp"], got["zero"], got["recompute"]) == (64, 3, "full")
    assert got["overlap_comm"] is True and got["grad_dtype"] == grad_dtype
    assert (got["micro_batch"], got["micro_batches"], got["global_batch"]) == (1, 8, 512)
    zero = got["config"]["zero_optimization"]
    assert zero["reduce_bucket_size"] == 64_000_000  # max(4e7, 1e6 x 64)


@pytest.mark.parametrize("grad_dtype", ["bf16", "fp32"])
def test_nanotron_writes_the_grad_dtype_and_model(grad_dtype):
    problem = llama70b(grad_dtype)
    got = nanotron_layout(render("nanotron", problem, Layout(tp=8, pp=4, zero=1)), 64)
    assert got["grad_dtype"] == grad_dtype and got["zero"] == 1
    mc = got["config"]["model"]["model_config"]
    assert (mc["rope_theta"], mc["hidden_act"], mc["num_key_value_heads"]) == (500000.0, "silu", 8)
    assert (mc["num_hidden_layers"], mc["hidden_size"], mc["intermediate_size"]) == (80, 8192, 28672)


def test_torchtitan_names_the_model_in_both_forms():
    problem = llama70b()
    toml = torchtitan_layout(render("torchtitan", problem, REFERENCE, "0.2.2"), 64, 80)
    module = torchtitan_module_layout(render("torchtitan", problem, REFERENCE), 64, 80)
    assert toml["model"] == ("llama3", "70B") and module["model"] == ("llama3", "llama3_70b")
    for got in (toml, module):
        assert (got["tp"], got["pp"], got["vp"], got["dp"], got["recompute"]) == (
            8, 4, 5, 2, "selective")
        assert (got["micro_batch"], got["global_batch"], got["seq_len"]) == (1, 512, 8192)


@pytest.mark.parametrize("gpu,precision", [("h100", "bf16"), ("h100", "fp8"),
                                           ("h100", "fp8-blockwise"), ("b200", "mxfp8"),
                                           ("b200", "nvfp4")])
def test_megatron_export_writes_the_planned_precision_and_tp_overlap(gpu, precision):
    # the default stack (megatron-core) overlaps TP communication; the recipe is written as
    # Megatron-LM's --fp8-format/--fp8-recipe or --fp4-format/--fp4-recipe
    problem = make_problem("llama3-70b", gpu, 64, seq_len=8192, global_batch=512,
                           precision=precision)
    got = megatron_script_layout(render("megatron", problem, REFERENCE))
    assert got["precision"] == precision
    assert got["args"].tp_comm_overlap is problem.training.tp_comm_overlap is True


@pytest.mark.parametrize("stack,precision,flag", [
    ("megatron-bridge", "fp8", "fp8_param_gather"), ("megatron-bridge", "mxfp8", "fp8_param_gather"),
    ("megatron-bridge", "nvfp4", "fp4_param"), ("megatron-core", "fp8", None),
    ("megatron-bridge", "bf16", None)])
def test_megatron_export_writes_the_stacks_low_precision_parameters(stack, precision, flag):
    # Megatron-Bridge's FP8/MXFP8 recipes set fp8_param_gather, NVFP4 fp4_param_gather (the
    # stack's default); plain Megatron-Core keeps bf16 weights; BF16 has nothing to gather in fp8
    problem = make_problem("llama3-70b", "b200", 64, seq_len=8192, global_batch=512,
                           precision=precision, stack=stack)
    got = megatron_script_layout(render("megatron", problem, REFERENCE))
    assert got["fp8_param_gather"] is (flag is not None)
    assert got["grad_dtype"] == ("bf16" if stack == "megatron-bridge" else "fp32")
    if flag:
        assert getattr(got["args"], flag) is True


def _windowed(freq, n_layers: int) -> list[int]:
    """Layers (1-based) Megatron-Core windows for a `--window-attn-skip-freq` value
    (`is_layer_window_attention`: an int N windows layer_number % N != 0; a list string is the
    per-layer pattern, 1 = windowed)."""
    if freq is None:
        return list(range(1, n_layers + 1))
    if str(freq).isdigit():
        return [i for i in range(1, n_layers + 1) if i % int(freq) != 0]
    pattern = eval(str(freq), {"__builtins__": {}})  # the flag's list expression
    return [i + 1 for i, w in enumerate(pattern) if w]


def test_megatron_export_is_gpt_oss_window_yarn_and_biases():
    """gpt-oss-120b (HF config.json): a 128-token window on the alternate 18 of 36 layers, the
    first windowed (`layer_types[0]` "sliding_attention"), TE's window (127, 0) as Megatron-Bridge's
    provider sets it; YaRN factor 32 at rotary base 150000; biased linears; and a note that the
    sinks and the clamped GLU have no Megatron-LM argument."""
    problem = make_problem("gpt-oss-120b", "h100", 64, seq_len=4096, global_batch=512)
    layout = Layout(tp=1, pp=4, ep=8, zero=1, recompute="selective", micro_batch=1)
    text = render("megatron", problem, layout)
    g = megatron_script_layout(text)["args"]
    assert g.window_size == (127, 0)
    windowed = _windowed(g.window_attn_skip_freq, 36)
    assert len(windowed) == 18 and windowed[:3] == [1, 3, 5]
    assert g.position_embedding_type == "yarn" and g.rotary_base == 150000
    assert g.rotary_scaling_factor == 32.0 and (g.mscale, g.mscale_all_dim) == (1.0, 0.0)
    assert g.add_bias_linear and g.swiglu
    assert "no attention sinks" in text and "--target megatron-bridge" in text


@pytest.mark.parametrize("n_window,expect", [(None, 28), (10, 10)])
def test_megatron_export_windows_every_layer_or_the_last_ones(n_window, expect):
    """A window on every layer (Mistral) writes no skip pattern; a count that is neither all nor
    half is written on the last layers (Qwen2's max_window_layers), with a note saying so."""
    from autoparallel.presets import load_model

    spec = load_model("llama3-8b").model_copy(update={
        "n_layers": 28, "sliding_window": 4096, "n_sliding_layers": n_window})
    problem = make_problem(spec, "h100", 8, seq_len=8192, global_batch=64)
    text = render("megatron", problem, Layout(tp=1, pp=1, zero=1, micro_batch=1))
    g = megatron_script_layout(text)["args"]
    assert g.window_size == (4095, 0)
    windowed = _windowed(g.window_attn_skip_freq, 28)
    assert len(windowed) == expect and windowed[-1] == 28
    assert ("edit --window-attn-skip-freq" in text) == (n_window == 10)
