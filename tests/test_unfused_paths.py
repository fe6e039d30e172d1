"""The unfused code paths Megatron-Core takes for gpt-oss (`cost.unfused_paths`): YaRN's
concentration factor, which TE's fused RoPE refuses, and the routed experts' FC2 bias, added
expert by expert. Byte counts are re-derived here from the ops of megatron-core 0.16
(rope_utils.py `_apply_rotary_pos_emb_bshd`, experts.py `TEGroupedMLP._apply_bias`), 2-byte
elements, reads plus writes."""

import math

import numpy as np
import pytest

from autoparallel import Layout, make_problem
from autoparallel.cost.model_arch import build_arch
from autoparallel.cost.time import time_ledger
from autoparallel.cost.unfused_paths import unfused_seconds
from autoparallel.layouts import LayoutTable
from autoparallel.presets import load_model
from autoparallel.specs.model import YarnSpec

SEQ, MB = 4096, 4
SLUG = "dp64-tp1-pp1-vp1-cp1-ep64-z1-rnone-mb4"


def _oss(model="gpt-oss-120b", stack="megatron-bridge", gpu="gb200"):
    return make_problem(model, gpu, 64, SEQ, 1280, stack=stack, moe_routing="balanced")


def _table(slug=SLUG, layers=36):
    return LayoutTable.from_layouts([Layout.from_slug(slug)], 64, layers)


def _hbm_seconds(problem, nbytes):
    gpu, prof = problem.cluster.gpu, problem.profile
    return nbytes / (prof.hbm_efficiency * gpu.hbm_tb_per_s * 1e12)


def test_yarn_concentration_follows_megatron_core():
    """`_yarn_get_concentration_factor`: 0.1 ln(s) + 1 without DeepSeek's terms (gpt-oss, s = 32:
    1.34657), their ratio with both (DeepSeek-V3: 0.1 ln 40 + 1 over itself = 1), 1 for s <= 1."""
    assert YarnSpec(factor=32).concentration == pytest.approx(0.1 * math.log(32) + 1, rel=1e-12)
    assert YarnSpec(factor=32).concentration == pytest.approx(1.346574, abs=1e-6)
    assert YarnSpec(factor=40, mscale=1.0, mscale_all_dim=1.0).concentration == 1.0
    two = YarnSpec(factor=40, mscale=2.0, mscale_all_dim=1.0).concentration
    assert two == pytest.approx((0.2 * math.log(40) + 1) / (0.1 * math.log(40) + 1), rel=1e-12)
    assert YarnSpec(factor=1.0).concentration == 1.0
    assert load_model("deepseek-v3").yarn.concentration == 1.0
    arch = build_arch(load_model("gpt-oss-120b"))
    assert arch.expert_bias and arch.rope_concentration == pytest.approx(1.346574, abs=1e-6)


def test_gpt_oss_seconds_against_the_op_by_op_bytes():
    """One MoE layer, one micro-batch of 4 x 4096 tokens on one rank (TP 1, balanced routing):
    - RoPE on Q (64 heads of 64) and K (8 of 64): unfused 24 B forward, 20 B backward per
      element (t cos 4, negation of one half 2, cat 4, x sin 4, sum 6, cat 4; backward g sin 4,
      negation 2, cat 4, g cos 4, sum 6), less TE's fused 4 + 4: 20 and 16;
    - FC2 bias over the 4 x 16384 routed rows of width 2880: b p 2, sum 6, cat 4 = 12 forward;
      G p and G b with their reductions 6 + 6, the split pieces' gradients joined 4 = 16."""
    p = _oss()
    fwd, bwd = unfused_seconds(p, build_arch(p.model), _table(), moe=True)
    tokens = MB * SEQ
    qk = tokens * (64 * 64 + 8 * 64)
    routed = 4 * tokens * 2880
    assert fwd[0] == pytest.approx(_hbm_seconds(p, 20 * qk + 12 * routed), rel=1e-12)
    assert bwd[0] == pytest.approx(_hbm_seconds(p, 16 * qk + 16 * routed), rel=1e-12)
    # a dense layer of the same model has the RoPE part only
    fwd_d, bwd_d = unfused_seconds(p, build_arch(p.model), _table(), moe=False)
    assert fwd_d[0] == pytest.approx(_hbm_seconds(p, 20 * qk), rel=1e-12)
    assert bwd_d[0] == pytest.approx(_hbm_seconds(p, 16 * qk), rel=1e-12)


def test_tensor_parallel_shards_the_heads_and_expert_tp_multiplies_the_rows():
    """TP 2 halves the Q heads (K's 8 heads too: 8 >= 2) and the routed rows one rank routes;
    expert-TP 2 gives each rank both TP halves' routed rows back (etp k T / tp); beyond the 8 KV
    heads K stops shrinking."""
    p = _oss()
    arch = build_arch(p.model)
    one = unfused_seconds(p, arch, _table(), moe=True)
    two = unfused_seconds(p, arch, _table("dp32-tp2-pp1-vp1-cp1-ep32-etp2-z1-rnone-sp-mb4"),
                          moe=True)
    tokens = MB * SEQ
    qk2 = tokens * (64 * 64 + 8 * 64) / 2
    routed2 = 2 * 4 * tokens / 2 * 2880
    assert two[0][0] == pytest.approx(_hbm_seconds(p, 20 * qk2 + 12 * routed2), rel=1e-12)
    assert two[0][0] < one[0][0]
    # TP 16 over 8 KV heads: Q is cut 16 ways, K only 8 (each KV head replicates on two ranks)
    sixteen = unfused_seconds(p, arch, _table("dp4-tp16-pp1-vp1-cp1-ep4-etp1-z1-rnone-sp-mb4"),
                              moe=False)
    qk16 = tokens * (64 * 64 / 16 + 8 * 64 / 8)
    assert sixteen[0][0] == pytest.approx(_hbm_seconds(p, 20 * qk16), rel=1e-12)


def test_only_megatron_code_with_yarn_or_expert_biases_pays():
    """Other stacks' model code is timed by their own fitted elementwise factor; models without
    YaRN concentration or expert biases (Qwen3, DeepSeek-V3 at concentration 1) pay nothing."""
    for problem in (_oss(stack="torchtitan", gpu="h100"), _oss(stack="deepspeed", gpu="h100")):
        f, b = unfused_seconds(problem, build_arch(problem.model), _table(), moe=True)
        assert f[0] == 0.0 and b[0] == 0.0
    for model, layers in (("qwen3-30b-a3b", 48), ("deepseek-v3", 61)):
        p = make_problem(model, "gb200", 64, SEQ, 1280, stack="megatron-bridge")
        f, b = unfused_seconds(p, build_arch(p.model), _table(layers=layers), moe=True)
        assert f[0] == 0.0 and b[0] == 0.0
    plain = load_model("gpt-oss-120b").model_copy(update={"yarn": None, "linear_bias": None})
    p = make_problem(plain, "gb200", 64, SEQ, 1280, stack="megatron-bridge")
    f, b = unfused_seconds(p, build_arch(p.model), _table(), moe=True)
    assert f[0] == 0.0 and b[0] == 0.0


def test_the_step_carries_forward_and_backward_of_every_layer_and_micro_batch():
    """Without recompute, one stage: the compute item grows by 36 layers x 5 micro-batches
    (1280 / 64 / 4) x (forward + backward) of the unfused paths, against the same model with
    neither feature."""
    p = _oss()
    plain = p.model.model_copy(update={"yarn": None, "linear_bias": None})
    q = make_problem(plain, "gb200", 64, SEQ, 1280, stack="megatron-bridge",
                     moe_routing="balanced")
    t = _table()
    f, b = unfused_seconds(p, build_arch(p.model), t, moe=True)
    with_paths = time_ledger(p, build_arch(p.model), t)
    without = time_ledger(q, build_arch(q.model), t)
    extra = with_paths["compute"][0] - without["compute"][0]
    assert extra == pytest.approx(36 * 5 * (f[0] + b[0]), rel=1e-9)
    assert np.all(with_paths["step"] > without["step"])
