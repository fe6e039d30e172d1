"""One truth across views: a figure that several outputs show comes from one place, so the
table, the JSON, the messages and the exported file agree (usable memory, stack, slug, bands),
and a layout whose memory band exceeds its usable memory is marked everywhere."""

import io
import json
import re

import pytest
from rich.console import Console

from autoparallel import make_problem
from autoparallel.cli.plan_cmd import print_plan
from autoparallel.search.plan import plan
from autoparallel.specs.layout import Layout
from conftest import run_cli

P8 = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
      "--global-batch", "64"]


@pytest.fixture(scope="module")
def plan_json():
    r = run_cli("plan", *P8, "--top", "10", "--keep", "0", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def plan_table():
    r = run_cli("plan", *P8, "--top", "10", "--keep", "0")
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_json_slug_is_the_layout_it_describes(plan_json):
    for rec in plan_json["ranked"]:
        lay = rec["layout"]
        split = lay["stage_layers"] if lay["pp"] > 1 and len(set(lay["stage_layers"])) > 1 else None
        rebuilt = Layout(**{k: lay[k] for k in ("dp", "tp", "pp", "vp", "cp", "ep", "zero",
                                                 "recompute", "sp", "micro_batch")},
                         stage_layers=split, schedule=lay["schedule"],
                         recompute_layers=lay["recompute_layers"],
                         recompute_group=lay["recompute_group"],
                         recompute_modules=lay["recompute_modules"],
                         offload_layers=lay["offload_layers"],
                         optimizer_offload=lay["optimizer_offload"])
        assert rec["slug"] == rebuilt.slug
        assert Layout.from_slug(rec["slug"]).resolved(8).slug == rec["slug"]  # round trip


def test_header_names_stack_and_precision_and_the_usable_range_matches_the_json(plan_json,
                                                                               plan_table):
    first = " ".join(plan_table.split("\n #")[0].split())  # the header, however wrapped
    # the counts are the JSON's (the layout space includes each CP form of every cp > 1 row)
    assert f"global batch 64; megatron-core, bf16: {plan_json['n_layouts']:,} layouts" in first
    usable = [r["memory_gib"]["usable"] for r in plan_json["ranked"]]
    m = re.search(r"usable memory per GPU: 80 GiB less CUDA context and NCCL buffers, "
                  r"([\d.]+)-([\d.]+) GiB across these layouts", " ".join(plan_table.split()))
    assert m, plan_table
    assert (float(m[1]), float(m[2])) == (round(min(usable), 1), round(max(usable), 1))


def test_memory_risk_is_the_band_above_the_usable_memory_and_is_marked(plan_json, plan_table):
    """memory_risk = total_high > usable, for every ranked layout; the table marks exactly
    those (`!` after mem high), and counts them under the table."""
    risky = []
    for rec in plan_json["ranked"]:
        m = rec["memory_gib"]
        assert rec["memory_risk"] == (m["total_high"] > m["usable"])
        assert rec["robustness"]["memory_over"] == pytest.approx(
            max(m["total_high"] / m["usable"] - 1, 0.0), rel=1e-9)
        if rec["memory_risk"]:
            risky.append(rec)
    assert risky and len(risky) < len(plan_json["ranked"])  # this problem has both kinds
    flat = " ".join(plan_table.split())
    for rec in plan_json["ranked"]:
        mark = f"{rec['memory_gib']['total_high']:.1f}!"
        assert (mark in flat) == rec["memory_risk"] or not rec["memory_risk"]
    assert f"may run out of memory ({len(risky)} of {len(plan_json['ranked'])})" in flat


def test_rank_by_robust_puts_memory_risk_after_the_safe_tied_layouts():
    res = plan(make_problem("llama3-8b", "h100", 8, 4096, 64), top=10, keep=0, rank_by="robust")
    rob, tied = res.robustness, res.tied  # every fitting layout, in the robust order
    n = int(tied.sum())
    assert tied[:n].all() and not tied[n:].any()  # the tied group first
    flags = rob["memory_risk"][:n]
    assert flags.any() and not flags.all()
    assert list(flags) == sorted(flags)  # every safe tied layout ranks before every risky one
    safe = rob["score"][:n][~flags]
    assert list(safe) == sorted(safe)
    assert not any(r["memory_risk"] for r in res.records())  # the top ten are all safe


def test_estimate_table_shows_the_bands_of_its_json():
    r = run_cli("estimate", *P8, "--tp", "2", "--micro-batch", "4", "--format", "json")
    rec = json.loads(r.stdout)
    r = run_cli("estimate", *P8, "--tp", "2", "--micro-batch", "4")
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    ts, mem = rec["time_s"], rec["memory_gib"]
    assert f"(band {ts['step_low']:.3g}-{ts['step_high']:.3g} s" in flat
    # the fit line quotes the figure the fit compares (the reserved peak, usable - headroom),
    # the allocated peak beside it, and the allocated band
    fit = mem["usable"] - mem["headroom"]
    assert (f"fits: {fit:.1f} GiB reserved at the peak ({mem['total']:.1f} allocated) of "
            f"{mem['usable']:.1f} usable") in flat
    assert f"allocated band up to {mem['total_high']:.1f}" in flat
    assert ("memory risk" in flat) == rec["memory_risk"]


def test_a_layout_refused_on_its_reserved_peak_says_so():
    # Llama-3-8B on 8 H100, DP 8, ZeRO-1, micro-batch 1: the allocated peak fits under the usable
    # memory but the caching allocator's reserve (allocated x 1.066 + 2 MiB, cost.device_memory)
    # does not, which is what the fit compares; the line must quote that figure, not a smaller
    # one beside "does not fit"
    rec = json.loads(run_cli("estimate", *P8, "--format", "json").stdout)
    mem = rec["memory_gib"]
    assert not rec["fits"] and mem["total"] < mem["usable"] < mem["usable"] - mem["headroom"]
    flat = " ".join(run_cli("estimate", *P8).stdout.split())
    assert (f"does not fit: {mem['usable'] - mem['headroom']:.1f} GiB reserved at the peak "
            f"({mem['total']:.1f} allocated) of {mem['usable']:.1f} usable") in flat
    # with an explicit usable fraction the allocated peak is what is compared
    rec = json.loads(run_cli("estimate", *P8, "--usable-fraction", "0.9", "--format",
                             "json").stdout)
    flat = " ".join(run_cli("estimate", *P8, "--usable-fraction", "0.9").stdout.split())
    mem = rec["memory_gib"]
    assert f"{mem['total']:.1f} GiB allocated of {mem['usable']:.1f} usable" in flat


def test_versus_and_nothing_fits_quote_the_layouts_own_usable_memory():
    est = json.loads(run_cli("estimate", *P8, "--dp", "8", "--format", "json").stdout)
    assert not est["fits"]
    r = run_cli("plan", *P8, "--keep", "0", "--top", "1", "--versus", est["slug"])
    flat = " ".join(r.stdout.split())
    m = est["memory_gib"]
    assert (f"versus {est['slug']} does not fit: {m['usable'] - m['headroom']:.1f} GiB reserved "
            f"at the peak ({m['total']:.1f} allocated) of its {m['usable']:.1f} usable") in flat


def test_the_export_line_of_plan_writes_its_first_layout(tmp_path, plan_json):
    r = run_cli("plan", *P8, "--keep", "0", "--top", "3")
    lines = r.stdout.splitlines()
    start = lines.index("write #1's launcher file:")
    command = " ".join(line.strip().rstrip("\\") for line in lines[start + 1:])
    argv = command.split()
    assert argv[:3] == ["autoparallel", "export", "--target"] and argv[3] == "megatron"
    out = tmp_path / "train.sh"
    argv[argv.index("--output") + 1] = str(out)
    done = run_cli(*argv[1:])
    assert done.returncode == 0, done.stderr
    assert f"for {plan_json['ranked'][0]['slug']} to {out}" in done.stderr
    assert out.read_text().startswith("#!")


def test_export_rank_uses_the_plan_of_the_stack_it_costs_and_says_so():
    """`export --target torchtitan --rank 1` without --stack: the target runs the torchtitan
    stack, so the rank is that of `plan --target torchtitan` on torchtitan (whose header says so),
    and the note says it; with `--stack torchtitan` given there is nothing to say."""
    r = run_cli("export", *P8, "--target", "torchtitan", "--rank", "1")
    assert r.returncode == 0, r.stderr
    assert "note: --target torchtitan runs the torchtitan stack" in r.stderr
    p = json.loads(run_cli("plan", *P8, "--keep", "0", "--top", "1", "--target", "torchtitan",
                           "--format", "json").stdout)
    assert p["problem"]["stack"] == "torchtitan"
    table = run_cli("plan", *P8, "--keep", "0", "--top", "1", "--target", "torchtitan").stdout
    assert "; torchtitan (implied by --target torchtitan), bf16:" in " ".join(table.split())
    again = run_cli("export", *P8, "--target", "torchtitan", "--rank", "1", "--stack",
                    "torchtitan")
    assert again.returncode == 0 and "note:" not in again.stderr
    assert again.stdout == r.stdout
    # what the file says the plan assumed is what the plan of that stack assumed
    said = re.search(r"the plan assumed (\w+)", " ".join(r.stdout.split()))
    assert said and said[1] == p["ranked"][0]["job"]["grad_dtype"]


def test_print_plan_renders_at_80_columns_without_cuts():
    res = plan(make_problem("llama3-8b", "h100", 8, 4096, 64), top=5, keep=0)
    out = io.StringIO()
    print_plan(res, Console(file=out, width=80), export=("write #1's launcher file",
                                                         ["autoparallel", "export", "x" * 70]))
    text = out.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
