"""A bounded share of the fault suite (`benchmarks/faults.py` runs many more random cases):
cut files, kills, signals, full devices, two writers, /dev/full outputs, absurd measurements,
broken storages, strict JSON. Each case asserts the promise of issue "nothing lost, nothing
doubled": a resumed sweep is byte-identical to an uninterrupted run, a failed write is exit 2
with the path and the reason, no fault leaves an empty file, no absurd step time is a result.

Cases synchronise on events (a byte per finished problem through a pipe, lines appearing in the
output file, a line on stderr), never on how long something takes, so they hold on a busy
machine. Random draws are seeded: each run tries the same offsets and kill points."""

import random
import signal

import pytest

import faultkit as F


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


@pytest.mark.parametrize("seed", range(6))
def test_a_cut_file_resumes_byte_identical(tmp, seed):
    assert F.cut_case(random.Random(seed), tmp) == []


def test_cuts_at_every_line_break_of_one_problem_resume_byte_identical(tmp):
    """A cut at a line break inside a problem's rows leaves whole lines only: the problem
    must be recomputed, not kept with rows missing (14 of 20 such cuts lost rows before)."""
    ref = F.reference(tmp)
    breaks = [i + 1 for i, b in enumerate(ref) if b == ord("\n")][1:5]  # header .. 4th row
    for off in breaks:
        case = tmp / f"linecut-{off}"
        case.mkdir()
        (case / "s.csv").write_bytes(ref[:off])
        F.sweep_inprocess(case / "s.csv")
        assert (case / "s.csv").read_bytes() == ref, off


@pytest.mark.parametrize("seed", range(3))
def test_a_killed_sweep_resumes_byte_identical(tmp, seed):
    assert F.kill_case(random.Random(seed), tmp) == []


@pytest.mark.parametrize("level", [0, 700, 5000])
def test_a_full_device_is_exit_2_and_leaves_whole_problems(tmp, level):
    assert F.full_case(random.Random(level), tmp, level=level) == []


@pytest.mark.parametrize("wait", [False, True])
def test_two_writers_never_write_a_row_twice(tmp, wait):
    assert F.two_writers_case(random.Random(int(wait)), tmp, wait=wait) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_is_one_line_and_exit_130_then_resume(tmp, sig):
    assert F.signal_case(random.Random(int(sig)), tmp, sig, args=F.SMALL, at_line=4,
                         resume_cli=False) == []


def test_a_killed_parallel_sweep_leaves_no_worker_and_resumes(tmp):
    assert F.cli_kill_case(random.Random(5), tmp, args=F.SMALL, jobs=2, resume_cli=False) == []


@pytest.mark.parametrize("name", ["sweep --output", "estimate --input --output",
                                  "export --output", "capacity --plot", "validate --output"])
def test_outputs_on_a_full_device_are_exit_2_with_the_reason(tmp, name):
    argv = dict(F.devfull_commands(tmp))[name]
    assert F.devfull_case(name, argv) == []


def test_standard_output_on_a_full_device_is_exit_2():
    assert F.stdout_full_case(["schema", "plan"]) == []


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "1e300", "1e-9"])
def test_an_absurd_step_time_is_never_a_result(tmp, value):
    assert F.absurd_case(tmp, value) == []


def test_broken_storages_are_named(tmp):
    bad = [p for name, path in F.storage_files(tmp).items() for p in F.storage_case(name, path)]
    assert bad == []


@pytest.mark.parametrize("i", [0, 1, 3, 6])
def test_json_outputs_are_strict_json(i):
    assert F.json_case(F.json_cases()[i]) == []
