"""Full recompute of only the first N layers of each model chunk (Megatron `--recompute-method
block --recompute-num-layers N`): N covering every layer is today's full recompute exactly, N = 0
is no recompute exactly, and in between each stage keeps the activations of its other layers."""

from __future__ import annotations

import json

import pytest

from autoparallel import Layout, estimate, make_problem
from autoparallel.cost.arch import build_arch
from autoparallel.cost.memory import stage_memory
from autoparallel.cost.stages import stages
from autoparallel.errors import ExportError, SpecError
from autoparallel.evaluate import evaluate
from autoparallel.exporters import render
from autoparallel.layouts import LayoutTable
from conftest import run_cli

CASES = [  # model, gpus, seq, batch, layout axes (dense, MoE, interleaved, uneven split, ZB-V)
    ("llama3-70b", 256, 8192, 512, dict(tp=8, pp=8)),
    ("llama3-70b", 256, 8192, 512, dict(tp=4, pp=4, vp=5, cp=2)),
    ("llama3-405b", 2048, 8192, 1024, dict(tp=8, pp=16, stage_layers=[7] + [8] * 14 + [7])),
    ("qwen3-30b-a3b", 128, 4096, 512, dict(tp=2, pp=4, ep=8)),
    ("qwen3-30b-a3b", 128, 4096, 512, dict(tp=2, pp=4, vp=2, ep=4, schedule="zbv")),
]


def _ledgers(problem, layouts):
    return evaluate(problem, LayoutTable.from_layouts(layouts, problem.cluster.n_gpus,
                                                      problem.model.n_layers))


@pytest.mark.parametrize("model,n,seq,batch,axes", CASES)
def test_all_layers_is_full_recompute_and_none_is_no_recompute_exactly(model, n, seq, batch, axes):
    p = make_problem(model, "h100", n, seq, batch)
    layers = p.model.n_layers
    ev = _ledgers(p, [
        Layout(recompute="full", **axes),
        Layout(recompute="full", recompute_layers=layers, **axes),  # more than any chunk holds
        Layout(recompute="none", **axes),
        Layout(recompute="full", recompute_layers=0, **axes),
    ])
    for k, v in ev.memory.items():
        assert v[0] == v[1] and v[2] == v[3], k
    for k, v in ev.time.items():
        assert v[0] == v[1] and v[2] == v[3], k
    assert ev.time["recompute"][0] > 0 and ev.time["recompute"][3] == 0.0


def test_block_recompute_prices_the_recomputed_share_of_each_stage():
    # llama3-70b, PP8: 10 layers per stage; N = 3 recomputes 3 of them. Activations of each
    # stage: 3 layers at the full-recompute input (2sbh/t) and 7 layers at everything stored;
    # recompute time: 3/10 of full recompute's (every stage has the same layers).
    p = make_problem("llama3-70b", "h100", 256, 8192, 512)
    axes = dict(tp=8, pp=8)
    ev = _ledgers(p, [Layout(recompute="full", **axes), Layout(recompute="none", **axes),
                      Layout(recompute="full", recompute_layers=3, **axes)])
    full, none, part = (ev.memory["activations"][i] for i in range(3))
    assert part == pytest.approx(0.3 * full + 0.7 * none, rel=1e-12)
    assert ev.time["recompute"][2] == pytest.approx(0.3 * ev.time["recompute"][0], rel=1e-12)
    assert ev.time["compute"][2] == ev.time["compute"][0]  # the same forward and backward
    # the working set of one re-materialised layer stays while any layer is recomputed
    assert ev.memory["overhead"][2] == ev.memory["overhead"][0] > ev.memory["overhead"][1]
    # interleaved: N counts per model chunk (Megatron applies the block method per chunk);
    # pp4 vp5 leaves 4 layers per chunk, N = 1 recomputes a quarter of the stage
    axes = dict(tp=8, pp=4, vp=5)
    ev = _ledgers(p, [Layout(recompute="full", **axes),
                      Layout(recompute="full", recompute_layers=1, **axes)])
    assert ev.time["recompute"][1] == pytest.approx(0.25 * ev.time["recompute"][0], rel=1e-12)


def test_uneven_split_recomputes_a_share_of_each_stage_of_its_own():
    # 405B on PP16 [7, 8 x 14, 7]: N = 7 recomputes every layer of the first and last stages
    # and 7 of the 8 of each middle one, which keeps one layer's activations whole
    p = make_problem("llama3-405b", "h100", 2048, 8192, 1024)
    sl = [7] + [8] * 14 + [7]
    lays = [Layout(tp=8, pp=16, stage_layers=sl, recompute=r, recompute_layers=n)
            for r, n in (("full", None), ("none", None), ("full", 7))]
    t = LayoutTable.from_layouts(lays, p.cluster.n_gpus, p.model.n_layers)
    arch = build_arch(p.model)
    act = {name: stage_memory(p, arch, t, st)["activations"]
           for name, st in stages(arch, t, p.training.global_batch).items()}
    for name in ("first", "last"):
        assert act[name][2] == act[name][0]
    mid = act["middle"]
    assert mid[2] == pytest.approx(7 / 8 * mid[0] + 1 / 8 * mid[1], rel=1e-12)
    assert mid[2] > act["first"][2]


def test_slug_json_and_cli_show_the_recomputed_layers():
    lay = Layout(dp=4, tp=8, pp=8, sp=True, recompute="full", recompute_layers=3)
    assert lay.slug == "dp4-tp8-pp8-vp1-cp1-ep1-z1-rfull3-sp-mb1"
    assert Layout.from_slug(lay.slug) == lay
    assert Layout.from_slug("dp4-tp8-pp8-z1-rfull-sp-mb1").recompute_layers is None
    r = run_cli("estimate", "--model", "llama3-70b", "--gpu", "h100", "--gpus", 256,
                "--seq-len", 8192, "--global-batch", 512, "--tp", 8, "--pp", 8,
                "--recompute", "full", "--recompute-num-layers", 3, "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["layout"]["recompute"] == "full" and out["layout"]["recompute_layers"] == 3
    r = run_cli("estimate", "--model", "llama3-70b", "--gpu", "h100", "--gpus", 256,
                "--seq-len", 8192, "--global-batch", 512, "--tp", 8, "--pp", 8,
                "--recompute-num-layers", 3)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "recompute_layers" in r.stderr and "recompute = full" in r.stderr


def test_recompute_layers_need_full_recompute():
    with pytest.raises(ValueError, match="needs recompute = full"):
        Layout(tp=8, recompute="selective", recompute_layers=2)


def test_megatron_writes_block_flags_and_other_targets_refuse_or_map():
    p = make_problem("llama3-70b", "h100", 256, 8192, 512)
    axes = dict(tp=8, pp=8)
    text = render("megatron", p, Layout(recompute="full", recompute_layers=3, **axes))
    assert "--recompute-granularity full --recompute-method block --recompute-num-layers 3" in text
    assert "--recompute-method uniform" not in text
    full = render("megatron", p, Layout(recompute="full", **axes))
    assert "--recompute-method uniform --recompute-num-layers 1" in full
    # N covering the chunk's 10 layers is full recompute, N = 0 none: every target writes them
    assert render("megatron", p, Layout(recompute="full", recompute_layers=10, **axes)) == full
    assert "--recompute" not in render("megatron", p, Layout(recompute="full", recompute_layers=0,
                                                             **axes))
    for target in ("torchtitan", "deepspeed", "nanotron"):
        with pytest.raises(ExportError, match="first 3 layers of each model chunk") as err:
            render(target, p, Layout(recompute="full", recompute_layers=3, **axes))
        assert "megatron, slurm" in str(err.value)
    # TorchTitan's every-Nth-layer checkpointing (selective_ac_option = "N") is a different
    # thing; the whole-stage cases map to its full / none modes
    assert render("torchtitan", p, Layout(recompute="full", recompute_layers=10, **axes)) == \
        render("torchtitan", p, Layout(recompute="full", **axes))


def test_spec_error_is_readable_for_a_negative_count():
    with pytest.raises(SpecError, match="recompute_layers"):
        estimate(make_problem("llama3-70b", "h100", 256, 8192, 512),
                 {"tp": 8, "pp": 8, "recompute": "full", "recompute_layers": -1})
