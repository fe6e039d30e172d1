"""Outputs under faults, piece by piece: the sweep CSV's recognition and verification, the lock,
parallel and sharded sweeps, streams, whole-file writes, strict JSON, I/O errors at the command
line. (Random fault cases: tests/test_faults.py and benchmarks/faults.py.)"""

import errno
import json
import math
import os
import stat
import subprocess
import sys
from multiprocessing import get_context
from pathlib import Path

import pytest

import faultkit as F
from autoparallel.errors import OutputError
from autoparallel.output.files import strict_json, write_whole
from autoparallel.output.frames import SWEEP_COLUMNS
from autoparallel.output.sweep_csv import HEADER, read_existing
from autoparallel.search.sweep import parse_shard, shard_range
from fuzzing import run_inprocess


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("io")


@pytest.fixture(scope="module")
def ref(tmp):
    return F.reference(tmp)


# --- never destroy what we did not write ---------------------------------------------------

FOREIGN = {
    "one line without a line break": b"my notes",
    "another CSV": b"a,b\n1,2\n3,4",
    "another schema version": (",".join(c for c in SWEEP_COLUMNS if c != "problem_rows")
                               + "\nllama3-8b,h100\n").encode(),
    "our header, then a malformed line": HEADER + b'"llama3-8b,h100\n',
}


@pytest.mark.parametrize("kind", FOREIGN)
def test_a_file_that_is_not_ours_is_refused_untouched(tmp, kind):
    path = tmp / f"foreign-{abs(hash(kind))}.txt"
    path.write_bytes(FOREIGN[kind])
    code, _, err = run_inprocess(["sweep", *F.SMALL, "--output", path])
    assert code == 2 and "was not modified" in err, err
    assert path.read_bytes() == FOREIGN[kind]  # not a byte changed


def test_a_cut_header_is_ours_and_starts_afresh(tmp, ref):
    path = tmp / "cut-header.csv"
    path.write_bytes(HEADER[:17])
    F.sweep_inprocess(path)
    assert path.read_bytes() == ref


def test_resume_drops_a_partial_problem_and_says_so(tmp, ref):
    """Rows 1-2 of a 3-row problem survive a cut at a line break: the block is incomplete by
    its own `problem_rows`, so it is dropped and recomputed."""
    lines = ref.split(b"\n")
    assert lines[1].split(b",")[SWEEP_COLUMNS.index("problem_rows")] == b"3"
    cut = b"\n".join(lines[:6]) + b"\n"  # header, problem 1 (3 rows), 2 rows of problem 2
    found = read_existing(cut, Path("x.csv"))
    assert len(found.blocks) == 1 and found.dropped_partial == 1
    assert "1 problem(s) with missing rows dropped" in found.summary()
    path = tmp / "partial.csv"
    path.write_bytes(cut)
    status = F.sweep_inprocess(path)
    assert path.read_bytes() == ref and status["skipped"] == 1


def test_a_problem_written_twice_is_kept_once(tmp, ref):
    """A file with a problem block doubled (two writers before the lock existed): the copy is
    removed (the file rewritten through a rename), the rest kept, the order the grid's."""
    lines = ref.split(b"\n")
    doubled = b"\n".join(lines[:4] + lines[1:4] + lines[4:])
    found = read_existing(doubled, Path("x.csv"))
    assert found.dropped_duplicate == 1 and not found.in_place
    path = tmp / "doubled.csv"
    path.write_bytes(doubled)
    F.sweep_inprocess(path)
    assert path.read_bytes() == ref


def test_a_rewrite_through_a_symbolic_link_keeps_the_link(tmp, ref):
    lines = ref.split(b"\n")
    target, link = tmp / "linked-target.csv", tmp / "linked.csv"
    target.write_bytes(b"\n".join(lines[:4] + lines[1:4] + lines[4:]))  # a doubled problem
    link.symlink_to(target)
    F.sweep_inprocess(link)
    assert link.is_symlink() and target.read_bytes() == ref


# --- one writer ------------------------------------------------------------------------------

def _hold_lock(path: str, ready_w: int, release_r: int) -> None:
    from autoparallel.output.lock import lock_output

    fd = lock_output(Path(path), "--output", initial=HEADER)
    os.write(ready_w, b"1")
    os.read(release_r, 1)
    os.close(fd)
    os._exit(0)


def test_a_second_writer_is_refused_naming_the_holder(tmp, ref):
    path = tmp / "locked.csv"
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    holder = get_context("fork").Process(target=_hold_lock, args=(str(path), ready_w, release_r))
    holder.start()
    assert os.read(ready_r, 1) == b"1"
    try:
        with pytest.raises(OutputError, match=f"another writer holds it \\(pid {holder.pid}"):
            F.sweep_inprocess(path)
    finally:
        os.write(release_w, b"1")
        holder.join()
    F.sweep_inprocess(path)  # the lock died with its holder
    assert path.read_bytes() == ref


def test_wait_queues_behind_the_holder(tmp, ref):
    """--wait: the second sweep says whom it waits for (a line on stderr: the event), then
    continues when the holder lets go."""
    path = tmp / "waited.csv"
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    holder = get_context("fork").Process(target=_hold_lock, args=(str(path), ready_w, release_r))
    holder.start()
    assert os.read(ready_r, 1) == b"1"
    proc = F.popen("sweep", *F.SMALL, "--output", path, "--wait", "--jobs", "1")
    line = _line_starting(proc, "waiting for")
    assert line.startswith(f"waiting for pid {holder.pid}"), line
    os.write(release_w, b"1")
    holder.join()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert path.read_bytes() == ref


def _line_starting(proc, prefix: str) -> str:
    """The first stderr line of `proc` that starts with `prefix` ('' at end of output)."""
    for line in proc.stderr:
        if line.startswith(prefix):
            return line
    return ""


# --- parallel and sharded sweeps ---------------------------------------------------------

def test_two_jobs_write_the_same_bytes_as_one(tmp, ref):
    path = tmp / "jobs2.csv"
    F.sweep_inprocess(path, jobs=2)
    assert path.read_bytes() == ref


def test_shards_concatenate_to_the_one_machine_csv(tmp, ref):
    parts = []
    for k in (1, 2, 3):
        path = tmp / f"shard-{k}.csv"
        F.sweep_inprocess(path, shard=(k, 3), jobs=2 if k == 2 else 1)
        raw = path.read_bytes()
        assert raw.startswith(HEADER)
        parts.append(raw[len(HEADER):])
    assert HEADER + b"".join(parts) == ref


def test_shard_ranges_cover_the_grid_once_in_order():
    for n in (1, 7, 8, 100):
        for shards in (1, 2, 3, 8, 11):
            covered = [i for k in range(1, shards + 1) for i in shard_range(n, (k, shards))]
            assert covered == list(range(n))


@pytest.mark.parametrize("text", ["0/4", "5/4", "2", "a/b", "1/0", "-1/3", "1/2/3"])
def test_bad_shards_are_refused(text):
    with pytest.raises(Exception, match="--shard"):
        parse_shard(text)
    code, _, err = run_inprocess(["sweep", *F.SMALL, "--output", "x.csv", "--shard", text])
    assert code == 2 and "`--shard`" in err


# --- streams -----------------------------------------------------------------------------------

def test_dev_null_and_a_pipe_take_a_sweep(tmp, ref):
    code, _, err = run_inprocess(["sweep", *F.SMALL, "--output", "/dev/null", "--jobs", "1"])
    assert code == 0, err
    r = F.cli("sweep", *F.SMALL, "--output", "/dev/stdout", "--jobs", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.encode() == ref


def test_a_fifo_without_a_reader_says_so_then_writes(tmp, ref):
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    proc = F.popen("sweep", *F.SMALL, "--output", fifo, "--jobs", "1")
    line = _line_starting(proc, "waiting for")  # the event: it says it waits for a reader
    assert line.startswith(f"waiting for a process to read the FIFO {fifo}"), line
    with open(fifo, "rb") as f:
        got = f.read()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert got == ref


# --- whole files ---------------------------------------------------------------------------------

def test_a_failed_whole_file_write_keeps_the_old_content(tmp, monkeypatch):
    path = tmp / "report.csv"
    path.write_text("old\n")
    os.chmod(path, 0o640)
    real_write = os.write

    def full(fd, data):
        if fd > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OutputError, match=r"`--output` .*report.csv: cannot write \(ENOSPC: no space"):
        write_whole("--output", path, "new content\n")
    monkeypatch.undo()
    assert path.read_text() == "old\n"
    assert not [p for p in os.listdir(tmp) if p.startswith(".report.csv.")]  # no temporary left
    write_whole("--output", path, "new\n")
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_whole_file_through_a_symbolic_link_replaces_its_target(tmp):
    target, link = tmp / "real.sh", tmp / "link.sh"
    target.write_text("old")
    link.symlink_to(target)
    write_whole("--output", link, "#!/bin/sh\n", executable=True)
    assert link.is_symlink() and target.read_text() == "#!/bin/sh\n"
    assert os.stat(target).st_mode & stat.S_IXUSR


def test_strict_json_has_no_nan_or_infinity():
    text = strict_json({"a": math.inf, "b": [math.nan, -math.inf, 1.5], "c": "x"})
    assert json.loads(text) == {"a": None, "b": [None, None, 1.5], "c": "x"}
    assert "Infinity" not in text and "NaN" not in text


def test_an_io_error_outside_an_output_is_exit_2_not_70(tmp):
    """An input the command reads from a device that fails (EISDIR on a directory here is
    refused before; an EIO can only be simulated): the error names the file."""
    from autoparallel.cli.guard import as_output_error

    exc = OSError(errno.EIO, "Input/output error")
    exc.filename = "/data/runs.csv"
    assert str(as_output_error(exc)) == ("/data/runs.csv: I/O error (EIO: input/output error, "
                                         "the disk or the file system failed)")


def test_a_closed_pipe_on_standard_output_is_exit_2(tmp):
    """`autoparallel plan ... --format csv | head -c 100`: the reader leaves; exit 2 with the
    reason (the event: the first bytes arrived, then the reading end is closed)."""
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)
    proc = subprocess.Popen([sys.executable, "-m", "autoparallel", "plan", "--model",
                             "llama3-8b", "--gpu", "h100", "--gpus", "64", "--seq-len", "4096",
                             "--global-batch", "512", "--format", "csv", "--top", "500"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout.read(100)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 2, err
    assert "standard output: cannot write (EPIPE" in err and "Traceback" not in err


# --- the command's exit ----------------------------------------------------------------------

def _as_console_script(argv, marker, env_drop=("PYTHONUNBUFFERED",)):
    """Run `autoparallel argv` the way the console script does (`cli.run`), with an exit handler
    registered first that writes `marker`, and stdout a pipe that Python block-buffers (no
    PYTHONUNBUFFERED): what `run` leaves unflushed or unrun at its exit is lost."""
    code = (f"import atexit, sys; atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))"
            "; sys.argv = ['autoparallel', *sys.argv[1:]]; from autoparallel.cli import run; run()")
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          env=env, timeout=300)


PLAN_8B = ["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
           "--global-batch", "64"]


def test_the_command_leaves_with_its_output_whole_and_its_exit_handlers_run(tmp_path):
    """`cli.run` skips the interpreter's teardown: the buffered output and the exit handlers
    (atexit, weakref finalizers) must still reach their end, with the command's exit code."""
    marker = tmp_path / "ran.txt"
    res = _as_console_script([*PLAN_8B, "--format", "json"], marker)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["ranked"], res.stdout[-500:]  # the whole document
    assert marker.read_text() == "ran"
    marker.unlink()
    bad = _as_console_script([*PLAN_8B[:2], "no-such-model", *PLAN_8B[3:]], marker)
    assert bad.returncode == 2 and bad.stderr.startswith("error: `model` = 'no-such-model'")
    assert marker.read_text() == "ran"


def test_an_estimate_csv_is_not_called_a_sweep_of_another_version(tmp):
    # `estimate --input` output starts model,gpu,n_gpus, too: it was "a sweep CSV of another
    # schema version ... its header has 7"
    from autoparallel.errors import OutputError
    from autoparallel.output.sweep_csv import read_existing

    estimate_out = b"model,gpu,n_gpus,seq_len,global_batch,tp,pp,mem_total_gib\nllama3-8b\n"
    with pytest.raises(OutputError, match="not a sweep CSV"):
        read_existing(estimate_out, tmp / "e.csv")
    with pytest.raises(OutputError, match="a sweep CSV of another schema version"):
        read_existing(FOREIGN["another schema version"], tmp / "s.csv")


def test_a_directory_given_as_a_typed_output_is_called_a_directory(tmp):
    # `--output csv` (a directory) read "unknown file type '(none)'"
    from autoparallel.cli.outputs import check_output
    from autoparallel.errors import SpecError

    folder = tmp / "csv"
    folder.mkdir(exist_ok=True)
    with pytest.raises(SpecError, match="is a directory: give a file path inside it"):
        check_output("--output", str(folder), suffixes=(".toml",))
    with pytest.raises(SpecError, match="unknown file type '.txt'; use .toml"):
        check_output("--output", str(tmp / "p.txt"), suffixes=(".toml",))
