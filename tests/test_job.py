"""The job spec (`JobSpec`): declared once, and every surface derived from it (CLI options, API
keywords, estimate JSON `job`, plan/sweep CSV columns, batch estimate, `export --from CSV`);
stacks and precisions, and the refusal of impossible GPU / precision / stack combinations."""

import json

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import autoparallel as ap
from autoparallel import Layout, estimate, make_problem
from autoparallel.cli import _register, app
from autoparallel.cost.model_arch import build_arch
from autoparallel.errors import SpecError
from autoparallel.exporters.from_csv import read_sweep_row
from autoparallel.output.frames import SWEEP_COLUMNS, ranked_frame
from autoparallel.presets import list_stacks, load_gpu, load_stack
from autoparallel.search.plan import plan
from autoparallel.search.space import SearchSpace
from autoparallel.specs.job import JOB_FIELDS, job_flag
from autoparallel.specs.precision import supported
from conftest import run_cli

BASE = ("--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--seq-len", "4096",
        "--global-batch", "64")
NARROW = SearchSpace(tp=[1, 2], pp=[1, 2], vp=[1], cp=[1], ep=[1], zero=[1], micro_batch=[1])


def _jobs():
    """Job settings a user may give: a stack, a precision the H100 and the stack run, and any
    subset of the overrides."""

    @st.composite
    def build(draw):
        stack = draw(st.sampled_from(list_stacks()))
        spec = load_stack(stack)
        gpu = load_gpu("h100")
        precs = [p for p in spec.precisions if supported(gpu, p)]
        job = {"stack": stack, "precision": draw(st.sampled_from(precs))}
        options = {
            "grad_dtype": st.sampled_from(["bf16", "fp32"]),
            "grad_reduce_dtype": st.sampled_from(["bf16", "fp32"]),
            "attention": st.sampled_from(["flash", "cudnn", "eager"]),
            "tp_comm_overlap": st.booleans(),
            "fp8_param_gather": st.booleans(),
            "usable_fraction": st.sampled_from([0.8, 0.9, 0.95]),
            "intra_gbps": st.sampled_from([200.0, 450.0]),
            "inter_gbps": st.sampled_from([25.0, 50.0]),
            "intra_latency_us": st.sampled_from([1.0, 2.5]),
            "inter_latency_us": st.sampled_from([4.0, 8.0]),
        }
        for name, strat in options.items():
            if draw(st.booleans()):
                job[name] = draw(strat)
        return job

    return build()


def _argv(job: dict) -> list[str]:
    argv = []
    for name, value in job.items():
        flag = job_flag(name)
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    return argv


def test_every_job_field_has_a_cli_flag_an_api_keyword_and_a_csv_column():
    _register()
    from autoparallel.cli.options import ProblemOptions

    names = {f for f in ProblemOptions.__dataclass_fields__}
    assert set(JOB_FIELDS) <= names
    assert set(JOB_FIELDS) <= set(ap.api.PROBLEM_OPTIONS)
    assert set(JOB_FIELDS) <= set(SWEEP_COLUMNS)
    p = make_problem("llama3-8b", "h100", 8, 4096, 64)
    assert list(p.job_settings()) == list(JOB_FIELDS)
    assert set(JOB_FIELDS) <= set(p.describe())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=_jobs())
def test_job_round_trips_through_cli_api_csv_and_export_from_csv(tmp_path_factory, job):
    # API: every given setting is used as given; the others are the stack's defaults
    problem = make_problem("llama3-8b", "h100", 16, 4096, 64, **job)
    used = problem.job.model_dump()
    for name, value in job.items():
        assert used[name] == value
    stack = load_stack(job["stack"])
    if "grad_dtype" not in job:
        assert used["grad_dtype"] == stack.grad_dtype
    if "tp_comm_overlap" not in job:
        assert used["tp_comm_overlap"] == stack.tp_comm_overlap
    if "fp8_param_gather" not in job:
        assert used["fp8_param_gather"] == stack.low_precision_allgather
    if "attention" not in job:
        assert used["attention"] == stack.attention_for("hopper")
    # CLI: the same flags give the same job in the estimate JSON
    _register()
    res = CliRunner().invoke(app, ["estimate", *BASE, "--tp", "2", "--format", "json", *_argv(job)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["job"] == used
    # CSV: plan's frame -> file -> `export --from` reads back the same problem and job
    result = plan(problem, NARROW, top=2)
    path = tmp_path_factory.mktemp("csv") / "plan.csv"
    ranked_frame(result).to_csv(path, index=False)
    back, layout = read_sweep_row(path, 1)
    assert back.job == problem.job
    assert back.profile == problem.profile and back.training == problem.training
    assert estimate(back, layout) == estimate(problem, layout)


def test_plan_csv_then_export_from_keeps_tp_comm_overlap(tmp_path):
    # regression: `plan --tp-comm-overlap --format csv` then `export --from ... --row 1` used to
    # lose the overlap (a stack without it by default, so the flag is what carries it)
    csv = tmp_path / "plan.csv"
    r = run_cli("plan", *BASE, "--stack", "torchtitan", "--tp-comm-overlap", "--tp", "2",
                "--pp", "1", "--format", "csv", "--keep", "0")
    assert r.returncode == 0, r.stderr
    csv.write_text(r.stdout)
    frame = pd.read_csv(csv)
    assert bool(frame.loc[0, "tp_comm_overlap"]) and frame.loc[0, "stack"] == "torchtitan"
    problem, _ = read_sweep_row(csv, 1)
    assert problem.training.tp_comm_overlap and problem.job.stack == "torchtitan"


def test_pareto_time_gpus_honours_job_and_bandwidth_overrides():
    # regression: `plan --objective time,gpus` ignored --inter-gbps and --tp-comm-overlap
    from autoparallel.cli.pareto_cmd import with_gpu_count

    p = make_problem("llama3-8b", "h100", 32, 4096, 64, inter_gbps=5.0, tp_comm_overlap=False,
                     stack="torchtitan", precision="fp8")
    q = with_gpu_count(p, 16)
    assert q.cluster.n_gpus == 16 and q.job == p.job and q.profile == p.profile
    assert q.cluster.inter_bytes_per_s == 5e9 and not q.training.tp_comm_overlap
    slow = run_cli("plan", *BASE, "--objective", "time,gpus", "--format", "json", "--inter-gbps", "1")
    fast = run_cli("plan", *BASE, "--objective", "time,gpus", "--format", "json")
    assert slow.returncode == 0 and fast.returncode == 0, slow.stderr + fast.stderr
    best = lambda r: json.loads(r.stdout)["pareto"][0]["time_s"]["step"]  # noqa: E731
    assert best(slow) > best(fast)


def test_api_accepts_every_job_keyword():
    # regression: ap.plan(..., tp_comm_overlap=True) was refused as an unknown keyword
    report = ap.plan(model="llama3-8b", gpu="h100", gpus=8, seq_len=4096, global_batch=64, top=1,
                     tp_comm_overlap=True, stack="torchtitan", precision="fp8")
    assert report.problem.training.tp_comm_overlap and report.problem.job.precision == "fp8"
    with pytest.raises(SpecError, match="unknown"):
        ap.plan(model="llama3-8b", gpu="h100", gpus=8, seq_len=4096, global_batch=64, colour=1)


@pytest.mark.parametrize("gpu,precision,stack,needle", [
    ("a100-80gb", "fp8", "megatron-core", "a100-80gb cannot run it (needs FP8 tensor cores"),
    ("h100", "nvfp4", "megatron-core", "h100 cannot run it (needs FP4 tensor cores"),
    ("h100", "mxfp8", "megatron-core", "needs hardware MX block scaling"),
    ("b200", "nvfp4", "torchtitan", "stack 'torchtitan' does not implement it"),
    ("h100", "fp4", "megatron-core", "`precision` = 'fp4'"),
])
def test_impossible_precisions_are_refused_with_one_message(gpu, precision, stack, needle):
    with pytest.raises(SpecError) as exc:
        make_problem("llama3-8b", gpu, 8, 4096, 64, precision=precision, stack=stack)
    assert needle in str(exc.value)
    r = run_cli("estimate", "--model", "llama3-8b", "--gpu", gpu, "--gpus", "8", "--seq-len",
                "4096", "--global-batch", "64", "--precision", precision, "--stack", stack)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_stack_presets_validate_and_have_sources():
    for name in list_stacks():
        spec = load_stack(name)
        assert spec.name == name and "bf16" in spec.precisions
        assert spec.sources, f"{name}: every default needs a source"
        assert "default" in spec.attention or {"ampere", "hopper"} <= set(spec.attention)
    schema = json.loads(run_cli("schema", "stack").stdout)
    assert {"attention", "grad_dtype", "precisions", "profile"} <= set(schema["properties"])


def test_a_bad_stack_file_and_an_unknown_stack_get_one_line(tmp_path):
    bad = tmp_path / "mine.toml"
    bad.write_text('name = "mine"\n[attention]\ndefault = "flash"\n[profile.h100]\nwarp_speed = 2\n')
    with pytest.raises(SpecError, match="warp_speed"):
        make_problem("llama3-8b", "h100", 8, 4096, 64, stack=str(bad))
    with pytest.raises(SpecError, match="Did you mean 'torchtitan'"):
        make_problem("llama3-8b", "h100", 8, 4096, 64, stack="torchtitn")


def test_default_stack_is_megatron_core_with_its_settings():
    # Megatron-Core on Hopper: fp32 main grads (18 bytes/param), cuDNN attention, TP overlap
    p = make_problem("llama3-70b", "h100", 64, 8192, 512)
    assert (p.job.stack, p.training.grad_dtype, p.training.attention, p.training.tp_comm_overlap) == (
        "megatron-core", "fp32", "cudnn", True)
    assert p.training.bytes_per_param == 18
    a100 = make_problem("llama3-70b", "a100-80gb", 64, 8192, 512)
    assert a100.training.attention == "flash"  # TE uses FlashAttention-2 on Ampere


def test_fp8_runs_linear_gemms_at_the_fp8_peak_and_keeps_weight_copies():
    bf = make_problem("llama3-70b", "h100", 64, 8192, 512)
    f8 = make_problem("llama3-70b", "h100", 64, 8192, 512, precision="fp8")
    lay = Layout(tp=8, pp=4, vp=5, recompute="selective")
    a, b = estimate(bf, lay), estimate(f8, lay)
    # the linear GEMMs are ~2/3 of the step: FP8 (1979 x 0.709 vs 989 x 0.78 TFLOP/s, plus the
    # quantisation kernels) makes the step 15-40 % shorter, never more than 2x
    assert 0.6 < b["time_s"]["compute"] / a["time_s"]["compute"] < 0.85
    # Transformer Engine keeps an FP8 weight and its transpose: +2 bytes per linear parameter
    # of the most loaded stage (80 / 4 = 20 layers, TP 8; norms are within 1e-3)
    arch = build_arch(bf.model)
    extra = (b["memory_gib"]["params"] - a["memory_gib"]["params"]) * 2**30
    assert extra == pytest.approx(2 * 20 * arch.dense_layer_params / 8, rel=1e-3)
    # and saves the linear inputs in FP8: fewer activation bytes
    assert b["memory_gib"]["activations"] < a["memory_gib"]["activations"]
    # torchtitan's float8 neither caches weights nor saves FP8 inputs
    tt = make_problem("llama3-70b", "h100", 64, 8192, 512, precision="fp8", stack="torchtitan")
    tb = make_problem("llama3-70b", "h100", 64, 8192, 512, stack="torchtitan")
    c, d = estimate(tt, lay), estimate(tb, lay)
    assert c["memory_gib"]["params"] == d["memory_gib"]["params"]
    assert c["memory_gib"]["activations"] == d["memory_gib"]["activations"]


def test_target_implies_its_stack_and_warns_when_stack_differs():
    r = run_cli("plan", *BASE, "--target", "torchtitan", "--top", "1", "--format", "json",
                "--keep", "0")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["problem"]["stack"] == "torchtitan" and "warning" not in r.stderr
    r = run_cli("plan", *BASE, "--target", "torchtitan", "--stack", "fsdp", "--top", "1",
                "--format", "json", "--keep", "0")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["problem"]["stack"] == "fsdp"
    assert "warning: --target torchtitan runs the torchtitan stack but --stack is fsdp" in r.stderr
