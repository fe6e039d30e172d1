"""Generators of bad input for the fuzz suite (tests/test_fuzz.py, benchmarks/fuzz.py) and the
in-process CLI runner they share.

Every generated case is a CLI argument list, possibly with files written first (model, GPU,
stack, space, profile TOML/JSON; CSV inputs; mutated Hugging Face configs). A case passes when
the CLI ends with exit 0, 1 (nothing fits) or 2 (bad input), prints no traceback, and every
error is one `error:` line (continuation lines indented) that names what was wrong. Exit 70
(internal error) or a traceback fails it.

Each case is bounded in time by design: the problems are small (a 2-layer toy model unless
the case is about the model), `--keep 0` unless storage is the point, and the explosion guard
refuses enumerations beyond its limit before they are built."""

from __future__ import annotations

import json
import math
import random
import sys
import warnings
from pathlib import Path

from hypothesis import strategies as st
from typer.testing import CliRunner

HF_DIR = Path(__file__).parent / "data" / "hf"
HF_CONFIGS = sorted(HF_DIR.glob("*.json"))

TOY_MODEL = {"name": "toy", "n_layers": 4, "hidden_size": 256, "n_heads": 4, "ffn_hidden_size": 1024,
             "vocab_size": 1000}
TOY_GPU = {"name": "toygpu", "bf16_tflops": 100.0, "hbm_gib": 80.0, "hbm_tb_per_s": 2.0,
           "scaleup_gb_per_s": 400.0, "nic_gbit_per_s": 400.0}
TOY_STACK_KEYS = ("name",)

BASE = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "64"]

_runner = CliRunner()


def run_inprocess(argv: list[str]) -> tuple[int, str, str]:
    """Run `autoparallel argv` in this process (typer's CliRunner isolation: stdin, stdout and
    stderr captured) through `autoparallel.cli.main`, which maps errors to exit codes.
    Returns (exit code, stdout, stderr)."""
    from autoparallel.cli import main

    with _runner.isolation() as streams, warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # pragma: no cover - main returns codes itself
            code = exc.code if isinstance(exc.code, int) else 2
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = streams[0].getvalue(), streams[1].getvalue()
    return code, out.decode(errors="replace"), err.decode(errors="replace")


def problems(code: int, err: str) -> list[str]:
    """What is wrong with one run's outcome (empty when it passes)."""
    bad = []
    if code == 70:
        bad.append("exit 70 (internal error)")
    if code not in (0, 1, 2, 70):
        bad.append(f"exit {code}")
    if "Traceback (most recent call last)" in err:
        bad.append("traceback on stderr")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    if code == 2 and not errors and "Usage:" not in err:
        bad.append("exit 2 without an `error:` line")
    for line in errors:
        if len(line.strip()) <= len("error:") + 3:
            bad.append(f"empty error line {line!r}")
    return bad


# --- numbers and strings ------------------------------------------------------------------

BAD_NUMBERS = ["0", "-1", "-8", "1e400", "inf", "-inf", "nan", "NaN", "1e18", str(10**18),
               str(2**63), str(2**64 + 1), "9" * 40, "3.5", "0.0", "-0.0", "1e-320", "abc", "",
               " ", "0x10", "1_000", "true", "None", "8,8", "२", "1e308"]

bad_number = st.one_of(st.sampled_from(BAD_NUMBERS),
                       st.integers(min_value=-2**70, max_value=2**70).map(str),
                       st.floats(allow_nan=True, allow_infinity=True).map(repr),
                       st.text(max_size=6))

small_good_int = st.sampled_from(["1", "2", "4", "8", "16", "64"])

def _job_flags():
    """(number flags, {choice flag: values}) of every `JobSpec` field, from its declaration, so
    that a field added there is fuzzed with no list to edit."""
    import typing

    from autoparallel.specs.job import JobSpec, job_flag

    numbers, choices = [], {}
    for name, field in JobSpec.model_fields.items():
        kind = field.annotation
        args = (kind, *typing.get_args(kind))
        lits = [a for a in args if typing.get_origin(a) is typing.Literal]
        if lits:
            choices[job_flag(name)] = [str(v) for v in typing.get_args(lits[0])] + ["nosuch", ""]
        elif float in args or int in args:
            numbers.append(job_flag(name))
    return numbers, choices


JOB_NUMBER_FLAGS, JOB_CHOICE_FLAGS = _job_flags()
number_flags = ["--gpus", "--seq-len", "--global-batch", "--gpus-per-node", *JOB_NUMBER_FLAGS]
axis_flags = ["--tp", "--pp", "--vp", "--cp", "--ep", "--zero", "--micro-batch", "--stage-layers",
              "--first-stage-layers", "--last-stage-layers"]
choice_flags = {"--stack": ["megatron-core", "torchtitan", "nosuch", ""],
                "--precision": ["bf16", "fp8", "fp4", "FP8", ""],
                "--grad-dtype": ["bf16", "fp32", "fp64"],
                "--attention": ["flash", "cudnn", "eager", "xformers"],
                "--recompute": ["none", "full", "selective", "some", "full,none"],
                "--sp": ["true", "false", "yes", "2"],
                "--schedule": ["1f1b", "interleaved", "zbv", "zb-h1", "dualpipe", "gpipe"],
                "--model": ["llama3-8b", "llama3-70b", "mixtral-8x7b", "nosuch", "", "config"],
                "--gpu": ["h100", "a100", "b200", "nosuch", "", "H100"]} | {
                    k: v for k, v in JOB_CHOICE_FLAGS.items() if k not in ("--precision",
                                                                          "--grad-dtype",
                                                                          "--attention")}


@st.composite
def plan_args(draw) -> list[str]:
    """`plan` with the base problem and one to three flags set to bad or odd values."""
    args = ["plan", *BASE, "--keep", "0"]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["number", "axis", "choice", "other"]))
        if kind == "number":
            args += [draw(st.sampled_from(number_flags)), draw(bad_number)]
        elif kind == "axis":
            values = draw(st.lists(st.one_of(small_good_int, bad_number, st.sampled_from(["3", "5", "7"])),
                                   min_size=1, max_size=3))
            args += [draw(st.sampled_from(axis_flags)), ",".join(values)]
        elif kind == "choice":
            flag = draw(st.sampled_from(sorted(choice_flags)))
            args += [flag, draw(st.sampled_from(choice_flags[flag]))]
        else:
            flag = draw(st.sampled_from(["--top", "--keep", "--objective", "--rank-by", "--target",
                                         "--versus", "--format"]))
            value = {"--top": bad_number, "--keep": bad_number,
                     "--objective": st.sampled_from(["time", "time,memory", "time,gpus", "memory", "",
                                                     "time,memory,gpus"]),
                     "--rank-by": st.sampled_from(["time", "robust", "speed"]),
                     "--target": st.sampled_from(["megatron", "torchtitan", "deepspeed", "nanotron",
                                                  "slurm", "jax"]),
                     "--versus": st.sampled_from(["dp8", "dp4-tp2", "tp3", "dp8-tp1-pp1-z9", "x", ""]),
                     "--format": st.sampled_from(["table", "json", "csv", "xml"])}[flag]
            args += [flag, draw(value)]
    return args


def _layout_flags() -> list[str]:
    """The flag of every `Layout` field that takes a value (estimate and export declare one
    per field), `--layout` included."""
    from autoparallel.cli.options import layout_flag
    from autoparallel.specs.layout import Layout

    return ["--layout"] + [layout_flag(n) for n, f in Layout.model_fields.items()
                           if f.annotation not in (bool, bool | None)]


LAYOUT_FLAGS = _layout_flags()
SLUGS = ["dp8", "dp4-tp2", "tp3", "dp8-tp1-pp1-z9", "x", "", "dp1-tp8-pp1-vp1-cp1-ep1-z1-rfull",
         "dp2-tp2-pp2[20,12]", "dp2-tp2-pp2[x]", "dp2-pp2-vp2-szbv", "rselective+nope",
         "dp8-ao99-oo150", "-" * 50]


@st.composite
def estimate_args(draw) -> list[str]:
    """`estimate` of one layout with bad layout numbers or job values (every `Layout` field)."""
    args = ["estimate", *BASE]
    for _ in range(draw(st.integers(1, 3))):
        flag = draw(st.sampled_from([*LAYOUT_FLAGS, *number_flags]))
        value = st.sampled_from(SLUGS) if flag == "--layout" else st.one_of(bad_number,
                                                                           small_good_int)
        args += [flag, draw(value)]
    return args


SUFFIXED = ["16K", "8k", "1.5K", "0.5K", "1e3K", "16M", "3.7M", "2G", "1T", "K", "16KK", "-8K",
            "1024.0", "8 K", "64K,8"]
DURATIONS = ["15m", "90s", "2h", "1d", "4w", "0s", "-5m", "1e9w", "10y", "m", "1.5h", "1e400s"]
REGEXES = ["a{4294967296}(b)", "(" * 200 + ")" * 200, "(?P<ms>", "[", "x", "(?P<ms>[0-9.]+)",
           "(a)" * 101, "a{1,99999999999}(b)"]
LONG = "a" * 300


@st.composite
def new_value_args(draw, tmp: Path) -> list[str]:
    """The values one parser per kind reads for every command (counts with suffixes, token
    batches, durations), layout slugs, over-long output names and pathological regexes."""
    kind = draw(st.sampled_from(["count", "batch", "duration", "slug", "path", "regex"]))
    tune = ["tune", *BASE, "--measure", "true", "--candidates", "2", "--trials", "1",
            "--format", "json", "--workdir", str(tmp / "tune")]
    if kind == "count":
        cmd = draw(st.sampled_from(["plan", "estimate", "sweep", "capacity"]))
        flag = draw(st.sampled_from(["--gpus", "--seq-len", "--tp", "--micro-batch"]))
        value = draw(st.sampled_from(SUFFIXED))
        if cmd == "sweep":
            argv = ["sweep", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len",
                    "4096", "--global-batch", "64", "--output", str(tmp / "s.csv")]
        elif cmd == "capacity":
            argv = ["capacity", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8",
                    "--tokens", "1e9", "--seq-len", "4096", "--global-batch", "64"]
            flag = draw(st.sampled_from(["--gpus", "--seq-len", "--tokens", "--global-batch"]))
        else:
            argv = [cmd, *BASE] + (["--keep", "0"] if cmd == "plan" else [])
        return _set(argv, flag, value)
    if kind == "batch":
        cmd = draw(st.sampled_from(["plan", "estimate", "capacity"]))
        argv = ([cmd, *BASE] if cmd != "capacity" else
                ["capacity", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--tokens",
                 "1e9", "--seq-len", "4096", "--global-batch", "64"])
        return _set(argv, "--global-batch", draw(st.sampled_from(SUFFIXED)))
    if kind == "duration":
        flag = draw(st.sampled_from(["--timeout", "--heartbeat", "--grace", "--deadline"]))
        if flag == "--deadline":
            return ["capacity", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8",
                    "--tokens", "1e9", "--seq-len", "4096", "--global-batch", "64", flag,
                    draw(st.sampled_from(DURATIONS))]
        return tune + [flag, draw(st.sampled_from(DURATIONS))]
    if kind == "slug":
        cmd = draw(st.sampled_from(["estimate", "export", "plan"]))
        flag = "--versus" if cmd == "plan" else "--layout"
        extra = ["--target", "megatron"] if cmd == "export" else []
        return [cmd, *BASE, *extra, flag, draw(st.sampled_from(SLUGS))]
    if kind == "path":
        name = draw(st.sampled_from([LONG, LONG + ".png", f"{LONG}/x.csv", "", "/", str(tmp)]))
        case = draw(st.sampled_from(["plot", "sweep", "export", "estimate", "workdir", "calib"]))
        if case == "plot":
            return ["plan", *BASE, "--keep", "0", "--plot", name]
        if case == "sweep":
            return ["sweep", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len",
                    "4096", "--global-batch", "64", "--output", name]
        if case == "export":
            return ["export", *BASE, "--target", "megatron", "--tp", "2", "--output", name]
        if case == "estimate":
            return ["estimate", "--input", name, "--output", name]
        if case == "workdir":
            return _set(tune, "--workdir", name)
        return tune + ["--profile-out", name]
    return tune + ["--metric-regex", draw(st.sampled_from(REGEXES))]


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    """`argv` with `flag` set to `value` (replaced when present, else appended)."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


@st.composite
def other_command_args(draw) -> list[str]:
    """sweep, tune, capacity, export, validate with bad numbers in their own options."""
    cmd = draw(st.sampled_from(["sweep", "tune", "capacity", "export", "validate", "calibrate"]))
    if cmd == "sweep":
        return ["sweep", "--model", "llama3-8b", "--gpu", "h100", "--gpus", draw(st.one_of(bad_number, st.just("8,16"))),
                "--seq-len", "4096", "--global-batch", draw(st.one_of(bad_number, small_good_int)),
                "--top", draw(st.one_of(bad_number, small_good_int))]
    if cmd == "tune":
        flag = draw(st.sampled_from(["--workers", "--trials", "--candidates", "--seeds", "--timeout",
                                     "--heartbeat", "--grace", "--max-retry", "--seed"]))
        # `true` measures nothing (each trial fails at once); two candidates bound the work
        return ["tune", *BASE, "--measure", "true", "--candidates", "2", flag, draw(bad_number),
                "--format", "json"]
    if cmd == "capacity":
        flag = draw(st.sampled_from(["--price", "--mtbf", "--ckpt-write", "--ckpt-restore",
                                     "--power-fraction", "--node-overhead", "--pue", "--deadline",
                                     "--gpus-per-node"]))
        return [
            "capacity", "--model", "llama3-8b", "--gpu", "h100", "--gpus", draw(st.sampled_from(["8", "8:64:x2", "0", "1e30", "8:1048576:+8", "8:99999999:x2"])),
            "--tokens", draw(st.sampled_from(["1e9", "15T", "inf", "-1", "nan", "1e300", "9e99T"])),
            "--seq-len", "4096", "--global-batch", "64",
            flag, ("h100=" if flag == "--price" else "") + draw(bad_number)]
    if cmd == "export":
        flag = draw(st.sampled_from(["--rank", "--dp", "--tp", "--pp", "--time", "--row"]))
        return ["export", *BASE, "--target", draw(st.sampled_from(["megatron", "torchtitan", "x"])),
                flag, draw(st.one_of(bad_number, small_good_int))]
    if cmd == "validate":
        return ["validate", "--runs", draw(st.sampled_from(["nosuch.csv", "", "/"]))]
    return ["calibrate", "--runs", draw(st.sampled_from(["nosuch.csv", ""])),
            "--prior-weight", draw(bad_number)]


# --- files ----------------------------------------------------------------------------------

WEIRD_VALUES = [True, False, None, "32", "", "inf", -1, 0, 2**63, 10**30, 1e308, -1e-9, 3.5,
                [], [1, 2], {}, {"a": 1}, "nan", 1.5e-300]


def _json_dump(data) -> str:
    return json.dumps(data, allow_nan=True)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def _toml_dump(data: dict) -> str:
    scalars, tables = [], []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append(f"[{json.dumps(k)}]\n" + "".join(
                f"{json.dumps(kk)} = {_toml_value(vv)}\n" for kk, vv in v.items() if vv is not None))
        elif v is not None:
            scalars.append(f"{json.dumps(k)} = {_toml_value(v)}\n")
    return "".join(scalars) + "\n".join(tables)


def nested(depth: int, kind: str) -> str:
    """A document nested `depth` levels deep."""
    if kind == "json":
        return '{"a": ' * depth + "1" + "}" * depth
    return "a = " + "[" * depth + "]" * depth + "\n"


@st.composite
def mutated_table(draw, base: dict) -> dict:
    """`base` with one to three keys set to weird values, removed, or added."""
    data = dict(base)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "set", "drop", "extra"]))
        key = draw(st.sampled_from(sorted(data) or ["name"]))
        if op == "set":
            data[key] = draw(st.sampled_from(WEIRD_VALUES))
        elif op == "drop":
            data.pop(key, None)
        else:
            data[draw(st.sampled_from(["extra", "n_layer", "Name", "profile"]))] = draw(st.sampled_from(WEIRD_VALUES))
    return data


def _file_text(data: dict, fmt: str) -> str:
    if fmt == "json":
        return _json_dump(data)
    try:
        return _toml_dump({k: v for k, v in data.items() if v is not None})
    except TypeError:
        return _json_dump(data)


@st.composite
def file_case(draw, tmp: Path) -> list[str]:
    """A model, GPU, stack, space or profile file with mutations, used by `plan`/`estimate`."""
    kind = draw(st.sampled_from(["model", "gpu", "space", "profile", "hf", "nested"]))
    fmt = draw(st.sampled_from(["toml", "json"]))
    path = tmp / f"case.{fmt}"
    args = ["plan", *BASE, "--keep", "0"]
    if kind == "nested":
        path.write_text(nested(draw(st.sampled_from([50, 2000, 100000])), fmt))
        flag = draw(st.sampled_from(["--model", "--gpu", "--space", "--profile", "--stack"]))
        return args + [flag, str(path)]
    if kind == "model":
        data = draw(mutated_table(TOY_MODEL))
        path.write_text(_file_text(data, fmt))
        return ["plan", "--model", str(path), "--gpu", "h100", "--gpus", "8", "--seq-len", "512",
                "--global-batch", "16", "--keep", "0"]
    if kind == "gpu":
        data = draw(mutated_table({**TOY_GPU, "profile": {"gemm_efficiency": 0.7}}))
        if draw(st.booleans()):
            data["profile"] = {draw(st.sampled_from(["gemm_efficiency", "hbm_efficiency", "nope",
                                                     "latency_base_us"])): draw(st.sampled_from(WEIRD_VALUES))}
        path.write_text(_file_text(data, fmt))
        return ["plan", "--model", "llama3-8b", "--gpu", str(path), "--gpus", "8", "--seq-len", "4096",
                "--global-batch", "64", "--keep", "0"]
    if kind == "space":
        data = draw(mutated_table({"tp": [1, 2], "pp": [1], "max_micro_batch": 4, "zero": [0, 1]}))
        path.write_text(_file_text(data, fmt))
        return args + ["--space", str(path)]
    if kind == "profile":
        knob = draw(st.sampled_from(["gemm_efficiency", "hbm_efficiency", "latency_base_us", "dp_overlap",
                                     "memory_overhead_gib", "nope"]))
        data = {"profile": {knob: draw(st.sampled_from(WEIRD_VALUES + [2, 0.5]))}}
        path.write_text(_file_text(data, fmt))
        return args + ["--profile", str(path)]
    # a Hugging Face config with mutations
    src = draw(st.sampled_from(HF_CONFIGS))
    raw = json.loads(src.read_text())
    cfg = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
    keys = sorted(k for k in cfg if not isinstance(cfg[k], (dict, list)))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(keys + ["num_hidden_layers", "hidden_size", "num_attention_heads"]))
        op = draw(st.sampled_from(["set", "set", "drop"]))
        if op == "set":
            cfg[key] = draw(st.sampled_from(WEIRD_VALUES))
        else:
            cfg.pop(key, None)
    path = tmp / "config.json"
    path.write_text(_json_dump(raw))
    return ["estimate", "--model", str(path), "--gpu", "h100", "--gpus", "64", "--seq-len", "4096",
            "--global-batch", "64", "--tp", "8", "--pp", "8", "--format", "json"]


CSV_HEADER = ["model", "gpu", "n_gpus", "seq_len", "global_batch", "dp", "tp", "pp", "zero",
              "micro_batch"]
CSV_ROW = ["llama3-8b", "h100", "8", "4096", "64", "8", "1", "1", "1", "1"]


@st.composite
def csv_case(draw, tmp: Path) -> list[str]:
    """`estimate --input` or `export --from` over a CSV with bad cells."""
    row = list(CSV_ROW)
    for _ in range(draw(st.integers(1, 2))):
        i = draw(st.integers(0, len(row) - 1))
        row[i] = draw(st.one_of(st.sampled_from(BAD_NUMBERS), st.sampled_from(["", "nosuch", '"', "1,2"])))
    path = tmp / "in.csv"
    import csv
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([CSV_HEADER, row])
    if draw(st.booleans()):
        return ["estimate", "--input", str(path), "--output", str(tmp / "out.csv")]
    return ["export", "--from", str(path), "--row", draw(st.sampled_from(["0", "1", "-1", "99", "1e3"])),
            "--target", "torchtitan"]


def rng_examples(n: int, seed: int = 0) -> random.Random:
    return random.Random(seed)
