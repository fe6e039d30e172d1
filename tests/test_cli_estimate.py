"""`autoparallel estimate`: table, JSON schema, batch CSV, and errors (exit 2, no traceback)."""

import json

import pandas as pd
import pytest

from autoparallel.schema import EstimateOut
from conftest import SEED_MODEL, run_cli, with_args

BASE = ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--seq-len", "8192",
        "--global-batch", "512"]


def test_estimate_json_has_exactly_the_documented_keys():
    r = run_cli("estimate", *BASE, "--tp", "8", "--pp", "4", "--vp", "5", "--recompute",
                "selective", "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    EstimateOut.model_validate(data)  # extra="forbid": no key more, no key less
    assert list(data) == ["model", "gpu", "n_gpus", "slug", "layout", "memory_gib", "fits",
                          "memory_risk", "time_s",
                          "mfu", "tokens_per_s_per_gpu", "model_flops_per_step", "job",
                          "profile_basis", "band", "model_params"]
    assert data["layout"]["grad_accum"] == 256 and data["layout"]["sp"] is True


def test_estimate_table_shows_breakdowns():
    r = run_cli("estimate", "--model", SEED_MODEL, "--gpu", "h100", "--gpus", "64", "--seq-len",
                "8192", "--global-batch", "512", "--tp", "8", "--pp", "4", "--zero", "1")
    assert r.returncode == 0, r.stderr
    for word in ("activations", "optimizer", "tp_comm", "bubble", "MFU"):
        assert word in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama3-7b"], "Did you mean"),
    (["--tp", "3"], "`tp` = 3 must divide `n_heads` (64)"),
    (["--dp", "4", "--tp", "8"], "= 32 but the cluster has 64 GPUs"),
    (["--pp", "3"], "`pp x vp` = 3 must divide `n_layers` (80)"),
    (["--vp", "2"], "`vp` (2) > 1 needs pipeline parallelism"),
    (["--zero", "5"], "zero"),
    (["--gpus", "0"], "`--gpus` = '0': must be at least 1"),
])
def test_bad_input_exit_2_one_message(args, needle):
    argv = with_args(BASE, args)
    r = run_cli("estimate", *argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_missing_problem_flag():
    r = run_cli("estimate", "--model", "llama3-8b", "--gpu", "h100")
    assert r.returncode == 2 and "missing --gpus, --seq-len, --global-batch" in r.stderr


def test_batch_csv_scores_good_rows_and_flags_bad_ones(tmp_path):
    rows = [
        "model,gpu,n_gpus,gpus_per_node,seq_len,global_batch,dp,tp,pp,vp,cp,ep,zero,recompute,sp,micro_batch",
        "llama3-8b,h100,8,8,4096,64,,1,1,1,1,1,2,none,,2",
        "llama3-70b,h100,64,8,8192,512,2,8,4,5,1,1,1,selective,true,1",
        "llama3-70b,h100,64,8,8192,512,2,8,4,5,1,1,1,selective,maybe,1",
        "llama3-70b,h100,64,8,8192,512,,abc,4,5,1,1,1,selective,true,1",
        "nope,h100,64,8,8192,512,,8,4,5,1,1,1,selective,true,1",
        "llama3-70b,h100,64,8,8192,512,,3,1,1,1,1,1,none,,1",
    ]
    f = tmp_path / "in.csv"
    f.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out.csv"
    r = run_cli("estimate", "--input", f, "--output", out)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out, keep_default_na=False)
    assert list(df.columns[:16]) == rows[0].split(",")
    assert {"mem_total_gib", "time_step_s", "fits", "mfu", "tokens_per_s_per_gpu", "error"} <= set(df.columns)
    assert df.loc[0, "error"] == "" and df.loc[1, "error"] == ""
    assert "`sp` = 'maybe' is not a boolean" in df.loc[2, "error"]
    assert "`tp` = 'abc' is not a number" in df.loc[3, "error"]
    assert "`model` = 'nope': no such preset" in df.loc[4, "error"]
    assert "`tp` = 3 must divide" in df.loc[5, "error"]
    assert float(df.loc[1, "mem_total_gib"]) > 0 and df.loc[2, "mem_total_gib"] == ""


def test_batch_csv_missing_column(tmp_path):
    f = tmp_path / "in.csv"
    f.write_text("model,gpu\nllama3-8b,h100\n")
    r = run_cli("estimate", "--input", f)
    assert r.returncode == 2 and "missing column(s) n_gpus" in r.stderr


def test_presets_and_schema_commands():
    r = run_cli("presets", "gpus")
    assert r.returncode == 0 and "mi300x" in r.stdout
    r = run_cli("schema", "estimate")
    assert r.returncode == 0 and "memory_gib" in json.loads(r.stdout)["properties"]
    r = run_cli("schema", "nothing")
    assert r.returncode == 2 and "choose one of" in r.stderr


@pytest.mark.parametrize("command", ["estimate", "plan", "export", "tune"])
def test_problem_options_declared_once_for_every_command(command):
    # the problem options come from one declaration (cli/options.py::ProblemOptions); a new one
    # (e.g. --tp-comm-overlap) must reach every command that builds a problem
    r = run_cli(command, "--help")
    assert r.returncode == 0
    flat = " ".join(r.stdout.split())
    for flag in ("--model", "--gpu", "--gpus-per-node", "--seq-len", "--global-batch", "--profile",
                 "--grad-dtype", "--usable-fraction", "--attention", "--tp-comm-overlap",
                 "--intra-gbps", "--inter-gbps"):
        assert flag in flat, (command, flag)
