"""Where an MoE model's layer kinds sit (leading dense layers, Llama-4's interleaved MoE layers,
DeepSeek-V3's multi-token-prediction module on the last stage), derived by hand."""

import numpy as np
import pytest

from autoparallel import Layout, make_problem
from autoparallel.cost.model_arch import build_arch
from autoparallel.cost.stages import stages
from autoparallel.layouts import LayoutTable


def _stages(model, slug, n):
    p = make_problem(model, "h100", n, 4096, 1024)
    arch = build_arch(p.model)
    t = LayoutTable.from_layouts([Layout.from_slug(slug)], n, p.model.n_layers)
    return arch, stages(arch, t, 1024)


def test_interleaved_moe_layers_split_evenly_over_the_stages():
    """Llama-4 Maverick, interleave_moe_layer_step 2: layers 1, 3, ..., 47 are MoE. On pp 4 each
    stage holds 12 layers, 6 of each kind; on pp 3 (16 layers) 8 of each."""
    for slug, n, per in (("dp8-tp1-pp4-vp1-cp1-ep8-z1-rnone-mb1", 32, 6),
                         ("dp8-tp1-pp3-vp1-cp1-ep8-z1-rnone-mb1", 24, 8)):
        arch, st = _stages("llama4-maverick", slug, n)
        for name in ("first", "middle", "last"):
            assert (float(st[name].n_dense[0]), float(st[name].n_moe[0])) == (per, per), name


def test_deepseek_v3_keeps_dense_layers_first_and_mtp_last():
    """61 layers as [3, 4x14, 2]: the first stage holds the 3 dense layers, the middle 4 MoE,
    the last its 2 MoE layers plus the MTP module's block (a third MoE block) and a second pass
    through the output head."""
    arch, st = _stages("deepseek-v3", "dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep64-etp1-z1-rnone-sp-mb1",
                       1024)
    assert arch.n_mtp == 1
    assert (float(st["first"].n_dense[0]), float(st["first"].n_moe[0])) == (3.0, 0.0)
    assert (float(st["middle"].n_dense[0]), float(st["middle"].n_moe[0])) == (0.0, 4.0)
    assert (float(st["last"].n_dense[0]), float(st["last"].n_moe[0])) == (0.0, 3.0)
    assert st["last"].mtp == 1.0 and st["first"].mtp == 0.0


def test_mtp_adds_a_block_a_head_pass_and_its_flops():
    """Without the module (mtp_layers 0) the last stage is one MoE block and one head pass
    lighter; model FLOPs per token grow by 6 x (the block's active weights + 2h^2 + hV) plus
    its causal attention 3 s n_h (d_qk + d_v)."""
    from autoparallel.presets import load_model

    m = load_model("deepseek-v3")
    with_mtp, without = build_arch(m), build_arch(m.model_copy(update={"mtp_layers": 0}))
    s = 4096.0
    block = (with_mtp.attn_params + 8 * with_mtp.p_routed / 256 + with_mtp.p_shared
             + 2 * 7168 * 7168 + 7168 * 129280)
    extra = 6 * s * block + 3 * s * s * with_mtp.attn_score_width
    assert with_mtp.model_flops_per_sequence(4096) - without.model_flops_per_sequence(4096) == \
        pytest.approx(extra, rel=1e-12)
    p = make_problem("deepseek-v3", "h100", 1024, 4096, 8192)
    q = make_problem(m.model_copy(update={"mtp_layers": 0}), "h100", 1024, 4096, 8192)
    from autoparallel import estimate

    lay = Layout.from_slug("dp32-tp2-pp16[3,4x14,2]-vp1-cp1-ep64-etp1-z1-rselective-sp-mb1")
    a, b = estimate(p, lay), estimate(q, lay)
    last = lambda r: next(x for x in r["memory_gib"]["by_stage"] if x["stage"] == "last")  # noqa: E731
    assert last(a)["params"] > last(b)["params"] and last(a)["activations"] > last(b)["activations"]
    assert np.isclose(a["model_flops_per_step"] - b["model_flops_per_step"], 8192 * extra, rtol=1e-9)
