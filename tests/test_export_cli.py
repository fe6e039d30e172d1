"""`autoparallel export`: the three ways to name a layout, files on disk, scripts that really run
(under stand-in torchrun/srun/scontrol), and bad input: one message, exit code 2, no traceback."""

import json
import os
import shutil
import subprocess
import sys
import tomllib

import pandas as pd
import pytest

from autoparallel import Layout, make_problem
from autoparallel.exporters import check
from autoparallel.search.plan import plan
from conftest import run_cli
from launcher_checks import megatron_layout, megatron_script_layout, torchrun_args

PROBLEM = ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--seq-len", "8192",
           "--global-batch", "512"]
REFERENCE = ["--tp", "8", "--pp", "4", "--vp", "5", "--recompute", "selective"]
bash = shutil.which("bash")


def test_rank_exports_the_planned_layout():
    """`export --rank N --target X` is row N of `plan --target X` (ranks count among the layouts
    X can launch), so `--rank 2 --target deepspeed` exists where `plan --target deepspeed` has 2."""
    problem = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
    best = plan(problem, top=2, target="megatron")
    want = best.ranked.table.row(1)
    r = run_cli("export", "--target", "megatron", *PROBLEM, "--rank", "2")
    assert r.returncode == 0, r.stderr
    got = megatron_script_layout(r.stdout)
    assert all(got[k] == getattr(want, k) for k in ("dp", "tp", "pp", "vp", "cp", "zero",
                                                    "micro_batch"))
    r = run_cli("export", "--target", "torchtitan", "--target-version", "0.2.2", *PROBLEM,
                "--rank", "1")
    assert r.returncode == 0, r.stderr
    # --target implies its stack (torchtitan, deepspeed) unless --stack is given
    titan = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512, stack="torchtitan")
    assert tomllib.loads(r.stdout)["parallelism"]["tensor_parallel_degree"] == \
        plan(titan, top=1, target="torchtitan").ranked.table.row(0).tp
    # a fused-kernel model under DeepSpeed (Megatron-DeepSpeed style): micro-batch 2 also fits with
    # full recompute, so there is a rank 2 (Hugging Face model code, the deepspeed stack's default,
    # keeps ~1.6x the activations and only micro-batch 1 fits: cost/model_code.py)
    problem = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512, stack="deepspeed",
                           model_code="fused")
    ds = plan(problem, top=3, target="deepspeed")
    # DeepSpeed-Ulysses launches #1 and #2 of the plan; #3 is a pipeline, which DeepSpeed's JSON
    # cannot build, so #3 of `plan --target deepspeed` is another layout
    anyone = plan(problem, top=3).ranked.table
    assert len(ds.ranked) == 3 and check("deepspeed", problem, anyone.row(2))
    assert not check("deepspeed", problem, ds.ranked.table.row(2))
    hf = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512, stack="deepspeed")
    from autoparallel.search.space import SearchSpace

    assert len(plan(hf, top=2, target="deepspeed", space=SearchSpace(cp=[1])).ranked) == 1
    # with DeepSpeed-Ulysses (cp > 1, form a2a) micro-batch 2 over cp 2 holds the same tokens
    # per GPU, so the Ulysses rows fit too
    ulysses = plan(hf, top=2, target="deepspeed").ranked
    assert len(ulysses) == 2 and ulysses.table.row(1).cp_form.value == "a2a"
    r = run_cli("export", "--target", "deepspeed", *PROBLEM, "--model-code", "fused", "--rank", "3")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = ds.ranked.table.row(2)
    assert (got["zero_optimization"]["stage"], got["train_micro_batch_size_per_gpu"]) == (
        want.zero, want.micro_batch)


def test_from_sweep_csv_row(tmp_path):
    csv = tmp_path / "sweep.csv"
    r = run_cli("plan", *PROBLEM, "--top", "4", "--format", "csv")
    assert r.returncode == 0, r.stderr
    csv.write_text(r.stdout)
    frame = pd.read_csv(csv)
    for k in (1, 4):
        r = run_cli("export", "--target", "torchtitan", "--target-version", "0.2", "--from", csv,
                    "--row", k)
        assert r.returncode == 0, r.stderr
        par = tomllib.loads(r.stdout)["parallelism"]
        row = frame.iloc[k - 1]
        assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"],
                par["context_parallel_degree"]) == (row.tp, row.pp, row.cp)
        assert f"layout dp{row.dp}-tp{row.tp}-pp{row.pp}-vp{row.vp}" in r.stdout


def test_output_file_is_written_and_scripts_are_executable(tmp_path):
    out = tmp_path / "run.sh"
    r = run_cli("export", "--target", "slurm", *PROBLEM, *REFERENCE, "--output", out)
    assert r.returncode == 0 and r.stdout == ""
    assert "wrote sbatch script for dp2-tp8-pp4-vp5" in r.stderr
    assert out.read_text().startswith("#!/bin/bash\n#SBATCH")
    assert os.access(out, os.X_OK)
    js = tmp_path / "ds.json"
    r = run_cli("export", "--target", "deepspeed", "--model", "llama3-8b", "--gpu", "h100",
                "--gpus", "8", "--seq-len", "4096", "--global-batch", "64", "--zero", "2",
                "--output", js)
    assert r.returncode == 0, r.stderr
    assert json.loads(js.read_text())["zero_optimization"]["stage"] == 2


def test_unfitting_layout_is_exported_with_a_warning():
    r = run_cli("export", "--target", "deepspeed", *PROBLEM, "--zero", "0")
    assert r.returncode == 0, r.stderr
    assert "warning: dp64-tp1-pp1-vp1-cp1-ep1-z0-rnone-mb1 is predicted not to fit" in r.stderr
    assert json.loads(r.stdout)["gradient_accumulation_steps"] == 8


STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                        "env": {{k: os.environ.get(k) for k in ("CUDA_DEVICE_MAX_CONNECTIONS",)}}}}) + "\\n")
if os.path.basename(sys.argv[0]) == "scontrol":
    print("node-a\\nnode-b")
if os.path.basename(sys.argv[0]) == "srun":
    os.execvp(sys.argv[1], sys.argv[1:])
"""


@pytest.mark.skipif(bash is None, reason="bash is not installed")
@pytest.mark.parametrize("target", ["megatron", "slurm"])
def test_scripts_run_under_stand_in_launchers(tmp_path, target):
    """bash runs the exported script; stand-in torchrun/srun/scontrol record what they receive:
    the Megatron-LM arguments parse, pass Megatron's checks and give the reference layout, and
    the user's extra arguments arrive at the end."""
    script = tmp_path / "run.sh"
    r = run_cli("export", "--target", target, *PROBLEM, *REFERENCE, "--output", script)
    assert r.returncode == 0, r.stderr
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for prog in ("torchrun", "srun", "scontrol"):
        (bindir / prog).write_text(STUB.format(python=sys.executable))
        (bindir / prog).chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", STUB_LOG=str(log),
               HEAD_NODE="node-a", SLURM_JOB_ID="42", SLURM_JOB_NODELIST="node-[a-b]")
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    run = subprocess.run([bash, str(script), "--lr", "3e-4"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    torchrun = next(c for c in calls if c["prog"] == "torchrun")
    argv = torchrun["argv"]
    assert argv[-2:] == ["--lr", "3e-4"]
    i = argv.index("pretrain_gpt.py")
    t = torchrun_args(["torchrun"] + argv[:i])
    assert t.rdzv_endpoint == "node-a:29500" and (t.rdzv_id == "42") == (target == "slurm")
    got = megatron_layout(argv[i + 1:-2], int(t.nnodes) * int(t.nproc_per_node), torchrun["env"])
    assert {k: got[k] for k in ("dp", "tp", "pp", "vp", "zero", "recompute", "micro_batches")} == \
        dict(dp=2, tp=8, pp=4, vp=5, zero=1, recompute="selective", micro_batches=256)
    if target == "megatron":  # HEAD_NODE is required on several nodes
        env.pop("HEAD_NODE")
        run = subprocess.run([bash, str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and "set HEAD_NODE" in run.stderr


def _bad(*args):
    r = run_cli("export", *map(str, args))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr and r.stdout == ""
    return r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--target", "titan", *PROBLEM, "--tp", "8"], "unknown export target 'titan'; choose one of megatron, torchtitan, deepspeed, nanotron, slurm, megatron-bridge"),
    ([*PROBLEM, "--tp", "8"], "missing --target"),
    (["--target", "deepspeed", *PROBLEM, *REFERENCE], "deepspeed cannot launch dp2-tp8-pp4-vp5"),
    (["--target", "nanotron", *PROBLEM, *REFERENCE], "interleaving (vp = 5)"),
    (["--target", "torchtitan", *PROBLEM, "--tp", "8", "--pp", "4", "--no-sp"], "without sequence parallelism"),
    (["--target", "megatron", *PROBLEM, "--tp", "8", "--pp", "3"], "no target can launch it"),
    (["--target", "megatron", *PROBLEM], "which layout?"),
    (["--target", "megatron", *PROBLEM, "--rank", "1", "--tp", "8"], "either --rank or layout flags"),
    (["--target", "megatron", *PROBLEM, "--rank", "0"], "ranks start at 1"),
    (["--target", "megatron", *PROBLEM, "--rank", "999999"], "--rank 999999: only"),
    (["--target", "megatron", *PROBLEM, "--vp", "2"], "`vp` (2) > 1 needs pipeline parallelism"),
    (["--target", "megatron", "--row", "1", *PROBLEM, "--tp", "8"], "--row needs --from"),
])
def test_bad_input_one_message_exit_2(args, needle):
    err = _bad(*args)
    assert err.startswith("error: ") and needle in err, err


def test_refusal_lists_targets_that_can():
    err = _bad("--target", "deepspeed", *PROBLEM, *REFERENCE)
    assert err.splitlines()[-1].strip() == ("targets that can launch it: megatron, torchtitan, slurm, "
                                            "megatron-bridge")


def test_bad_sweep_csv(tmp_path):
    good = tmp_path / "sweep.csv"
    r = run_cli("plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len",
                "4096", "--global-batch", "64", "--top", "2", "--format", "csv")
    good.write_text(r.stdout)
    assert "has 2 data row(s), numbered from 1" in _bad("--target", "megatron", "--from", good, "--row", "3")
    assert "has 2 data row(s)" in _bad("--target", "megatron", "--from", good, "--row", "0")
    assert "--from needs --row" in _bad("--target", "megatron", "--from", good)
    assert "drop --model" in _bad("--target", "megatron", "--from", good, "--row", "1",
                                  "--model", "llama3-8b")
    assert "file not found" in _bad("--target", "megatron", "--from", tmp_path / "nope.csv", "--row", "1")
    missing = tmp_path / "missing.csv"
    missing.write_text("model,gpu,tp\nllama3-8b,h100,1\n")
    assert "missing column(s) n_gpus, seq_len, global_batch, pp" in _bad(
        "--target", "megatron", "--from", missing, "--row", "1")
    frame = pd.read_csv(good, dtype=str, keep_default_na=False)
    frame.loc[0, "tp"] = "eight"
    frame.loc[1, "zero"] = "7"
    broken = tmp_path / "broken.csv"
    frame.to_csv(broken, index=False)
    assert "row 1: `tp` = 'eight' is not a number" in _bad("--target", "megatron", "--from", broken, "--row", "1")
    assert "row 2: `zero` = 7" in _bad("--target", "megatron", "--from", broken, "--row", "2")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text('model,gpu,n_gpus\n"llama3-8b,h100,8\n')
    assert "not a readable CSV" in _bad("--target", "megatron", "--from", ragged, "--row", "1")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00\x01garbage")
    assert "error: --from" in _bad("--target", "megatron", "--from", binary, "--row", "1")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert "not a readable CSV" in _bad("--target", "megatron", "--from", empty, "--row", "1")


def test_nothing_fits_row_says_so(tmp_path):
    sweep = tmp_path / "s.csv"
    r = run_cli("sweep", "--output", sweep, "--model", "llama3-405b", "--gpu", "h100",
                "--gpus", "8", "--seq-len", "8192", "--global-batch", "64", "--top", "1")
    assert r.returncode == 0, r.stderr
    err = _bad("--target", "megatron", "--from", sweep, "--row", "1")
    assert "row 1 holds no layout" in err


def test_from_sweep_csv_keeps_the_uneven_split_and_block_recompute(tmp_path):
    """The sweep CSV's `layout` column (the full slug) carries what the axis columns cannot, so
    `export --from` writes the planned layout, not its even-split, plain-recompute neighbour:
    405B on 16,384 H100 plans uneven splits (`pp16[7,8x14,7]`-style); block recompute on request."""
    csv = tmp_path / "sweep.csv"
    r = run_cli("plan", "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384",
                "--seq-len", "8192", "--global-batch", "2048", "--pp", "16", "--tp", "8",
                "--recompute", "full", "--recompute-num-layers", "2", "--top", "3",
                "--format", "csv")
    assert r.returncode == 0, r.stderr
    csv.write_text(r.stdout)
    frame = pd.read_csv(csv)
    row = frame.iloc[0]
    full = Layout.from_slug(row["layout"])
    assert full.stage_layers and sum(full.stage_layers) == 126
    r = run_cli("export", "--target", "megatron", "--from", csv, "--row", 1)
    assert r.returncode == 0, r.stderr
    got = megatron_script_layout(r.stdout)
    assert got["stage_layers"] == full.stage_layers  # however Megatron is told the split
    assert full.recompute_layers == 2  # dp32-tp8-pp16[8x15,6]-vp2-cp4-ep1-z1-rfull2-sp-mb1
    assert (got["args"].recompute_method, got["args"].recompute_num_layers) == ("block", 2)
    # an edited axis column that contradicts the slug is refused, naming both
    frame.loc[0, "tp"] = 4
    frame.to_csv(csv, index=False)
    r = run_cli("export", "--target", "megatron", "--from", csv, "--row", 1)
    assert r.returncode == 2 and "disagrees with the column(s) tp" in r.stderr


def test_export_and_versus_take_the_balanced_split_with_a_note():
    """Megatron-Bridge's Llama-3.1-405B layout, pp 16 vp 8 (126 layers, no split typed): export
    writes Megatron-Core's embedding/loss accounting ((126 + 2) / 16 = 8 per rank, divisible by
    vp 8), which the independent reader places as [7, 8x14, 7]; one `note:` line says so."""
    args = ["--model", "llama3-405b", "--gpu", "h100", "--gpus", "1024", "--seq-len", "8192",
            "--global-batch", "512", "--tp", "8", "--pp", "16", "--vp", "8", "--zero", "1",
            "--recompute", "full"]
    r = run_cli("export", "--target", "megatron", *args)
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "[7,8x14,7]" in notes[0]
    got = megatron_script_layout(r.stdout)
    assert got["stage_layers"] == [7] + [8] * 14 + [7] and got["vp"] == 8
    assert got["args"].account_for_embedding_in_pipeline_split
    assert got["args"].account_for_loss_in_pipeline_split
    r = run_cli("plan", *args[:10], "--pp", "16", "--top", "2",
                "--versus", "dp8-tp8-pp16-vp8-cp1-ep1-z1-rfull-sp-mb1")
    assert r.returncode == 0, r.stderr
    assert "note: --versus: pp x vp = 16 x 8 = 128 does not divide the 126 layers" in r.stderr
    assert "versus dp8-tp8-pp16[7,8x14,7]-vp8" in " ".join(r.stdout.split())
