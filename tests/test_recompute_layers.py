"""Full recompute of only the first N layers of each model chunk (Megatron `--recompute-method
block --recompute-num-layers N`): N covering every layer is today's full recompute exactly, N = 0
is no recompute exactly, and in between each stage keeps the activations of its other layers."""

from __future__ import annotations

import json

import pytest

from autoparallel import Layout, estimate, make_problem
from autoparallel.cost.model_arch import build_arch
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


# ---------------------------------------------------------------- searched by plan (opt-in)

TIGHT = dict(tp=[1], pp=[1], cp=[1], zero=[1], micro_batch=[1], recompute=["none", "full"])
"""Llama-3-8B, seq 8192, on 8 H100 as plain ZeRO-1 DP with one sequence per micro-batch: full
recompute fits, none does not (~101 of ~79 usable GiB) - the block method's case."""


def _tight():
    return make_problem("llama3-8b", "h100", 8, seq_len=8192, global_batch=64)


def test_default_search_is_unchanged_and_the_axis_only_adds_rows():
    from autoparallel.search.enumerate import enumerate_layouts
    from autoparallel.search.space import SearchSpace

    p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
    default = enumerate_layouts(p)
    assert not (default["rn"] >= 0).any()
    opened = enumerate_layouts(p, SearchSpace(recompute_layers_auto=True))
    n = len(default)
    for col in default.columns:  # the default rows first, bit for bit
        assert (opened[col][:n] == default[col]).all(), col
    added = opened.take(slice(n, None))
    assert len(added) > 0 and (added["rc"] == 2).all()
    full_rows = int(((default["rc"] == 2) & (default["rn"] == -1)).sum())
    assert len(added) <= 3 * full_rows
    # auto: a quarter, half and three quarters of the largest chunk, e.g. 80 layers on pp 4
    # (chunks of 20) -> 5, 10, 15; on pp 4 x vp 5 (chunks of 4) -> 1, 2, 3; chunks of 2 -> 1;
    # chunks of one layer have no N between none and every layer
    for pp, vp, want in ((4, 1, {5, 10, 15}), (4, 5, {1, 2, 3}), (8, 5, {1}), (8, 10, set())):
        rows = (added["pp"] == pp) & (added["vp"] == vp) & (added["lf"] == 0)
        assert set(added["rn"][rows].tolist()) == want, (pp, vp)
        assert ((default["pp"] == pp) & (default["vp"] == vp) & (default["rc"] == 2)).any()


def test_explicit_counts_keep_those_between_none_and_every_layer():
    from autoparallel.search.enumerate import enumerate_layouts
    from autoparallel.search.space import SearchSpace

    t = enumerate_layouts(_tight(), SearchSpace(**TIGHT, recompute_layers=[0, 4, 31, 32, 40]))
    # 32 layers in one chunk: 0 (= none) and >= 32 (= every layer) are searched already
    assert sorted(t["rn"].tolist()) == [-1, -1, 4, 31]


def test_plan_ranks_block_recompute_above_full_when_it_fits_and_is_faster():
    """Recomputing N of 32 layers costs N/32 of full recompute's extra time (the recompute is
    priced per layer) and keeps the activations of the other 32 - N layers. The plan's #1 is
    the smallest N that fits (22 of 32: the capacity less CUDA context and NCCL's measured
    per-communicator memory); full recompute and N = 21 rank below or do not fit."""
    from autoparallel.search.plan import plan
    from autoparallel.search.space import SearchSpace

    p = _tight()
    closed = plan(p, SearchSpace(**TIGHT), top=5)
    assert [closed.survivors.table.row(i).slug for i in range(len(closed.survivors))] == [
        "dp8-tp1-pp1-vp1-cp1-ep1-z1-rfull-mb1"]  # none does not fit
    every = plan(p, SearchSpace(**TIGHT, recompute_layers=list(range(1, 32))), top=40)
    t, ev = every.survivors.table, every.survivors
    slugs = [t.row(i).slug for i in range(len(t))]
    assert slugs[0] == "dp8-tp1-pp1-vp1-cp1-ep1-z1-rfull22-mb1"
    assert slugs[-1] == "dp8-tp1-pp1-vp1-cp1-ep1-z1-rfull-mb1"  # slowest that fits
    assert "dp8-tp1-pp1-vp1-cp1-ep1-z1-rfull21-mb1" not in slugs  # 21 does not fit
    counts = (0, 20, 21, 22, 23, 32)
    lays = [Layout(tp=1, zero=1, recompute="full" if n else "none",
                   recompute_layers=n if n not in (0, 32) else None) for n in counts]
    e = evaluate(p, LayoutTable.from_layouts(lays, 8, 32))
    step = dict(zip(counts, e.time["step"].tolist()))
    peak = dict(zip(counts, e.memory["fit_peak"].tolist()))
    usable = float(e.memory["usable"][0])
    assert peak[21] > usable >= peak[22]
    # time: linear in the recomputed layers, to rounding
    assert step[22] == pytest.approx(step[0] + 22 / 32 * (step[32] - step[0]), rel=1e-9)
    assert ev.time["step"][0] == pytest.approx(step[22], rel=1e-12)
    assert step[32] - step[22] == pytest.approx(10 / 32 * (step[32] - step[0]), rel=1e-9)
    assert step[22] < 0.95 * step[32]  # ~7 % faster than full recompute
    # memory: each layer not recomputed keeps its activations, ~34 bytes x s x h in bf16 with
    # flash attention (Korthikanti et al. 2022, arXiv 2205.05198 Table 2 without the 5as/h
    # score term): 34 x 8192 x 4096 B = 1.0625 GiB; the ledger's SwiGLU / GQA terms within 1 %
    per_layer = peak[22] - peak[23]
    assert per_layer == pytest.approx(peak[20] - peak[21], rel=1e-9)
    assert per_layer / 2**30 == pytest.approx(34 * 8192 * 4096 / 2**30, rel=0.01)
    # auto tries 8, 16, 24 of the 32: only 24 fits, and it beats full recompute
    auto = plan(p, SearchSpace(**TIGHT, recompute_layers_auto=True), top=5)
    assert [auto.survivors.table.row(i).slug for i in range(len(auto.survivors))] == [
        "dp8-tp1-pp1-vp1-cp1-ep1-z1-rfull24-mb1", "dp8-tp1-pp1-vp1-cp1-ep1-z1-rfull-mb1"]


def test_cli_plan_and_sweep_take_recompute_num_layers(tmp_path):
    args = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "8192",
            "--global-batch", "64", "--tp", "1", "--pp", "1", "--cp", "1", "--zero", "1",
            "--micro-batch", "1"]
    out = run_cli("plan", *args, "--recompute", "none,full", "--recompute-num-layers", "auto",
                  "--format", "json")
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)["ranked"][0]["layout"]
    assert (first["recompute"], first["recompute_layers"]) == ("full", 24)
    bad = run_cli("plan", *args, "--recompute-num-layers", "half")
    assert bad.returncode == 2 and "`--recompute-num-layers` = 'half'" in bad.stderr
    assert "or auto" in bad.stderr and "Traceback" not in bad.stderr
    none = run_cli("plan", *args, "--recompute", "none", "--recompute-num-layers", "4")
    assert none.returncode == 2 and "allow --recompute full" in none.stderr
    csv, spec = tmp_path / "s.csv", tmp_path / "sweep.toml"
    spec.write_text('[sweep]\nmodel = ["llama3-8b"]\ngpu = ["h100"]\ngpus = [8]\n'
                    'seq_len = [4096]\nglobal_batch = [64]\n[space]\ntp = [1]\npp = [1]\ncp = [1]\nzero = [1]\nmicro_batch = [1]\n'
                    'recompute = ["full"]\n')
    sw = run_cli("sweep", str(spec), "--recompute-num-layers", "8,16", "--output", str(csv))
    assert sw.returncode == 0, sw.stderr
    import csv as csvlib

    # the sweep CSV has no recompute_layers column (schema v4): a block row shows as `full`,
    # told apart by its recompute time, 8/32 and 16/32 of every layer's
    rows = list(csvlib.DictReader(csv.open()))
    assert [r["recompute"] for r in rows] == ["full"] * 3
    low, mid, full = sorted(float(r["time_recompute_s"]) for r in rows)
    assert (low / full, mid / full) == (pytest.approx(8 / 32, rel=1e-9),
                                        pytest.approx(16 / 32, rel=1e-9))
