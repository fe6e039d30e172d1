"""One parser per kind of value (`autoparallel.values`), the same for every command: counts with
binary suffixes, global batches in sequences or tokens, token budgets, durations; and every
input checked before any work."""

import json

import pytest

from autoparallel.errors import SpecError
from autoparallel.values import (parse_count, parse_count_list, parse_duration,
                                 parse_global_batch, parse_tokens)
from conftest import run_cli

BASE = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "64"]


def test_counts():
    assert parse_count("16K", "--gpus") == 16 * 1024  # "16K H100" = 16,384 (Llama 3)
    assert parse_count("8k", "--seq-len") == 8192
    assert parse_count("1.5K", "x") == 1536 and parse_count(" 64 ", "x") == 64
    assert parse_count("2M", "x") == 2 * 1024 ** 2 and parse_count("1G", "x") == 1024 ** 3
    for bad, why in (("1.3K", "not a whole number"), ("0", "at least 1"),
                     ("-8", "must be at least 1"),
                     ("K", "whole number"), ("16KK", "whole number"), ("", "whole number"),
                     ("2K", "more than 1,024")):
        with pytest.raises(SpecError, match=why):
            parse_count(bad, "--gpus", high=1024)
    assert parse_count_list("8,16K", "--gpus") == [8, 16384]
    assert parse_count_list("512:4K:x2", "--gpus", ranges=True) == [512, 1024, 2048, 4096]
    assert parse_count_list("4,2,4", "--tp", sort=True) == [2, 4]
    with pytest.raises(SpecError, match="expected comma-separated integers"):
        parse_count_list("2,a", "--tp")


def test_global_batch_in_sequences_or_tokens():
    assert parse_global_batch("2048", 8192) == 2048
    assert parse_global_batch("16M", 8192) == 2048  # 2^24 tokens / 8192 = 2048 (Llama 3's batch)
    assert parse_global_batch("4M", 4096) == 1024
    with pytest.raises(SpecError, match="not a whole number of 3000-token sequences"):
        parse_global_batch("1M", 3000)


def test_tokens_and_durations():
    assert parse_tokens("15T") == 15e12 and parse_tokens("2.5B") == 2.5e9
    assert parse_duration("15m", "--timeout") == 900 and parse_duration("90", "--timeout") == 90
    assert parse_duration("2h", "x") == 7200 and parse_duration("30d", "x") == 30 * 86400
    assert parse_duration("1w", "x") == 7 * 86400
    with pytest.raises(SpecError, match="with its unit"):
        parse_duration("30", "--deadline", unit=None)
    with pytest.raises(SpecError, match="must be positive"):
        parse_duration("0s", "--timeout")
    with pytest.raises(SpecError, match="sanity bound"):
        parse_duration("2w", "--timeout", high_s=86400)


def _json(*args):
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_command_reads_suffixed_counts_the_same():
    """`plan --global-batch 256K --seq-len 4K` is `--global-batch 64 --seq-len 4096` (256K
    tokens = 262,144 = 64 x 4,096), the issue's `plan --global-batch 16M` case; `estimate` and
    `sweep` read `--gpus 8`-like values the same way (capacity does too: test_capacity)."""
    a = _json("plan", *BASE, "--top", "1", "--keep", "0", "--format", "json")
    b = _json("plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4K",
              "--global-batch", "256K", "--top", "1", "--keep", "0", "--format", "json")
    assert b["problem"]["seq_len"] == 4096 and b["problem"]["global_batch"] == 64
    assert a["ranked"][0]["slug"] == b["ranked"][0]["slug"]
    e = _json("estimate", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len",
              "4K", "--global-batch", "256K", "--tp", "2", "--format", "json")
    assert e["layout"]["grad_accum"] == 64 // (4 * 1)  # dp = 8 / 2, micro-batch 1


def test_bad_values_name_the_flag_before_any_work():
    r = run_cli("plan", *BASE[:-2], "--global-batch", "1M", "--seq-len", "3000")
    assert r.returncode == 2 and "`--global-batch` = '1M'" in r.stderr and not r.stdout
    r = run_cli("plan", *BASE, "--versus", "dp8-tp2-xx")
    assert r.returncode == 2 and r.stdout == "", r.stdout  # refused before the plan is printed
    assert "`--versus` = 'dp8-tp2-xx'" in r.stderr and "'xx' not understood" in r.stderr
    r = run_cli("plan", *BASE, "--versus", "dp4-tp3")  # parses, but breaks a rule of the problem
    assert r.returncode == 2 and r.stdout == "" and "must divide `n_heads`" in r.stderr
    r = run_cli("tune", *BASE, "--measure", "true", "--timeout", "-5m")
    assert r.returncode == 2 and "`--timeout` = '-5m'" in r.stderr


def test_a_file_type_error_names_the_type_actually_tried(tmp_path):
    md = tmp_path / "README.md"
    md.write_text("# a markdown file\n\nnot = [a spec\n")
    r = run_cli("estimate", "--model", md, "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
                "--global-batch", "64")
    assert r.returncode == 2
    assert "not valid TOML (read as TOML: '.md' is neither .toml nor .json)" in r.stderr
    assert "not valid MD" not in r.stderr
    js = tmp_path / "m.json"
    js.write_text("{not json")
    r = run_cli("estimate", "--model", js, *BASE[2:])
    assert r.returncode == 2 and f"{js}: not valid JSON:" in r.stderr and "read as" not in r.stderr
