"""Output that reads at 80 columns: layout slugs and names are never cut, `COLUMNS` is honoured
when the output is piped, and messages point at the project's own docs."""

import io
import re
import os
import subprocess
import sys

import pytest
from rich.console import Console

from autoparallel import make_problem
from autoparallel.cli.plan_cmd import print_plan
from autoparallel.cli.render import layout_slug
from autoparallel.presets import list_models
from autoparallel.search.plan import plan
from conftest import DATA

QUICK_START = ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--seq-len", "8192",
               "--global-batch", "512"]
"""The README's quick-start problem."""


def _cli(columns: int, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "autoparallel", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=300)


def _widest(text: str) -> int:
    return max(len(line.rstrip()) for line in text.splitlines())


@pytest.fixture(scope="module")
def quick_start():
    """Plan of the quick-start problem and its ten slugs (from the JSON records)."""
    res = plan(make_problem("llama3-70b", "h100", 64, 8192, 512), top=10, keep=0)
    return res, [layout_slug(r) for r in res.records()]


@pytest.mark.parametrize("width", [80, 200])
def test_plan_shows_every_full_slug_through_richs_console_width(quick_start, width):
    res, slugs = quick_start
    out = io.StringIO()
    print_plan(res, Console(file=out, width=width))
    text = out.getvalue()
    assert len(slugs) == 10 and any("-sp-" in s for s in slugs)
    for slug in slugs:  # whole, with recompute, SP and micro-batch at the end
        assert slug in text, f"{slug} cut at {width} columns:\n{text}"
    assert _widest(text) <= width
    if width == 200:  # one line per layout: the slug and its numbers on the same line
        assert any(slugs[0] in line and "%" in line for line in text.splitlines())


@pytest.mark.parametrize("width", [80, 200])
def test_plan_cli_honours_columns_when_piped(quick_start, width):
    _, slugs = quick_start
    r = _cli(width, "plan", *QUICK_START, "--keep", "0")
    assert r.returncode == 0, r.stderr
    for slug in slugs:
        assert slug in r.stdout
    assert _widest(r.stdout) <= width
    if width == 200:  # the header line is not wrapped at 200 columns
        assert re.search(r"global batch 512; megatron-core, bf16: [\d,]+ layouts",
                         r.stdout.replace("\n", " "))
        assert any("layouts" in line and "fit" in line for line in r.stdout.splitlines()[:1])


def test_plan_narrower_than_the_table_stacks_rows_and_keeps_slugs(quick_start):
    res, slugs = quick_start
    out = io.StringIO()
    # narrower than the one-line table, still wider than the longest slug and its rank
    width = max(60, max(len(s) for s in slugs) + 6)
    print_plan(res, Console(file=out, width=width))
    text = out.getvalue()
    for slug in slugs:
        assert slug in text
    first = res.records()[0]
    assert f"step s {first['time_s']['step']:.3f}" in text  # numbers labelled by column name
    assert f"tok/s/GPU {first['tokens_per_s_per_gpu']:,.0f}" in text
    assert _widest(text) <= width


def test_presets_models_names_whole_at_80_columns():
    r = _cli(80, "presets", "models")
    assert r.returncode == 0, r.stderr
    for name in list_models():
        assert name in r.stdout
    assert _widest(r.stdout) <= 80
    r = _cli(80, "presets", "gpus")
    assert "a100-40gb" in r.stdout and _widest(r.stdout) <= 80
    r = _cli(80, "presets", "networks")
    assert "dgx-h100-superpod" in r.stdout and "leaf 256 > spine 2048" in r.stdout
    assert _widest(r.stdout) <= 80


def test_validate_tables_readable_at_80_columns():
    r = _cli(80, "validate", "--runs", DATA / "runs_subset.csv")
    assert r.returncode == 0, r.stderr
    assert _widest(r.stdout) <= 80
    assert "…" not in r.stdout  # nothing truncated with an ellipsis
    sources = {line.split(",")[1] for line in (DATA / "runs_subset.csv").read_text().splitlines()[1:]}
    used = [s for s in sources if s in r.stdout]
    assert used, r.stdout
    for col in ("median", "p90", "bias", "mem"):
        assert col in r.stdout
    wide = _cli(200, "validate", "--runs", DATA / "runs_subset.csv")
    assert "median |err|" in wide.stdout and "mem median |err|" in wide.stdout


def test_refusals_point_at_the_projects_docs_not_launchers_md():
    r = _cli(200, "export", "--target", "deepspeed", "--model", "llama3-8b", "--gpu", "h100",
             "--gpus", "8", "--seq-len", "4096", "--global-batch", "64", "--tp", "2", "--pp", "2")
    assert r.returncode == 2
    assert "docs/export.md" in r.stderr and "launchers.md" not in r.stderr


def test_no_exporter_message_cites_launchers_md():
    from autoparallel.exporters import deepspeed, megatron, nanotron, torchtitan
    from autoparallel.problem import make_problem as mp
    from autoparallel.exporters._base import Job
    from autoparallel.specs.layout import Layout

    prob = mp("mixtral-8x7b", "h100", 64, 4096, 256)
    lay = Layout(dp=2, tp=16, pp=2, vp=2, cp=1, ep=2, zero=3, recompute="selective", sp=False,
                 micro_batch=1)
    job = Job.of(prob, lay)
    messages = (deepspeed.deepspeed_limits(job) + megatron.megatron_limits(job)
                + nanotron.nanotron_limits(job) + torchtitan.torchtitan_limits(job))
    assert len(messages) >= 8
    assert not [m for m in messages if "launchers.md" in m]
    cited = [m for m in messages if "docs/export.md" in m]
    assert len(cited) >= 6 and not [m for m in messages if "§" in m]
