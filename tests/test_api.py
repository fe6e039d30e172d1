"""The Python API a launcher imports instead of shelling out: autoparallel.plan / estimate /
estimate_out / export, with a Problem or keyword problem arguments."""

import pandas as pd
import pytest

import autoparallel as ap
from autoparallel.evaluate import estimate as estimate_dict
from autoparallel.exporters import render
from autoparallel.output.frames import SWEEP_COLUMNS
from autoparallel.schema import EstimateOut, PlanOut

KW = dict(model="llama3-8b", gpu="h100", gpus=8, seq_len=4096, global_batch=64)


def test_plan_returns_typed_results_and_a_frame():
    report = ap.plan(**KW, top=4)
    assert isinstance(report, ap.PlanReport) and isinstance(report.out, PlanOut)
    assert isinstance(report.frame, pd.DataFrame) and list(report.frame.columns) == list(SWEEP_COLUMNS)
    assert len(report.layouts) == len(report.out.ranked) == len(report.frame) == 4
    for rank, (layout, row, ranked) in enumerate(zip(report.layouts, report.frame.itertuples(),
                                                     report.out.ranked), start=1):
        assert ranked.rank == row.rank == rank
        assert (layout.dp, layout.tp, layout.pp, layout.cp, layout.zero, layout.micro_batch) == (
            row.dp, row.tp, row.pp, row.cp, row.zero, row.micro_batch)
        assert ranked.layout.dp == layout.dp and ranked.time_s.step == pytest.approx(row.time_step_s)
    assert report.out.problem.n_gpus == 8 and report.layout(1) == report.layouts[0]
    same = ap.plan(ap.make_problem("llama3-8b", "h100", 8, seq_len=4096, global_batch=64), top=4)
    assert same.layouts == report.layouts


def test_plan_report_exports_its_layouts():
    report = ap.plan(**KW, top=2)
    # Megatron-LM writes every layout of the megatron-core stack (#2 may use any CP form)
    assert report.export("megatron", rank=2) == render("megatron", report.problem, report.layout(2))
    with pytest.raises(ap.SpecError, match="holds ranks 1 to 2"):
        report.layout(3)


def test_plan_with_nothing_fitting_raises_when_a_layout_is_asked_for():
    report = ap.plan(model="llama3-405b", gpu="h100", gpus=8, seq_len=8192, global_batch=64, top=1)
    assert report.layouts == () and report.out.n_fit == 0 and report.out.ranked == []
    with pytest.raises(ap.InfeasibleError):
        report.layout(1)


def test_estimate_keeps_the_historical_call_and_accepts_keywords_and_slugs():
    problem = ap.make_problem(**{"model": "llama3-8b", "gpu": "h100", "n_gpus": 8,
                                 "seq_len": 4096, "global_batch": 64})
    layout = ap.Layout(zero=2, micro_batch=2)
    rec = ap.estimate(problem, layout)
    assert rec == estimate_dict(problem, layout) and isinstance(rec, dict)
    assert ap.estimate(layout=layout, **KW) == rec
    assert ap.estimate(problem, "dp8-tp1-pp1-vp1-cp1-ep1-z2-rnone-mb2") == rec
    assert ap.estimate(problem, {"zero": 2, "micro_batch": 2}) == rec
    typed = ap.estimate_out(problem, layout)
    assert isinstance(typed, EstimateOut) and typed.model_dump() == rec
    assert typed.memory_gib.total == rec["memory_gib"]["total"]


def test_export_matches_render_with_a_problem_or_keywords():
    problem = ap.make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
    layout = ap.Layout(tp=8, pp=4, vp=5, recompute="selective")
    text = ap.export("megatron", problem, layout)
    assert text == render("megatron", problem, layout)
    assert ap.export("megatron", layout=layout, model="llama3-70b", gpu="h100", gpus=64,
                     seq_len=8192, global_batch=512) == text
    with pytest.raises(ap.ExportError, match="targets that can launch it: megatron, torchtitan, slurm"):
        ap.export("nanotron", problem, layout)


@pytest.mark.parametrize("call,needle", [
    (lambda p: ap.estimate(p, ap.Layout(), model="llama3-8b"), "not both"),
    (lambda p: ap.estimate(None, ap.Layout(), model="llama3-8b"), "missing problem keyword(s) gpu"),
    (lambda p: ap.plan(**KW, nodes=2), "unknown problem keyword(s) nodes"),
    (lambda p: ap.estimate(p), "missing layout"),
    (lambda p: ap.estimate(p, 42), "must be a Layout, a slug or a dict"),
    (lambda p: ap.estimate(p, "dp8-tq2"), "slug part 'tq2'"),
    (lambda p: ap.estimate(p, {"zero": 9}), "`zero`"),
    (lambda p: ap.estimate("llama3-8b", ap.Layout()), "must be a Problem"),
    (lambda p: ap.plan(p, top=0), "`top` = 0"),
])
def test_api_errors_are_spec_errors(call, needle):
    problem = ap.make_problem("llama3-8b", "h100", 8, seq_len=4096, global_batch=64)
    with pytest.raises(ap.SpecError) as exc:
        call(problem)
    assert needle in str(exc.value)
