"""Fuzz suite: generated bad input over the CLI, spec files, CSV cells and Hugging Face configs.

No input may end in exit 70 (internal error) or a traceback; every error is an `error:` line
(see `fuzzing.problems`). Runs in-process (typer's CliRunner isolation, `cli.main`), never one
subprocess per example. The default suite draws `AUTOPARALLEL_FUZZ_EXAMPLES` examples per
generator (default 60, about 300 in all); `benchmarks/fuzz.py` runs 5,000 and more and reports
the counts. Each example is bounded in time by design (small problems, the explosion guard),
not by a wall-clock assertion.
"""

from __future__ import annotations

import json
import os
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzing as F

N = int(os.environ.get("AUTOPARALLEL_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=N, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


def _check(argv):
    code, _, err = F.run_inprocess(argv)
    assert not F.problems(code, err), (argv, code, err)
    return code, err


@FUZZ
@given(F.plan_args())
def test_plan_arguments(argv):
    _check(argv)


@FUZZ
@given(F.estimate_args())
def test_estimate_arguments(argv):
    _check(argv)


@FUZZ
@given(F.other_command_args())
def test_other_commands(argv):
    _check(argv)


@FUZZ
@given(st.data())
def test_spec_files_and_hf_configs(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fuzz")
    _check(data.draw(F.file_case(tmp)))


@FUZZ
@given(st.data())
def test_values_slugs_paths_and_regexes(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fuzz")
    _check(data.draw(F.new_value_args(tmp)))


@FUZZ
@given(st.data())
def test_csv_cells(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fuzz")
    _check(data.draw(F.csv_case(tmp)))


# --- the cases issue 13 named: each must be refused with exit 2 and one message naming the field

PLAN = ["plan", *F.BASE, "--keep", "0"]


def _refused(argv, *words):
    code, err = _check(argv)
    assert code == 2, (argv, code, err)
    line = next(line for line in err.splitlines() if line.startswith("error:"))
    for w in words:
        assert w in err, (w, err)
    return line


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_axis_filter_that_leaves_nothing_names_the_filter_and_what_works():
    line = _refused([*PLAN, "--tp", "3"], "--tp 3")
    assert "1,2,4,8" in line  # the degrees that divide 8 GPUs


def test_huge_gpu_count_is_refused_by_its_bound():
    _refused(["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", str(10**18), "--seq-len",
              "4096", "--global-batch", "64"], "`--gpus`", "1,048,576")


def test_enumeration_beyond_the_limit_names_the_count_and_the_narrowing_options():
    # 720,720 = 2^4 3^2 5 7 11 13 has 240 divisors: 240^2 (tp, pp) pairs x cp is beyond the limit
    line = _refused(["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "720720",
                     "--seq-len", "4096", "--global-batch", "64"], "--tp", "sampler")
    assert "4,000,000" in line


@pytest.mark.parametrize("text, field", [
    ('name = "x"\nbf16_tflops = 1000.0\nhbm_gib = inf\nhbm_tb_per_s = 3.0\n'
     'scaleup_gb_per_s = 450.0\nnic_gbit_per_s = 400.0\n', "hbm_gib"),
    ('name = "x"\nbf16_tflops = nan\nhbm_gib = 80\nhbm_tb_per_s = 3.0\n'
     'scaleup_gb_per_s = 450.0\nnic_gbit_per_s = 400.0\n', "bf16_tflops"),
    ('name = "x"\nbf16_tflops = 1000.0\nhbm_gib = 80\nhbm_tb_per_s = 3.0\n'
     'scaleup_gb_per_s = 450.0\nnic_gbit_per_s = 400.0\n[profile]\ngemm_efficiency = 2\n',
     "gemm_efficiency"),
    ('name = "x"\nbf16_tflops = 1000.0\nhbm_gib = 80\nhbm_tb_per_s = 3.0\n'
     'scaleup_gb_per_s = 450.0\nnic_gbit_per_s = 400.0\nscaleup_domain = true\n', "scaleup_domain"),
    ('name = "x"\nbf16_tflops = "1000"\nhbm_gib = 80\nhbm_tb_per_s = 3.0\n'
     'scaleup_gb_per_s = 450.0\nnic_gbit_per_s = 400.0\n', "bf16_tflops"),
])
def test_gpu_file_with_inf_nan_bad_knob_or_loose_type_is_refused_at_load(tmp_path, text, field):
    gpu = _write(tmp_path, "gpu.toml", text)
    _refused(["plan", "--model", "llama3-8b", "--gpu", gpu, "--gpus", "8", "--seq-len", "4096",
              "--global-batch", "64", "--keep", "0"], field)


@pytest.mark.parametrize("change, field", [
    ({"n_layers": True}, "n_layers"), ({"n_layers": "32"}, "n_layers"),
    ({"hidden_size": 2**40}, "hidden_size"), ({"vocab_size": 3.5}, "vocab_size"),
])
def test_model_file_types_are_strict(tmp_path, change, field):
    model = _write(tmp_path, "m.json", json.dumps({**F.TOY_MODEL, **change}))
    _refused(["plan", "--model", model, "--gpu", "h100", "--gpus", "8", "--seq-len", "512",
              "--global-batch", "16", "--keep", "0"], field)


def test_profile_knob_out_of_range_is_refused_when_the_file_is_read(tmp_path):
    prof = _write(tmp_path, "p.toml", "[profile]\ngemm_efficiency = 2\n")
    _refused([*PLAN, "--profile", prof], "gemm_efficiency")


@pytest.mark.parametrize("kind", ["json", "toml"])
def test_deeply_nested_files_are_refused(tmp_path, kind):
    path = _write(tmp_path, f"deep.{kind}", F.nested(100_000, kind))
    _refused([*PLAN, "--space", path], "nested")


@pytest.mark.parametrize("flag, value", [("--workers", "720720"), ("--trials", str(2**63)),
                                         ("--timeout", "inf"), ("--heartbeat", str(10**18))])
def test_tune_bounds(flag, value):
    _refused(["tune", *F.BASE, "--measure", "true", flag, value], flag)


def test_output_paths_are_checked_before_any_work(tmp_path):
    _refused([*PLAN, "--plot", str(tmp_path / "plot.txt")], "--plot", ".png")
    _refused([*PLAN, "--plot", str(tmp_path / "missing" / "p.png")], "--plot", "does not exist")
    _refused(["tune", *F.BASE, "--measure", "true", "--profile-out", str(tmp_path)],
             "--profile-out")
    _refused(["validate", "--output", str(tmp_path)], "--output", "directory")
    _refused(["calibrate", "--gpu", "h100", "--output", str(tmp_path / "no" / "p.toml")],
             "--output")


def test_pareto_objective_refuses_options_it_does_not_use():
    _refused([*PLAN, "--objective", "time,memory", "--target", "megatron"], "--target")
    _refused([*PLAN, "--objective", "time,memory", "--plot", "x.png"], "--plot")


def test_corrupt_sweep_file_on_resume_is_one_line(tmp_path):
    from autoparallel.output.frames import SWEEP_COLUMNS

    out = _write(tmp_path, "sweep.csv", ",".join(SWEEP_COLUMNS) + '\n"llama3-8b,h100\n')
    _refused(["sweep", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "64", "--output", out], "--output", "corrupt")


def test_heartbeat_with_an_interval_beyond_wait_limits_keeps_running():
    """A heartbeat interval longer than a thread wait accepts must not end the thread with an
    OverflowError: it waits as long as it can and stops on its event."""
    from autoparallel.tune.loop import _Heartbeat

    beats = threading.Event()

    class Storage:
        def record_heartbeat(self, trial_id):
            beats.set()

    raised = []
    hook, threading.excepthook = threading.excepthook, raised.append
    try:
        hb = _Heartbeat(Storage(), 1, 10.0**18)
        with hb:
            assert beats.is_set()  # the first beat is recorded on entry
        hb.thread.join()  # ends once the stop event is set, not after a sleep
    finally:
        threading.excepthook = hook
    assert raised == []


def test_zero3_hint_only_when_zero3_would_fit():
    """70B on one node: ZeRO-3 over dp = 1 shards nothing (151 GiB needed of 72), so no hint;
    on 64 GPUs with dp = 64, ZeRO-3 brings the 1,192 GiB of z0 under 72 GiB, so it is hinted."""
    one_node = ["plan", "--model", "llama3-70b", "--gpu", "h100", "--seq-len", "8192",
                "--global-batch", "64", "--keep", "0", "--gpus", "8", "--zero", "0,1"]
    code, err = _check(one_node)
    assert code == 1 and "closest" in err and "--zero 3" not in err, err
    wide = ["plan", "--model", "llama3-70b", "--gpu", "h100", "--seq-len", "4096",
            "--global-batch", "64", "--keep", "0", "--gpus", "64", "--zero", "0", "--tp", "1",
            "--pp", "1", "--cp", "1"]
    code, err = _check(wide)
    assert code == 1 and "try --zero 3" in err, err


# --- the three internal errors of the first-hour review: each refused with exit 2, one message

def test_an_output_name_too_long_for_the_file_system_is_refused(tmp_path):
    name = "a" * 300
    for argv, flag in ((["plan", *F.BASE, "--keep", "0", "--plot", f"{name}.png"], "--plot"),
                       (["sweep", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8",
                         "--seq-len", "4096", "--global-batch", "64", "--output",
                         str(tmp_path / f"{name}.csv")], "--output"),
                       (["export", *F.BASE, "--target", "megatron", "--tp", "2", "--output",
                         f"{name}/x.sh"], "--output")):
        line = _refused(argv, f"`{flag}`")
        assert "characters)" in line and "shorter" in line  # the path shortened, the fix named


def test_a_regex_repeat_too_large_for_the_engine_is_refused():
    line = _refused(["tune", *F.BASE, "--measure", "true", "--metric-regex",
                     "a{4294967296}(b)"], "`--metric-regex`", "too large")
    assert "step_time_s=" in line


def test_a_non_string_activation_in_a_hf_config_is_refused(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 128,
           "hidden_act": 123}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    _refused(["estimate", "--model", str(path), "--gpu", "h100", "--gpus", "1", "--seq-len",
              "128", "--global-batch", "1"], "`hidden_act` = 123", "must be a string")
