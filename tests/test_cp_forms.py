"""Context-parallel forms as a layout axis: the slug, the spec's checks, the search per stack, the
JSON and CSV columns, `--versus`, batch estimates, `export --from`, and the tune parameters. The
costs of each form are checked against hand derivations in tests/test_ledger_terms.py."""

import json

import numpy as np
import pandas as pd
import pytest

from autoparallel import Layout, LayoutTable, make_problem
from autoparallel.errors import SpecError
from autoparallel.search.enumerate import enumerate_layouts
from autoparallel.search.plan import plan
from autoparallel.search.space import SearchSpace
from conftest import run_cli
from launcher_checks import megatron_script_layout

LONG = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--seq-len", "131072",
        "--global-batch", "16"]


@pytest.mark.parametrize("slug, form, a2a", [
    ("dp2-tp4-pp1-vp1-cp8:ring-ep1-z1-rnone-sp-mb1", None, None),
    ("dp2-tp4-pp1-vp1-cp8:a2a-ep1-z1-rnone-sp-mb1", "a2a", None),
    ("dp2-tp4-pp1-vp1-cp8:allgather-ep1-z1-rnone-sp-mb1", "allgather", None),
    ("dp2-tp4-pp1-vp1-cp8:a2a2+ring4-ep1-z1-rnone-sp-mb1", "a2a+ring", 2),
])
def test_slug_round_trip_of_every_form(slug, form, a2a):
    lay = Layout.from_slug(slug)
    assert (lay.cp_comm, lay.cp_a2a) == (form, a2a)
    assert lay.slug == slug
    t = LayoutTable.from_layouts([lay], 64)
    assert t.row(0).slug == slug
    # without a form the cp part is the ring, as Megatron-Core's default p2p
    assert Layout.from_slug(slug.replace(slug.split("-")[4], "cp8")).cp_form.value == "ring"


@pytest.mark.parametrize("text, needle", [
    ("cp8:a2a3+ring3", "a2a 3 x ring 3 = 9, not cp = 8"),
    ("cp8:ulysses", "not understood"),
])
def test_bad_cp_form_in_a_slug_is_named(text, needle):
    with pytest.raises(ValueError, match=needle):
        Layout.from_slug(f"dp1-{text}-z1")


def test_layout_checks_the_hierarchical_split():
    with pytest.raises(ValueError, match="needs `cp_a2a`"):
        Layout(cp=8, cp_comm="a2a+ring")
    with pytest.raises(ValueError, match="e.g. 2, 4"):
        Layout(cp=8, cp_comm="a2a+ring", cp_a2a=8)
    with pytest.raises(ValueError, match="has no such divisor"):
        Layout(cp=2, cp_comm="a2a+ring", cp_a2a=2)
    with pytest.raises(ValueError, match="needs cp_comm = a2a\\+ring"):
        Layout(cp=8, cp_comm="a2a", cp_a2a=2)
    # cp = 1 has nothing to exchange: the form is dropped, as sp is at tp = 1
    assert Layout(cp=1, cp_comm="allgather").cp_comm is None
    assert Layout(cp=4, cp_comm="ring").cp_comm is None  # ring is the default


def test_search_crosses_cp_rows_with_the_stack_forms():
    # megatron-core: all four (the hierarchical form once per split); fsdp: none, cp stays 1;
    # deepspeed: Ulysses only; a given --cp-comm narrows them
    forms = {}
    for stack in ("megatron-core", "deepspeed", "torchtitan", "fsdp"):
        p = make_problem("llama3-8b", "h100", 16, seq_len=32768, global_batch=16, stack=stack)
        t = enumerate_layouts(p, SearchSpace(tp=[1], pp=[1], zero=[1], recompute=["none"],
                                             micro_batch=[1]))
        cp8 = t.take(t["cp"] == 8)
        forms[stack] = sorted({(int(c), int(u)) for c, u in zip(cp8["cc"], cp8["cu"])})
    assert forms["megatron-core"] == [(0, 1), (1, 1), (2, 1), (3, 2), (3, 4)]
    assert forms["deepspeed"] == [(1, 1)]
    assert forms["torchtitan"] == [(0, 1), (2, 1)]
    assert forms["fsdp"] == []
    p = make_problem("llama3-8b", "h100", 16, seq_len=32768, global_batch=16)
    t = enumerate_layouts(p, SearchSpace(cp=[8], cp_comm=["a2a+ring"], cp_a2a=[4]))
    assert set(t["cc"].tolist()) == {3} and set(t["cu"].tolist()) == {4}


def test_a_stack_without_cp_refuses_a_cp_request_by_name():
    p = make_problem("llama3-8b", "h100", 16, seq_len=32768, global_batch=16, stack="fsdp")
    with pytest.raises(SpecError, match="fsdp stack has no context parallelism"):
        enumerate_layouts(p, SearchSpace(cp=[4]))
    p = make_problem("llama3-8b", "h100", 16, seq_len=32768, global_batch=16)
    with pytest.raises(SpecError, match="needs an all-to-all group size"):
        enumerate_layouts(p, SearchSpace(cp=[2], cp_comm=["a2a+ring"]))


def test_plan_ranks_each_form_and_says_which(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per sentence
    r = run_cli("plan", *LONG, "--top", "5")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("best per context-parallel"))
    for form in ("ring #", "a2a", "allgather #", "a2a+ring #"):
        assert form in line
    assert ":ring" in r.stdout or ":a2a" in r.stdout or ":allgather" in r.stdout
    js = json.loads(run_cli("plan", *LONG, "--top", "40", "--format", "json").stdout)
    seen = {(e["layout"]["cp_comm"], e["layout"]["cp_a2a"]) for e in js["ranked"]}
    assert all(c in (None, "ring", "a2a", "allgather", "a2a+ring") for c, _ in seen)
    assert all((c == "a2a+ring") == (u is not None) for c, u in seen)
    assert int(js["schema_version"]) >= 5  # the CP forms are in the schema since version 5


def test_versus_takes_a_form_slug():
    slug = "dp2-tp1-pp1-vp1-cp8:allgather-ep1-z3-rfull-mb1"
    r = run_cli("plan", *LONG, "--top", "3", "--versus", slug)
    assert r.returncode == 0, r.stderr
    assert f"versus {slug}" in " ".join(r.stdout.split())


def test_estimate_cli_form_flags_and_errors():
    r = run_cli("estimate", *LONG, "--cp", "8", "--cp-comm", "a2a+ring", "--cp-a2a", "4",
                "--zero", "3", "--recompute", "full", "--format", "json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert (rec["layout"]["cp_comm"], rec["layout"]["cp_a2a"]) == ("a2a+ring", 4)
    bad = run_cli("estimate", *LONG, "--cp", "8", "--cp-comm", "a2a+ring")
    assert bad.returncode == 2 and "cp_a2a" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_cli("plan", *LONG, "--cp-comm", "ulysses")
    assert bad.returncode == 2 and "choose from ring, a2a, allgather, a2a+ring" in bad.stderr
    # Llama-3-8B has 8 KV heads: a2a over 16 ranks is refused with the reason
    bad = run_cli("estimate", *LONG, "--cp", "16", "--cp-comm", "a2a")
    assert bad.returncode == 2 and "8 KV heads must divide by 16" in bad.stderr


def test_csv_columns_and_export_from_a_row(tmp_path):
    p = make_problem("llama3-8b", "h100", 16, seq_len=131072, global_batch=16)
    frame = plan(p, SearchSpace(cp=[8], cp_comm=["a2a+ring"], cp_a2a=[2]), top=3,
                 with_study=False).to_frame()
    assert (frame["cp_comm"] == "a2a+ring").all() and (frame["cp_a2a"] == 2).all()
    path = tmp_path / "sweep.csv"
    frame.to_csv(path, index=False)
    r = run_cli("export", "--target", "megatron", "--from", path, "--row", "1")
    assert r.returncode == 0, r.stderr
    got = megatron_script_layout(r.stdout)
    assert (got["cp"], got["cp_comm"], got["cp_a2a"]) == (8, "a2a+ring", 2)
    # a row whose form column contradicts its slug is refused by name
    text = path.read_text().replace("a2a+ring,2", "allgather,", 1)
    path.write_text(text)
    r = run_cli("export", "--target", "megatron", "--from", path, "--row", "1")
    assert r.returncode == 2 and "cp_comm" in r.stderr


def test_batch_estimate_reads_the_form_columns(tmp_path):
    rows = pd.DataFrame([
        dict(model="llama3-8b", gpu="h100", n_gpus=16, seq_len=131072, global_batch=16, tp=1,
             pp=1, cp=8, cp_comm=form, cp_a2a=a2a, zero=3, recompute="full", micro_batch=1)
        for form, a2a in (("ring", ""), ("a2a", ""), ("allgather", ""), ("a2a+ring", 2),
                          ("a2a+ring", ""))])
    path = tmp_path / "in.csv"
    rows.to_csv(path, index=False)
    r = run_cli("estimate", "--input", path)
    assert r.returncode == 0, r.stderr
    from io import StringIO

    out = pd.read_csv(StringIO(r.stdout), keep_default_na=False)
    assert (out["error"][:4] == "").all()
    assert "cp_a2a" in out["error"][4]
    cp = out["time_cp_comm_s"][:4].astype(float)
    assert len(set(np.round(cp, 9))) == 4  # each form costs differently


def test_tune_parameters_tell_the_forms_apart():
    from autoparallel.search.study import PARAM_AXES
    from autoparallel.tune.command import layout_values
    from autoparallel.tune.pool import _key, layout_params

    a = Layout(cp=8, dp=2, cp_comm="a2a+ring", cp_a2a=2).resolved(16)
    b = Layout(cp=8, dp=2, cp_comm="a2a+ring", cp_a2a=4).resolved(16)
    c = Layout(cp=8, dp=2).resolved(16)
    keys = {_key(layout_params(x)) for x in (a, b, c)}
    assert len(keys) == 3 and {"cp_comm", "cp_a2a"} <= set(PARAM_AXES)
    p = make_problem("llama3-8b", "h100", 16, seq_len=131072, global_batch=16)
    v = layout_values(p, a, trial=1, study="s", trial_dir=None, grad_accum=8)
    assert (v["cp_comm"], v["cp_a2a"], v["layout"]) == ("a2a+ring", "2", a.slug)


def test_stack_forms_are_checked():
    from autoparallel.specs.stack import StackSpec

    with pytest.raises(ValueError, match="names a form twice"):
        StackSpec(name="x", attention={"default": "flash"}, cp_comm=["ring", "ring"])
    with pytest.raises(ValueError):
        StackSpec(name="x", attention={"default": "flash"}, cp_comm=["ulysses"])


def test_a_measured_run_states_its_form_or_takes_its_stack_default():
    from autoparallel.presets import load_stack
    from autoparallel.validation.runs import cp_form_of

    said = []
    assert cp_form_of({"notes": "CP 4, --cp-comm-type a2a+p2p"}, load_stack("megatron-core"),
                      said) == "a2a+ring"
    assert cp_form_of({"notes": "DeepSpeed-Ulysses SP 8"}, load_stack("deepspeed"), said) == "a2a"
    assert said == []
    assert cp_form_of({"notes": ""}, load_stack("megatron-core"), said) == "ring"
    assert cp_form_of({"notes": None}, load_stack("torchtitan"), said) == "allgather"
    assert said == ["CP form not stated: ring (the stack's default)",
                    "CP form not stated: allgather (the stack's default)"]
