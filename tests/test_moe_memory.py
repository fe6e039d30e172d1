"""MoE memory (`cost.moe_memory`) against derivations written out here: the routed experts'
tensors per rank (expert TP keeps the whole FC1 input on every expert-TP rank), the
low-precision inputs, what `moe_act` frees, DeepEP's buffers, and the stage ledger they feed."""

import numpy as np
import pytest

from autoparallel import Layout, estimate, make_problem
from autoparallel.cost.model_arch import build_arch
from autoparallel.cost.memory import layer_activation_bytes
from autoparallel.cost.moe_memory import (dispatch_buffer_bytes, moe_act_bytes,
                                          routed_activation_bytes)
from autoparallel.layouts import LayoutTable
from autoparallel.units import GiB

H, K, F_E = 7168, 8, 2048  # DeepSeek-V3
PUB = "dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep64-etp1-z1-rselective-sp-mb1"
TP_EXPERTS = "dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep32-z1-rselective-sp-mb1"


def _p(**job):
    return make_problem("deepseek-v3", "h100", 1024, 4096, 8192, moe_routing="balanced", **job)


def _t(*slugs):
    return LayoutTable.from_layouts([Layout.from_slug(s) for s in slugs], 1024, 61)


def test_routed_tensors_per_rank_keep_the_whole_fc1_input_with_expert_tp():
    """tp 2 with SP: a rank routes T_r = 2048 of the 4096 tokens. etp = tp = 2 (EP 32): after
    the expert-TP all-gather it holds X = 2 x 8 x 2048 = 32,768 copies, each 2h (FC1 input,
    whole) + 6 f_e / 2 (SwiGLU FC1 output and activation, split) + 4 (fp32 probability) =
    14,336 + 6,144 + 4 = 20,484 bytes: 671,219,712; the FC1 input alone is 2 h k T =
    469,762,048 bytes, not / t. etp = 1 (EP 64): 16,384 copies of 14,336 + 12,288 + 4 = 26,628
    bytes: 436,273,152."""
    p = _p()
    arch = build_arch(p.model)
    got = routed_activation_bytes(p, arch, _t(TP_EXPERTS, PUB))
    assert got.tolist() == [32768 * 20484, 16384 * 26628]
    assert 32768 * 2 * H == 2 * H * K * 4096 == 469_762_048


def test_low_precision_keeps_the_expert_inputs_quantised():
    """MXFP8 on Transformer Engine: FC1 and FC2 inputs (2h + 2 f_e / etp per copy) at 1 + 1/32
    bytes per element instead of 2: per copy (2 - 1.03125) / 2 x (14,336 + 4,096) fewer bytes."""
    p, q = _p(), make_problem("deepseek-v3", "b200", 1024, 4096, 8192, precision="mxfp8",
                              moe_routing="balanced")
    arch = build_arch(p.model)
    t = _t(PUB)
    bf16, mx = routed_activation_bytes(p, arch, t)[0], routed_activation_bytes(q, arch, t)[0]
    assert bf16 - mx == pytest.approx(16384 * (2 - 1.03125) / 2 * (2 * H + 2 * F_E), rel=1e-12)


def test_moe_act_frees_the_fc2_inputs_and_imbalance_scales_the_copies():
    p = _p()
    arch = build_arch(p.model)
    assert moe_act_bytes(p, arch, _t(PUB))[0] == 16384 * 2 * F_E
    cap = make_problem("deepseek-v3", "h100", 1024, 4096, 8192, moe_routing="capacity",
                       moe_capacity_factor=1.5)
    assert routed_activation_bytes(cap, arch, _t(PUB))[0] == 1.5 * 16384 * 26628
    # the layer's activations carry the routed tensors: etp 2 (EP 32) minus etp 1 (EP 64) is
    # exactly the difference of the routed bytes (nothing else in the layer depends on etp)
    none = np.zeros(2, dtype=np.int64)
    layer = layer_activation_bytes(p, arch, _t(TP_EXPERTS, PUB), moe=True, recompute=none)
    assert layer[0] - layer[1] == 32768 * 20484 - 16384 * 26628


def test_deepep_buffers_from_its_size_hints():
    """EP 64 (8 NVLink ranks x 8 RDMA ranks), 10 channels, 2h = 14,336 hidden bytes:
    NVLink 10 x 8 x 288 x (14,336 + 2,056) = 377,671,680 bytes; RDMA
    10 x 8 x 128 x (14,336 + 2,056 + 16) x 2 = 336,035,840 bytes; EP 8 has no RDMA buffer:
    10 x 8 x 256 x 16,392 = 335,708,160. The alltoall dispatcher reserves none. They live
    outside PyTorch's allocator, so the usable memory shrinks by them."""
    p = _p(moe_dispatcher="deepep")
    arch = build_arch(p.model)
    t = _t(PUB, "dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep8-etp1-z1-rselective-sp-mb1")
    assert dispatch_buffer_bytes(p, arch, t).tolist() == [377_671_680 + 336_035_840, 335_708_160]
    assert dispatch_buffer_bytes(_p(), arch, t).tolist() == [0.0, 0.0]
    a, b = estimate(_p(), Layout.from_slug(PUB)), estimate(p, Layout.from_slug(PUB))
    assert (a["memory_gib"]["usable"] - b["memory_gib"]["usable"]) * GiB == pytest.approx(
        713_707_520, rel=1e-12)
