"""`autoparallel estimate`: table, JSON schema, batch CSV, and errors (exit 2, no traceback)."""

import io
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
                          "profile_basis", "band", "model_params", "notes"]
    assert data["layout"]["grad_accum"] == 256 and data["layout"]["sp"] is True
    assert data["layout"]["split"] == "even" and data["notes"] == [] and "note:" not in r.stderr


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
    # 80 layers on pp 32: equal middle stages hold 2 (20 left for the ends) or 3 (too many)
    (["--pp", "32"], "`pp x vp` = 32 does not divide `n_layers` (80) and no uneven split"),
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


def test_the_count_refusal_says_when_no_dp_can_make_it_up():
    # tp 3 on 8 GPUs, dp left out: it said "leave --dp out to derive it", which it was
    from autoparallel import Layout, estimate, make_problem
    from autoparallel.errors import SpecError

    p = make_problem("llama3-8b", "h100", 8, 4096, 64)
    with pytest.raises(SpecError) as err:
        estimate(p, Layout(tp=3))
    assert ("`tp x pp x cp` = 3 x 1 x 1 = 3 does not divide the 8 GPUs, so no dp makes up the "
            "count; choose degrees whose product divides 8 (e.g. 2, 4, 8)") in str(err.value)
    assert "leave --dp out" not in str(err.value)
    with pytest.raises(SpecError) as err:  # a dp that is wrong: leaving it out would work
        estimate(p, Layout(tp=2, dp=8))
    assert "= 16 but the cluster has 8 GPUs; leave --dp out to derive it" in str(err.value)


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


def test_estimate_takes_the_balanced_split_where_pp_does_not_divide_the_layers():
    """Llama-3.1-405B (126 layers) on pp 16 as the Llama 3 paper ran it (arXiv 2407.21783 §3.3.2,
    Table 4: 16,384 H100, TP8 PP16 DP128, seq 8192, 2048 sequences): no split given, so the
    split `plan` takes, [7, 8x14, 7] (the output layer weighs 0.63 layer, so 8 per middle stage
    and the ends one short beat any other: max load 8 = 7 + 0.63 rounded up), said on stderr in
    one `note:` line and in the JSON (`layout.split`, `notes`)."""
    r = run_cli("estimate", "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384",
                "--seq-len", "8192", "--global-batch", "2048", "--tp", "8", "--pp", "16",
                "--dp", "128", "--zero", "1", "--recompute", "none", "--micro-batch", "1",
                "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["layout"]["stage_layers"] == [7] + [8] * 14 + [7]
    assert data["layout"]["split"] == "balanced" and len(data["notes"]) == 1
    notes = [line for line in r.stderr.splitlines() if line.startswith("note: ")]
    assert notes == ["note: " + data["notes"][0]] and "[7,8x14,7]" in notes[0]
    # the same layout with the split typed gives the same figures, with no note
    r2 = run_cli("estimate", "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384",
                 "--seq-len", "8192", "--global-batch", "2048", "--tp", "8", "--pp", "16",
                 "--dp", "128", "--zero", "1", "--stage-layers", "7,8x14,7", "--format", "json")
    typed = json.loads(r2.stdout)
    assert typed["notes"] == [] and typed["time_s"] == data["time_s"]
    assert typed["memory_gib"] == data["memory_gib"]
    # another split is `custom`
    r3 = run_cli("estimate", "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384",
                 "--seq-len", "8192", "--global-batch", "2048", "--tp", "8", "--pp", "16",
                 "--stage-layers", "6,8x14,8", "--format", "json")
    assert json.loads(r3.stdout)["layout"]["split"] == "custom"


def test_batch_csv_takes_an_optional_stage_layers_column(tmp_path):
    """A blank `stage_layers` cell where pp x vp does not divide the layers takes the balanced
    split (and says so in `note`); a typed one is used as given or refused by name."""
    rows = ["model,gpu,n_gpus,seq_len,global_batch,tp,pp,vp,zero,stage_layers",
            "llama3-405b,h100,16384,8192,2048,8,16,1,1,",             # filled: 7,8x14,7
            'llama3-405b,h100,16384,8192,2048,8,16,1,1,"7,8x14,7"',   # typed: the same
            'llama3-405b,h100,16384,8192,2048,8,16,1,1,"6,8x14,8"',   # typed: another
            'llama3-405b,h100,16384,8192,2048,8,16,1,1,"7,9x14"',     # 15 stages on pp 16
            "llama3-405b,h100,16384,8192,2048,8,16,8,1,"]             # vp 8: 7,8x14,7 too
    f = tmp_path / "in.csv"
    f.write_text("\n".join(rows) + "\n")
    r = run_cli("estimate", "--input", f)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(io.StringIO(r.stdout), keep_default_na=False)
    assert list(df["stage_layers"]) == ["7,8x14,7", "7,8x14,7", "6,8x15", "7,9x14", "7,8x14,7"]
    assert list(df["error"] == "") == [True, True, True, False, True]
    assert "balanced uneven split [7,8x14,7]" in df.loc[0, "note"] and df.loc[1, "note"] == ""
    assert "pp x vp = 16 x 8 = 128 does not divide the 126 layers" in df.loc[4, "note"]
    assert "has 15 stages but pp = 16" in df.loc[3, "error"]
    assert float(df.loc[0, "time_step_s"]) == float(df.loc[1, "time_step_s"])
    assert float(df.loc[2, "time_step_s"]) > float(df.loc[1, "time_step_s"])  # 8 + 0.63 paces


def test_batch_csv_missing_column(tmp_path):
    f = tmp_path / "in.csv"
    f.write_text("model,gpu\nllama3-8b,h100\n")
    r = run_cli("estimate", "--input", f)
    assert r.returncode == 2 and "missing column(s) n_gpus" in r.stderr
    # the message says which columns are required and which may be left out
    assert "required columns model, gpu, n_gpus, seq_len, global_batch, tp, pp;" in r.stderr
    assert "optional gpus_per_node, dp, vp, cp, ep, etp, zero, recompute, sp, micro_batch" \
        in " ".join(r.stderr.split())


def test_batch_csv_refuses_a_column_it_would_ignore(tmp_path):
    # a typo, a layout setting it has no column for, a column named twice: scored at the
    # defaults before, silently; now one error naming the column (and the near miss)
    from autoparallel.batch import read_layouts_csv
    from autoparallel.errors import SpecError

    head = "model,gpu,n_gpus,seq_len,global_batch,tp,pp"
    cases = [(",micro_batchs", "`micro_batchs` (did you mean micro_batch?)"),
             (",zer0,schedule", "`zer0` (did you mean zero?), `schedule`;"),
             (",model", "column `model` appears more than once")]
    for extra, says in cases:
        f = tmp_path / "in.csv"
        f.write_text(head + extra + "\nllama3-8b,h100,8,4096,64,2,1" + ",1" * extra.count(",")
                     + "\n")
        with pytest.raises(SpecError) as err:
            read_layouts_csv(f)
        assert says in str(err.value), str(err.value)
    # an output read back as input: its ledger and verdict columns are no typo
    f.write_text(head + ",mem_total_gib,time_step_s,fits,mfu,tokens_per_s_per_gpu,note,error\n"
                 "llama3-8b,h100,8,4096,64,2,1,43.2,2.7,True,0.4,1000,,\n")
    assert len(read_layouts_csv(f)) == 1


def test_batch_job_flags_apply_to_rows_that_leave_them_blank(tmp_path):
    # `--precision fp8` with --input was ignored (the rows scored at bf16); now a job flag is
    # the default of every row without its own cell, and problem flags are refused by name
    f = tmp_path / "in.csv"
    f.write_text("model,gpu,n_gpus,seq_len,global_batch,tp,pp,precision\n"
                 "llama3-8b,h100,8,4096,64,2,1,\n"
                 "llama3-8b,h100,8,4096,64,2,1,bf16\n")
    r = run_cli("estimate", "--input", f, "--precision", "fp8")
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(io.StringIO(r.stdout), keep_default_na=False)
    single = json.loads(run_cli("estimate", "--model", "llama3-8b", "--gpu", "h100", "--gpus",
                                "8", "--seq-len", "4096", "--global-batch", "64", "--tp", "2",
                                "--precision", "fp8", "--format", "json").stdout)
    assert float(out.loc[0, "time_step_s"]) == pytest.approx(single["time_s"]["step"], rel=1e-9)
    assert float(out.loc[1, "time_step_s"]) > 1.2 * float(out.loc[0, "time_step_s"])  # bf16
    r = run_cli("estimate", "--input", f, "--model", "llama3-70b", "--format", "json")
    assert r.returncode == 2 and "drop --model" in r.stderr and "Traceback" not in r.stderr


def test_estimate_takes_the_flag_its_tp_refusal_names(tmp_path):
    # TP 16 on 8-GPU nodes breaks the tp_in_node rule, whose message names
    # --allow-tp-across-nodes: estimate (single and batch) takes that flag, as plan and sweep do,
    # and then prices the layout with its TP group on the network
    p = ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "16", "--seq-len", "4096",
         "--global-batch", "64", "--tp", "16"]
    r = run_cli("estimate", *p)
    assert r.returncode == 2 and "--allow-tp-across-nodes" in r.stderr
    r = run_cli("estimate", *p, "--allow-tp-across-nodes", "--format", "json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["layout"]["tp"] == 16 and rec["time_s"]["tp_comm"] > 0
    f = tmp_path / "in.csv"
    f.write_text("model,gpu,n_gpus,seq_len,global_batch,tp,pp\n"
                 "llama3-70b,h100,16,4096,64,16,1\n")
    out = pd.read_csv(io.StringIO(run_cli("estimate", "--input", f).stdout), keep_default_na=False)
    assert "--allow-tp-across-nodes" in out.loc[0, "error"]
    r = run_cli("estimate", "--input", f, "--allow-tp-across-nodes")
    out = pd.read_csv(io.StringIO(r.stdout), keep_default_na=False)
    assert out.loc[0, "error"] == "" and float(out.loc[0, "time_step_s"]) == pytest.approx(
        rec["time_s"]["step"])


@pytest.mark.parametrize("args, says, not_says", [
    # cp 3: 4096 tokens do not split into 2 x 3 ring chunks; SP at tp 1 is fine
    (["--gpus", "6", "--global-batch", "60", "--cp", "3"], "divisible by 2 x cp = 6", "tp ="),
    # 4100 tokens split into 2 x 2 chunks, but the CP share 2050 does not divide by tp 4
    (["--gpus", "8", "--seq-len", "4100", "--cp", "2", "--tp", "4"],
     "`seq_len` (4100)'s CP share (2050) must be divisible by tp = 4", "2 x cp"),
])
def test_sequence_refusal_names_the_part_the_layout_breaks(args, says, not_says):
    base = {"--model": "llama3-8b", "--gpu": "h100", "--gpus": "8", "--seq-len": "4096",
            "--global-batch": "64"}
    pairs = dict(zip(args[::2], args[1::2]))
    argv = [x for k, v in (base | pairs).items() for x in (k, v)]
    r = run_cli("estimate", *argv)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and says in err and not_says not in err


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


def test_names_from_user_files_print_as_written(tmp_path):
    # a model named with square brackets was read as Rich markup (printed bold red, the tags
    # gone): names are text
    f = tmp_path / "m.toml"
    f.write_text('name = "[bold red]mine[/] 8b"\nn_layers = 32\nhidden_size = 4096\n'
                 'n_heads = 32\nn_kv_heads = 8\nffn_hidden_size = 14336\nvocab_size = 128256\n')
    p = ["--model", f, "--gpu", "h100", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64"]
    for cmd in ("estimate", "plan"):
        r = run_cli(cmd, *p, "--top", "1") if cmd == "plan" else run_cli(cmd, *p)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("[bold red]mine[/] 8b ("), r.stdout[:80]


def test_batch_csv_reads_what_the_command_line_reads(tmp_path):
    # `4K` and a global batch in tokens (`256K`) were "not a number" in a CSV, though the
    # command line takes both; a header written with blanks lost its columns; a semicolon file
    # read as "missing column(s)"
    from autoparallel.batch import read_layouts_csv, score_frame
    from autoparallel.errors import SpecError

    f = tmp_path / "in.csv"
    f.write_text(" model , gpu ,n_gpus,seq_len,global_batch,tp,pp\n"
                 "llama3-8b,h100,8,4K,256K,2,1\n"
                 "llama3-8b,h100,8,4096,64,2,1\n")
    out = score_frame(read_layouts_csv(f))
    assert list(out["error"]) == ["", ""]
    assert out.loc[0, "time_step_s"] == out.loc[1, "time_step_s"]  # 256K tokens = 64 x 4096
    f.write_text("model;gpu;n_gpus;seq_len;global_batch;tp;pp\nllama3-8b;h100;8;4096;64;2;1\n")
    with pytest.raises(SpecError, match="separated by semicolons"):
        read_layouts_csv(f)
