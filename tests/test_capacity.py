"""`autoparallel capacity` and `ap.capacity`: days, GPU-hours, cost and energy with bands."""

import json
import math

import pytest

import autoparallel as ap
from autoparallel.capacity_model import (MTBF_GPU_HOURS, NODE_OVERHEAD, PUE, Assumptions, goodput,
                                   parse_counts, parse_duration, parse_global_batch, parse_tokens)
from autoparallel.schema import CapacityOut
from conftest import run_cli

ARGS = ["--model", "llama3-70b", "--tokens", "15T", "--seq-len", "8192", "--global-batch", "16M",
        "--gpu", "h100,b200", "--gpus", "512,1024,2048"]


def test_parsers():
    assert parse_tokens("15T") == 15e12 and parse_tokens("2.5B") == 2.5e9
    assert parse_global_batch("16M", 8192) == 2048  # 2^24 tokens, Llama 3's batch
    assert parse_global_batch("2048", 8192) == 2048
    assert parse_counts("512:4096:x2") == [512, 1024, 2048, 4096]
    assert parse_counts("512:2048:+512,64") == [64, 512, 1024, 1536, 2048]
    assert parse_duration("30d") == 30 and parse_duration("720h") == 30
    for bad in (lambda: parse_tokens("15X"), lambda: parse_global_batch("1M", 3000),
                lambda: parse_counts("512:64:x2"), lambda: parse_duration("30")):
        with pytest.raises(ap.SpecError):
            bad()


def test_default_mtbf_is_the_llama3_rate_and_young_daly_interval():
    # Llama 3: 419 interruptions in 54 days on 16,384 GPUs -> one per 3.09 h for that job
    assert MTBF_GPU_HOURS / 16384 == pytest.approx(54 * 24 / 419, rel=1e-12)
    a = Assumptions(ckpt_write_s=60.0, ckpt_restore_s=600.0)
    factor, tau, m = goodput(16384, a)
    assert m / 3600 == pytest.approx(3.093, abs=1e-3)
    assert tau == pytest.approx(math.sqrt(2 * 60 * m), rel=1e-12)  # ~609 s
    assert factor == pytest.approx((1 + 60 / tau) / (1 - (tau / 2 + 600) / m), rel=1e-12)
    assert 1.1 < factor < 1.3
    assert goodput(16384, Assumptions(mtbf_gpu_hours=1.0))[0] == math.inf  # cannot progress


def test_capacity_json_rows_are_consistent_with_their_throughput():
    r = run_cli("capacity", *ARGS, "--price", "h100=2.0", "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    CapacityOut.model_validate(data)
    assert data["job"]["global_batch"] == 2048 and data["job"]["tokens"] == 15e12
    rows = data["rows"]
    assert [(x["gpu"], x["n_gpus"]) for x in rows] == [
        (g, n) for g in ("h100", "b200") for n in (512, 1024, 2048)]
    tdp = {"h100": 700.0, "b200": 1000.0}
    for x in rows:
        assert x["fits"]
        factor, tau, _ = goodput(x["n_gpus"], Assumptions())
        assert x["goodput"] == pytest.approx(1 / factor, rel=1e-12)
        assert x["checkpoint_interval_s"] == pytest.approx(tau, rel=1e-12)
        for sfx, step in (("", "step_s"), ("_high", "step_low_s"), ("_low", "step_high_s")):
            assert x["tokens_per_s" + sfx] == pytest.approx(2048 * 8192 / x[step], rel=1e-12)
        for sfx in ("", "_low", "_high"):
            tps = {"": x["tokens_per_s"], "_low": x["tokens_per_s_high"],
                   "_high": x["tokens_per_s_low"]}[sfx]
            days = 15e12 / tps / 86400 * factor
            assert x["days" + sfx] == pytest.approx(days, rel=1e-12)
            assert x["gpu_hours" + sfx] == pytest.approx(days * 24 * x["n_gpus"], rel=1e-12)
            watts = tdp[x["gpu"]] * 1.0 * (1 + NODE_OVERHEAD) * PUE
            assert x["energy_mwh" + sfx] == pytest.approx(x["gpu_hours" + sfx] * watts / 1e6, rel=1e-12)
            if x["gpu"] == "h100":
                assert x["cost" + sfx] == pytest.approx(2.0 * x["gpu_hours" + sfx], rel=1e-12)
            else:
                assert x["cost" + sfx] is None
        for item in ("days", "gpu_hours", "energy_mwh", "step"):
            lo, mid, hi = (x[f"{item}_low_s" if item == "step" else f"{item}_low"],
                           x["step_s" if item == "step" else item],
                           x[f"{item}_high_s" if item == "step" else f"{item}_high"])
            assert lo < mid < hi, (item, x)
        assert x["tokens_per_s_low"] < x["tokens_per_s"] < x["tokens_per_s_high"]
    # more GPUs, fewer days (same kind)
    for g in ("h100", "b200"):
        d = [x["days"] for x in rows if x["gpu"] == g]
        assert d == sorted(d, reverse=True)
    # Llama 3 70B took 6.4M H100 GPU-hours for 15T tokens (Llama 3 model card) at the 38-43 %
    # MFU the Llama 3 report states for its stack. Rescaled to that MFU (mid 40.5 %), our row's
    # GPU-hours must come within 0.6-1.1x of the published figure: it also pays for what a step
    # time leaves out (evaluation, long-context annealing, restarts beyond the goodput model).
    # Unscaled, our default stack's best layout runs at ~55 % MFU (docs/validation.md).
    h = next(x for x in rows if x["gpu"] == "h100" and x["n_gpus"] == 2048)
    at_meta_mfu = h["gpu_hours"] * h["mfu"] / 0.405
    assert 0.6 < at_meta_mfu / 6.4e6 < 1.1, at_meta_mfu


def test_deadline_returns_the_smallest_count_meeting_it_at_the_slow_end():
    r = run_cli("capacity", *ARGS, "--deadline", "80d", "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    smallest = data["deadline"]["smallest_n_gpus"]
    for g in ("h100", "b200"):
        ok = [x["n_gpus"] for x in data["rows"] if x["gpu"] == g and x["days_high"] <= 80]
        assert smallest[g] == (min(ok) if ok else None)
    assert smallest["b200"] is not None and smallest["h100"] is None  # b200 ~75 d at 1024, h100 >130 d
    t = run_cli("capacity", *ARGS, "--deadline", "80d")
    assert t.returncode == 0 and "deadline 80 days" in t.stdout


def test_api_capacity_frame_csv_and_plot(tmp_path):
    df = ap.capacity("llama3-8b", "1T", 4096, 512, ["h100", "mi300x"], "64:128:x2",
                     price={"h100": 2.0}, deadline="30d", pue=1.2)
    assert list(zip(df["gpu"], df["n_gpus"])) == [("h100", 64), ("h100", 128), ("mi300x", 64),
                                                  ("mi300x", 128)]
    assert (df["days_low"] < df["days"]).all() and (df["days"] < df["days_high"]).all()
    assert df.attrs["smallest_n_gpus"]["h100"] in (64, 128, None)
    # mi300x has no validation runs: its band falls back and is flagged
    assert set(df.loc[df["gpu"] == "mi300x", "band_level"]) <= {"stack", "global", "none"}
    png = tmp_path / "c.png"
    r = run_cli("capacity", "--model", "llama3-8b", "--tokens", "1T", "--seq-len", "4096",
                "--global-batch", "512", "--gpu", "h100", "--gpus", "64,128", "--format", "csv",
                "--plot", png)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("gpu,n_gpus,fits,layout,step_s")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_inputs_are_one_readable_error():
    r = run_cli("capacity", *ARGS[:-2], "--gpus", "512", "--price", "a100=1")
    assert r.returncode == 2 and "not among --gpu" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("capacity", *ARGS, "--global-batch", "1M", "--seq-len", "3000")
    assert r.returncode == 2 and "whole number" in r.stderr
