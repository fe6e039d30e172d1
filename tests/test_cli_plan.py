"""`plan` and `sweep` on the command line: outputs, exit codes, resume after a kill."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from autoparallel.output.frames import SWEEP_COLUMNS
from autoparallel.schema import PlanOut
from conftest import run_cli, with_args

P70 = ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--seq-len", "8192",
       "--global-batch", "512"]

# The frozen sweep/plan CSV schema (version 2: + the job settings; 4: + model_code, torch_compile,
# autocast, layout (the full slug), time_offload_s; 5: + cp_comm, cp_a2a, etp, edp, the MoE job
# settings, fp8_param_gather, network, time_host_s, problem_rows; 6: + offload_modules).
# Changing it breaks users' notebooks: add a column only with a schema version bump and a note in the README.
FROZEN_SWEEP_COLUMNS = [
    "model", "gpu", "n_gpus", "gpus_per_node", "seq_len", "global_batch",
    "stack", "precision", "grad_dtype", "grad_reduce_dtype", "optimizer_dtype", "attention", "model_code", "torch_compile", "autocast", "tp_comm_overlap",
    "moe_dispatcher", "moe_a2a_overlap", "moe_routing", "moe_capacity_factor", "cuda_graphs",
    "offload_modules", "fp8_param_gather", "usable_fraction", "intra_gbps", "inter_gbps", "intra_latency_us",
    "inter_latency_us", "network", "profile",
    "dp", "tp", "pp", "vp", "cp", "cp_comm", "cp_a2a", "ep", "etp", "edp", "zero", "recompute",
    "sp", "micro_batch", "grad_accum", "layout",
    "rank", "problem_rows",
    "mem_params_gib", "mem_grads_gib", "mem_optimizer_gib", "mem_model_states_gib",
    "mem_activations_gib", "mem_embedding_logits_gib", "mem_overhead_gib", "mem_total_gib",
    "mem_capacity_gib", "mem_usable_gib", "mem_reserved_gib", "mem_device_gib",
    "mem_headroom_gib", "mem_first_stage_gib", "mem_last_stage_gib",
    "time_compute_s", "time_recompute_s", "time_tp_comm_s", "time_cp_comm_s", "time_ep_comm_s",
    "time_pp_comm_s", "time_dp_comm_s", "time_bubble_s", "time_optimizer_s", "time_offload_s",
    "time_host_s", "time_step_s",
    "mfu", "tokens_per_s_per_gpu", "fits", "note",
]


def test_sweep_schema_frozen():
    assert list(SWEEP_COLUMNS) == FROZEN_SWEEP_COLUMNS


def test_plan_table():
    r = run_cli("plan", *P70, "--top", "5")
    assert r.returncode == 0, r.stderr
    assert "layouts" in r.stdout and "#1" in r.stdout and "largest costs" in r.stdout
    assert "rejected by rule" in r.stdout


def test_plan_header_names_the_moe_settings_beyond_the_stacks():
    """An MoE plan says which MoE settings it assumed beyond the stack's defaults, as the flags
    that set them; the stack's defaults and dense models add nothing."""
    moe = ["--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "16", "--seq-len", "4096",
           "--global-batch", "256", "--top", "1"]
    r = run_cli("plan", *moe, "--moe-dispatcher", "deepep", "--moe-routing", "capacity",
                "--moe-capacity-factor", "1.5", "--offload-modules", "moe_act")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # the header as one line, whatever the terminal width
    assert ("megatron-core, bf16 (--moe-dispatcher deepep, --moe-routing capacity, "
            "--offload-modules moe_act, --moe-capacity-factor 1.5):") in text
    # megatron-bridge's own defaults (balanced routing) are not repeated; a flag that departs is
    r = run_cli("plan", *moe, "--stack", "megatron-bridge", "--moe-a2a-overlap")
    assert "megatron-bridge, bf16 (--moe-a2a-overlap):" in " ".join(r.stdout.split())
    r = run_cli("plan", *moe, "--moe-dispatcher", "alltoall")
    assert "megatron-core, bf16:" in " ".join(r.stdout.split())
    # estimate's header says the same of its layout
    r = run_cli("estimate", *moe[:-2], "--tp", "1", "--ep", "8", "--moe-a2a-overlap",
                "--moe-routing", "balanced")
    assert r.returncode == 0, r.stderr
    assert ("megatron-core, bf16 (--moe-a2a-overlap, --moe-routing balanced) layout"
            in " ".join(r.stdout.split()))



def test_settings_that_change_nothing_are_said_to_have_no_effect():
    """MoE settings given for a dense model, or low-precision parameter gathers at bf16, change
    none of its figures; `plan` and `estimate` say so in one note naming the flags, instead of
    dropping them silently; an MoE model, a low-precision recipe, or the stack's defaults get no
    such note."""
    from autoparallel import Layout, estimate, make_problem

    dense = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
             "--global-batch", "64"]
    r = run_cli("plan", *dense, "--top", "1", "--moe-dispatcher", "deepep", "--moe-a2a-overlap")
    assert r.returncode == 0, r.stderr
    assert ("note: --moe-dispatcher deepep, --moe-a2a-overlap: no effect, llama3-8b is dense"
            in " ".join(r.stdout.split()))
    # --top 1 shows #1 alone, yet thousands fit: #1 is set against #2 of them all (it read
    # "#1 is the only layout that fits")
    assert "only layout that fits" not in r.stdout
    assert "than #2" in r.stdout or "#1 and #2 tie" in r.stdout
    plain = estimate(make_problem("llama3-8b", "h100", 8, 4096, 64), Layout(tp=2))
    moved = estimate(make_problem("llama3-8b", "h100", 8, 4096, 64, moe_dispatcher="deepep",
                                  moe_routing="capacity"), Layout(tp=2))
    assert moved["time_s"] == plain["time_s"] and moved["memory_gib"] == plain["memory_gib"]
    assert plain["notes"] == []
    assert moved["notes"] == ["--moe-dispatcher deepep, --moe-routing capacity, "
                              "--moe-capacity-factor 1.0: no effect, llama3-8b is dense (no "
                              "experts to dispatch, route or offload)"]
    # CUDA graphs are no MoE feature: the reason names the host time they would remove
    graphs = estimate(make_problem("llama3-8b", "h100", 8, 4096, 64, cuda_graphs="full"),
                      Layout(tp=2))
    assert graphs["time_s"] == plain["time_s"]
    assert graphs["notes"] == ["--cuda-graphs full: no effect, llama3-8b is dense (the host time "
                               "CUDA graphs remove is priced where an MoE layer's token counts "
                               "sync the host every layer; a dense model's host runs ahead of "
                               "the GPU)"]
    moe = estimate(make_problem("qwen3-30b-a3b", "h100", 8, 4096, 64, moe_dispatcher="deepep"),
                   Layout(ep=8))
    assert not any("no effect" in n for n in moe["notes"])
    # low-precision parameter gathers need a low-precision recipe: at bf16 the weights are
    # gathered in 16 bits whatever the flag says (cost.time dp_sync_collectives: pb = 2 bytes)
    p16 = make_problem("llama3-8b", "h100", 8, 4096, 64, fp8_param_gather=True)
    rec = estimate(p16, Layout(tp=2))
    assert rec["time_s"] == plain["time_s"] and rec["memory_gib"] == plain["memory_gib"]
    assert rec["notes"] == ["--fp8-param-gather: no effect at --precision bf16 (its weights are "
                            "gathered in 16 bits; a low-precision recipe, e.g. fp8 or mxfp8, "
                            "keeps them in its format)"]
    p8 = make_problem("llama3-8b", "h100", 8, 4096, 64, precision="fp8", fp8_param_gather=True)
    assert estimate(p8, Layout(tp=2))["notes"] == []


def test_plan_json_schema():
    r = run_cli("plan", *P70, "--top", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    PlanOut.model_validate(data)
    assert [x["rank"] for x in data["ranked"]] == [1, 2, 3]
    assert data["n_layouts"] >= data["n_valid"] >= data["n_fit"] > 0
    est_keys = ["model", "gpu", "n_gpus", "slug", "layout", "memory_gib", "fits", "memory_risk",
                "time_s", "mfu",
                "tokens_per_s_per_gpu", "model_flops_per_step", "job", "profile_basis", "band",
                "model_params", "notes"]
    assert list(data["ranked"][0]) == ["rank"] + est_keys + ["tied", "robustness"]


def test_plan_csv_and_plot(tmp_path):
    png = tmp_path / "p.png"
    r = run_cli("plan", *P70, "--top", "4", "--format", "csv", "--plot", png)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].split(",") == FROZEN_SWEEP_COLUMNS and len(lines) == 5
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_plan_nothing_fits_exit_1():
    r = run_cli("plan", "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16",
                "--seq-len", "8192", "--global-batch", "64")
    assert r.returncode == 1
    # usable = 80 GiB less CUDA context 0.5 and the NCCL memory of the closest layout's TP group
    # (688 MB), CP and DP x CP pairs (2 x 544 MB) and Megatron's default group of 16 (688 MB)
    # (cost.device_memory) = 77.21
    assert ("layouts fit in the usable memory (80 GiB less CUDA context and NCCL buffers); "
            "closest" in r.stderr and "of its 77.2 usable" in r.stderr and "try" in r.stderr)
    assert "the GPU overflows by" in r.stderr
    assert "Traceback" not in r.stderr


def test_plan_with_sqlite_storage(tmp_path):
    db = tmp_path / "s.db"
    r = run_cli("plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len",
                "4096", "--global-batch", "64", "--storage", f"sqlite:///{db}", "--study", "x",
                "--keep", "20")
    assert r.returncode == 0, r.stderr
    import optuna

    study = optuna.load_study(study_name="x", storage=f"sqlite:///{db}")
    assert len(study.trials) == 20


def test_plan_pareto_objectives():
    r = run_cli("plan", *P70, "--objective", "time,memory", "--format", "json")
    assert r.returncode == 0, r.stderr
    pts = json.loads(r.stdout)["pareto"]
    assert len(pts) > 3
    r = run_cli("plan", *P70, "--objective", "time,gpus", "--format", "csv")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(pd.io.common.StringIO(r.stdout))
    assert df["n_gpus"].max() == 64 and df["time_step_s"].is_monotonic_increasing


@pytest.mark.parametrize("args,needle", [
    (["--model", "nosuch"], "no such preset"),
    (["--gpus", "0"], "`--gpus` = '0': must be at least 1"),
    (["--gpus", "12"], "`n_gpus` (12) is not a multiple of `gpus_per_node` (8)"),
    (["--tp", ""], "`--tp` is empty"),
    (["--tp", "a,b"], "expected comma-separated integers"),
    (["--objective", "speed"], "`--objective`"),
    (["--recompute", "some"], "`--recompute`"),
])
def test_plan_bad_input(args, needle):
    argv = with_args(P70, args)
    r = run_cli("plan", *argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_empty_axis_in_space_file(tmp_path):
    f = tmp_path / "space.toml"
    f.write_text("[space]\ntp = []\n")
    r = run_cli("plan", *P70, "--space", f)
    assert r.returncode == 2 and "axis `tp` is empty" in r.stderr


def test_unreadable_sweep_file(tmp_path):
    r = run_cli("sweep", tmp_path / "missing.toml", "--output", tmp_path / "o.csv")
    assert r.returncode == 2 and "file not found" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[sweep]\nmodel = ['llama3-8b']\n")
    r = run_cli("sweep", bad, "--output", tmp_path / "o.csv")
    assert r.returncode == 2 and "`gpu` is required" in r.stderr
    bad.write_text("[sweep\n")
    r = run_cli("sweep", bad, "--output", tmp_path / "o.csv")
    assert r.returncode == 2 and "not valid TOML" in r.stderr


SWEEP = ["--model", "llama3-8b,llama3-70b", "--gpu", "h100", "--gpus", "8,64",
         "--seq-len", "4096,8192", "--global-batch", "256", "--top", "2"]


def _rows(path):
    df = pd.read_csv(path, keep_default_na=False, dtype=str)
    return [tuple(r) for r in df.itertuples(index=False)]


def test_sweep_writes_schema_and_nothing_fits_row(tmp_path):
    out = tmp_path / "s.csv"
    r = run_cli("sweep", "--model", "llama3-8b,llama3-405b", "--gpu", "h100", "--gpus", "8",
                "--seq-len", "8192", "--global-batch", "64", "--top", "3", "--output", out)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out, keep_default_na=False)
    assert list(df.columns) == FROZEN_SWEEP_COLUMNS
    assert (df["model"] == "llama3-8b").sum() == 3
    miss = df[df["model"] == "llama3-405b"]
    assert len(miss) == 1 and miss.iloc[0]["fits"] in (False, "False")
    assert miss.iloc[0]["note"].startswith("0 of ")


def test_sweep_resume_after_partial_write(tmp_path):
    full, part = tmp_path / "full.csv", tmp_path / "part.csv"
    assert run_cli("sweep", *SWEEP, "--output", full).returncode == 0
    raw = full.read_bytes()
    # a run killed in the middle of writing: cut inside the 6th line
    lines = raw.split(b"\n")
    cut = len(b"\n".join(lines[:5])) + 1 + len(lines[5]) // 2
    part.write_bytes(raw[:cut])
    r = run_cli("sweep", *SWEEP, "--output", part)
    assert r.returncode == 0, r.stderr
    assert sorted(_rows(part)) == sorted(_rows(full))  # no duplicate, no lost row
    assert len(set(_rows(part))) == len(_rows(part))


def test_sweep_resume_after_sigkill(tmp_path):
    out = tmp_path / "k.csv"
    big = ["--model", "llama3-8b,llama3-70b,llama3-405b", "--gpu", "h100,h200",
           "--gpus", "64,512,4096", "--seq-len", "4096,8192", "--global-batch", "1024",
           "--top", "2", "--output", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "autoparallel", "sweep", *big],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and (not out.exists() or out.read_bytes().count(b"\n") < 4):
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    r = run_cli("sweep", *big)
    assert r.returncode == 0, r.stderr
    rows = _rows(out)
    assert len(rows) == len(set(rows))
    df = pd.read_csv(out, keep_default_na=False, dtype=str)
    per_problem = df.groupby(["model", "gpu", "n_gpus", "seq_len"]).size()
    assert len(per_problem) == 3 * 2 * 3 * 2
    assert set(per_problem.unique()) <= {1, 2}  # whole blocks only: 2 ranked rows or 1 'nothing fits'


def test_shipped_sweep_files_run(tmp_path):
    import glob

    for path in sorted(glob.glob("search_spaces/*.toml")):
        text = open(path).read()
        out = tmp_path / (os.path.basename(path) + ".csv")
        if "[sweep]" in text:
            r = run_cli("sweep", path, "--output", out)
        else:
            r = run_cli("plan", *P70, "--space", path, "--top", "2")
        assert r.returncode == 0, (path, r.stderr)


def test_sweep_refuses_to_resume_a_file_planned_with_other_settings(tmp_path):
    # a rerun with --top 5 on rows kept at top 1 said "1 already in" and kept one row; the
    # settings the rows depend on (top, target, rules, space) are kept beside the CSV
    from autoparallel.errors import OutputError
    from autoparallel.rules import active_rules
    from autoparallel.search.space import SearchSpace
    from autoparallel.search.sweep import SweepSpec, run_sweep

    out = tmp_path / "s.csv"
    grid = dict(model=["llama3-8b"], gpu=["h100"], gpus=[8], seq_len=[4096], global_batch=[64])
    assert run_sweep(SweepSpec(**grid, top=1), SearchSpace(), out)["written"] == 1
    before = out.read_bytes()
    assert run_sweep(SweepSpec(**grid, top=1), SearchSpace(), out)["skipped"] == 1
    refused = [
        (SweepSpec(**grid, top=2), SearchSpace(), None, "top 1 there, 2 now"),
        (SweepSpec(**grid, top=1), SearchSpace(), active_rules(disabled=["tp_in_node"]),
         "rules tp_in_node there, not now"),
        (SweepSpec(**grid, top=1), SearchSpace(tp=[2]), None, "space tp None there, [2] now"),
    ]
    for spec, space, rules, says in refused:
        with pytest.raises(OutputError) as err:
            run_sweep(spec, space, out, rules=rules)
        assert says in str(err.value) and "rows of two searches would mix" in str(err.value)
        assert out.read_bytes() == before
    # a new grid point with the same settings is added to the same file
    more = dict(grid, global_batch=[64, 128])
    assert run_sweep(SweepSpec(**more, top=1), SearchSpace(), out) == {
        "problems": 2, "written": 1, "skipped": 1}
