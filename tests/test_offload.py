"""Activation offload, optimizer offload, named-module and uniform recompute (`cost.offload`),
against hand arithmetic on a small dense model.

The model: 8 layers, h = 1024, 16 heads (= KV heads, head 64), SwiGLU f = 4096, no dropout,
bf16, flash attention, tp = 1, micro-batch 1, seq 2048. Its saved activations per token and
layer (Korthikanti et al. 2022 generalised, reference §3.4): attention LN input 2h + QKV input 2h
+ Q 2h + output-projection input 2h + K 2h + V 2h, MLP LN input 2h + FC1 input 2h + SwiGLU
6f = 16h + 6f = 40,960 bytes; x 2,048 tokens = 83,886,080 bytes per layer and micro-batch."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from autoparallel import Layout, estimate, make_problem
from autoparallel.errors import ExportError
from autoparallel.exporters import render
from autoparallel.search.enumerate import enumerate_layouts
from autoparallel.search.space import SearchSpace
from autoparallel.specs.model import ModelSpec
from conftest import run_cli

GiB = 2.0 ** 30
SMALL = ModelSpec(name="small", n_layers=8, hidden_size=1024, n_heads=16, n_kv_heads=16,
                  ffn_hidden_size=4096, vocab_size=32000)
TOKENS = 2048
LAYER = (16 * 1024 + 6 * 4096) * TOKENS  # 83,886,080 bytes per layer and micro-batch


def _problem(**job):
    return make_problem(SMALL, "h100", 8, TOKENS, 64, attention="flash", **job)


def _est(p, **axes):
    return estimate(p, Layout(tp=1, micro_batch=1, **axes))


def test_layer_accounting_is_the_hand_figure():
    p = _problem()
    none = _est(p)
    f = p.stack.activation_factor
    # pp = 1, one micro-batch in flight: 8 layers
    assert none["memory_gib"]["activations"] * GiB == pytest.approx(f * 8 * LAYER, rel=1e-12)


@pytest.mark.parametrize("n", [1, 3, 7])
def test_activation_offload_saves_exactly_the_offloaded_layers_less_one_in_transfer(n):
    p = _problem()
    f = p.stack.activation_factor
    base, off = _est(p), _est(p, offload_layers=n)
    saved = (base["memory_gib"]["activations"] - off["memory_gib"]["activations"]) * GiB
    assert saved == pytest.approx(f * (n - 1) * LAYER, rel=1e-9)
    # nothing else moves
    for k in ("params", "grads", "optimizer", "embedding_logits", "overhead"):
        assert off["memory_gib"][k] == base["memory_gib"][k]


def test_activation_offload_time_is_the_copy_beyond_each_layers_compute():
    from ledger_hand import Dims, Hand, Lay

    p = _problem()
    n = 4
    # one layer's forward and backward, by hand (tests/ledger_hand.py: roofline GEMMs, flash
    # attention 2.5x backward, elementwise write + re-read)
    hand = Hand(p, Dims(L=8, h=1024, a=16, g=16, d=64, f=4096, V=32000))
    fwd, bwd = hand.layer_forward(Lay()), hand.layer_backward(Lay())
    assert hand.layer_activations(Lay()) == LAYER
    link = 64e9 * p.profile.host_link_efficiency  # h100 preset: PCIe Gen5 x16, 64 GB/s per way
    assert p.cluster.gpu.host_link_gb_per_s == 64
    copy = p.stack.activation_factor * LAYER / link
    m = 64 // 8  # micro-batches per step
    expected = m * n * (max(0.0, copy - fwd) + max(0.0, copy - bwd))
    rec = _est(p, offload_layers=n)
    assert rec["time_s"]["offload"] == pytest.approx(expected, rel=1e-9)
    base = _est(p)
    assert rec["time_s"]["step"] - base["time_s"]["step"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("share", [0.25, 1.0])
def test_optimizer_offload_memory_and_time_by_hand(share):
    p = _problem()
    base, off = _est(p, zero=1), _est(p, zero=1, optimizer_offload=share)
    # Megatron's count (reference §1.1): 8 layers of Q, K, V, O (h x h each, MHA), SwiGLU 3 h f,
    # two norms; embedding and untied output layer V h; final norm h
    n_params = 8 * (4 * 1024 ** 2 + 3 * 1024 * 4096 + 2 * 1024) + 2 * 32000 * 1024 + 1024
    shard = n_params / 8  # ZeRO-1 over dp = 8, pp = 1
    assert base["memory_gib"]["optimizer"] * GiB == pytest.approx(12 * shard, rel=1e-12)
    assert off["memory_gib"]["optimizer"] * GiB == pytest.approx(12 * shard * (1 - share), rel=1e-12)
    link = 64e9 * 0.8  # preset x Profile.host_link_efficiency default
    grad = p.training.grad_bytes  # Megatron-Core: fp32 main gradients, 4 bytes
    expected = share * shard * ((grad + 2) / link + 1 / 1.1e8)
    assert p.profile.cpu_adam_params_per_s == 1.1e8
    assert off["time_s"]["offload"] == pytest.approx(expected, rel=1e-9)
    step_overhead = p.profile.step_overhead_ms / 1e3
    gpu_opt = base["time_s"]["optimizer"] - step_overhead
    assert off["time_s"]["optimizer"] - step_overhead == pytest.approx(gpu_opt * (1 - share), rel=1e-9)


def test_named_modules_free_their_terms():
    p = _problem()
    f = p.stack.activation_factor
    none = _est(p)["memory_gib"]["activations"] * GiB
    layernorm = _est(p, recompute="selective", recompute_modules=["layernorm"])
    mlp = _est(p, recompute="selective", recompute_modules=["mlp"])
    both = _est(p, recompute="selective", recompute_modules=["layernorm", "mlp", "core_attn"])
    # layernorm: QKV and FC1 inputs, 2h + 2h per token; mlp: SwiGLU 6f per token
    assert none - layernorm["memory_gib"]["activations"] * GiB == pytest.approx(
        f * 8 * 4 * 1024 * TOKENS, rel=1e-12)
    assert none - mlp["memory_gib"]["activations"] * GiB == pytest.approx(
        f * 8 * 6 * 4096 * TOKENS, rel=1e-12)
    # every module of a dense layer: what stays is the two LN inputs, Q, O, K, V = 12h per token
    assert both["memory_gib"]["activations"] * GiB == pytest.approx(
        f * 8 * 12 * 1024 * TOKENS, rel=1e-12)
    # the default module (core_attn) frees nothing with fused attention, as today's selective
    assert _est(p, recompute="selective")["memory_gib"]["activations"] * GiB == pytest.approx(none)
    # re-running the MLP costs time, the norms a little
    assert mlp["time_s"]["recompute"] > layernorm["time_s"]["recompute"] > 0


def test_core_attn_module_is_todays_selective_recompute_with_eager_attention():
    p = make_problem(SMALL, "h100", 8, TOKENS, 64, attention="eager")
    a = estimate(p, Layout(tp=1, recompute="selective"))
    b = estimate(p, Layout(tp=1, recompute="selective", recompute_modules=["core_attn"]))
    c = estimate(p, Layout(tp=1, recompute="selective", recompute_modules=["mlp"]))
    n = estimate(p, Layout(tp=1))
    assert a == b
    scores = 2.0 * 16 * TOKENS * TOKENS  # 2as^2b without dropout (reference §3.1)
    f = p.stack.activation_factor
    assert (n["memory_gib"]["activations"] - a["memory_gib"]["activations"]) * GiB == \
        pytest.approx(f * 8 * scores, rel=1e-12)
    # mlp alone keeps the scores
    assert (n["memory_gib"]["activations"] - c["memory_gib"]["activations"]) * GiB == \
        pytest.approx(f * 8 * 6 * 4096 * TOKENS, rel=1e-12)


@pytest.mark.parametrize("group", [2, 4, 8])
def test_uniform_groups_keep_one_input_per_group_and_rematerialise_a_group(group):
    p = _problem()
    f = p.stack.activation_factor
    full = _est(p, recompute="full")
    grouped = _est(p, recompute="full", recompute_group=group)
    kept = f * math.ceil(8 / group) * 2 * 1024 * TOKENS  # 2sbh per group input
    assert grouped["memory_gib"]["activations"] * GiB == pytest.approx(kept, rel=1e-12)
    # the working set: group layers re-materialised instead of one (no f: reference §3.4 rule)
    assert (grouped["memory_gib"]["overhead"] - full["memory_gib"]["overhead"]) * GiB == \
        pytest.approx((group - 1) * LAYER, rel=1e-12)
    assert grouped["time_s"]["recompute"] == pytest.approx(full["time_s"]["recompute"])


def test_new_axes_off_reproduce_every_number_and_stay_out_of_the_default_search():
    p = make_problem("llama3-70b", "h100", 64, 8192, 512)
    t = enumerate_layouts(p)
    assert not np.any(t["rm"]) and not np.any(t["ao"]) and not np.any(t["oo"])
    assert np.all(t["rn"] == -1)
    group1 = estimate(p, Layout(tp=8, pp=2, recompute="full", recompute_group=1))
    assert group1 == estimate(p, Layout(tp=8, pp=2, recompute="full"))


def test_search_opens_the_new_axes_when_asked():
    p = _problem()
    space = SearchSpace(offload_layers=[2], optimizer_offload=[0.5], recompute_group=[2],
                        recompute_modules=["mlp"], tp=[1], pp=[1], micro_batch=[1])
    t = enumerate_layouts(p, space)
    assert set(t["ao"]) == {0, 2} and set(t["oo"]) == {0, 50}
    assert np.all((t["ao"] == 0) | ((t["pp"] == 1) & (t["rc"] == 0)))  # Megatron-Core's limits
    assert set(t["rn"][t["rc"] == 2]) == {-2}
    assert set(t["rm"][t["rc"] == 1]) == {4}  # the mlp bit


def test_slugs_round_trip():
    for slug in ("dp8-tp1-pp1-vp1-cp1-ep1-z1-rnone-mb1-ao3-oo50",
                 "dp8-tp1-pp1-vp1-cp1-ep1-z1-rselective+layernorm+mlp-mb1",
                 "dp8-tp1-pp1-vp1-cp1-ep1-z1-rfullg4-mb1"):
        assert Layout.from_slug(slug).slug == slug


def test_megatron_writes_the_flags_and_others_refuse():
    p = make_problem(SMALL, "h100", 8, TOKENS, 64, stack="megatron-core")
    lay = Layout(tp=1, zero=1, offload_layers=3, optimizer_offload=0.5)
    text = render("megatron", p, lay)
    assert "--cpu-offloading-num-layers 3" in text
    assert "--optimizer-cpu-offload --optimizer-offload-fraction 0.5 --use-precision-aware-optimizer" in text
    text = render("megatron", p, Layout(tp=1, recompute="selective", recompute_modules=["mlp", "layernorm"]))
    assert "--recompute-granularity selective --recompute-modules layernorm mlp" in text
    text = render("megatron", p, Layout(tp=1, recompute="full", recompute_group=4))
    assert "--recompute-method uniform --recompute-num-layers 4" in text
    with pytest.raises(ExportError, match="pipeline parallelism"):
        render("megatron", make_problem(SMALL, "h100", 16, TOKENS, 64), Layout(tp=1, pp=2, offload_layers=1))
    for target in ("torchtitan", "nanotron"):
        with pytest.raises(ExportError, match="megatron and slurm write --cpu-offloading"):
            render(target, p, Layout(tp=1, offload_layers=3))


def test_deepspeed_offload_optimizer_parses_back():
    p = make_problem(SMALL, "h100", 8, TOKENS, 64, stack="deepspeed")
    cfg = json.loads(render("deepspeed", p, Layout(tp=1, zero=2, optimizer_offload=1.0)))
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    cfg = json.loads(render("deepspeed", p, Layout(tp=1, zero=3, optimizer_offload=0.3)))
    assert cfg["zero_optimization"]["offload_optimizer"]["ratio"] == 0.3
    with pytest.raises(ExportError, match="ratio"):
        render("deepspeed", p, Layout(tp=1, zero=2, optimizer_offload=0.3))


def test_cli_refusal_exits_2_naming_the_targets_that_can():
    r = run_cli("export", "--target", "torchtitan", "--model", "llama3-8b", "--gpu", "h100",
                "--gpus", "8", "--seq-len", "4096", "--global-batch", "64",
                "--optimizer-offload", "0.5")
    assert r.returncode == 2
    assert "deepspeed offload_optimizer" in r.stderr


def test_gpu_presets_carry_a_sourced_host_link():
    from autoparallel.presets import list_gpus, load_gpu

    expected = {"a100-40gb": 32, "a100-80gb": 32, "h100": 64, "h200": 64, "h800": 64,
                "b200": 64, "mi300x": 64, "gb200": 450, "b300": 64, "gb300": 450,
                "h100-96gb": 64,
                "a10g": 32, "v100-32gb": 16}  # PCIe Gen4 x16, Gen3 x16
    for name in list_gpus():
        gpu = load_gpu(name)
        assert gpu.host_link_gb_per_s == expected[name]
        assert "host_link_gb_per_s" in gpu.sources
