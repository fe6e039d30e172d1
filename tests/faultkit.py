"""Fault injection for the outputs of autoparallel: shared by the test suite (a bounded share,
`tests/test_faults.py`) and `benchmarks/faults.py` (many random cases, counted and printed).

Every case returns a list of what went wrong (empty when it passed). Kinds:

- `cut`: the uninterrupted sweep CSV cut at a random byte offset, then resumed: the result must
  be byte-identical to the uninterrupted run.
- `kill`: a sweep SIGKILLed at a random point (after a random number of written problems, or a
  random delay after its start), then resumed: byte-identical; no empty file, no process left.
- `signal`: SIGINT or SIGTERM at a random point: exit 130 with one `interrupted (...)` line and
  no traceback (or exit 0 when it finished first); then resumed: byte-identical.
- `full`: the output device full at a random fill level (a file-size limit, or a small tmpfs
  when the machine allows mounting one): exit 2 with the path and the reason, never exit 70,
  no empty file, no partial problem; after space is freed the resumed sweep is byte-identical.
- `two_writers`: two sweeps started together on one output: no row written twice (one refuses
  with exit 2 naming the other, or waits with --wait); the file is the uninterrupted run's.
- `devfull`: every command's outputs aimed at /dev/full (directly, or through a symbolic link
  with the file type the flag wants): exit 2 with the path and the reason.
- `absurd`: tune measurements of 0, negative, inf, nan, 1e300 and faster-than-peak step times:
  no trial COMPLETE, strict JSON output.
- `storage`: text, corrupt and foreign SQLite files as tune storages: exit 2 naming what is
  wrong.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from multiprocessing import get_context
from pathlib import Path

HERE = Path(__file__).resolve().parent
SMALL = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8,16,32,64", "--seq-len",
         "2048,4096", "--global-batch", "64", "--top", "3"]
"""A fast sweep (8 problems) for the cases."""
LARGER = ["--model", "llama3-8b,llama3-70b", "--gpu", "h100", "--gpus", "8,64,256",
          "--seq-len", "4096,8192", "--global-batch", "256,512", "--top", "3"]
"""A longer sweep (24 problems) for kills and signals at random moments."""


def strict_loads(text: str):
    """json.loads that refuses NaN and infinities (as strict parsers do)."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def cli(*args, env=None, preexec_fn=None, timeout=600) -> subprocess.CompletedProcess:
    """Run `python -m autoparallel args` as a subprocess."""
    e = dict(os.environ if env is None else env)
    e.pop("PYTHONUNBUFFERED", None)  # an unbuffered stdout drops writes to a closed pipe
    return subprocess.run([sys.executable, "-m", "autoparallel", *map(str, args)],
                          capture_output=True, text=True, env=e, preexec_fn=preexec_fn,
                          timeout=timeout)


def popen(*args, **kw) -> subprocess.Popen:
    e = dict(os.environ)
    e.pop("PYTHONUNBUFFERED", None)
    return subprocess.Popen([sys.executable, "-m", "autoparallel", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                            **kw)


# --- in-process sweeps --------------------------------------------------------------------

def spec_of(args: list[str]):
    """(SweepSpec, SearchSpace) of CLI-style sweep arguments."""
    from autoparallel.search.space import SearchSpace
    from autoparallel.search.sweep import SweepSpec

    it = iter(args)
    data = {}
    for flag in it:
        value = next(it)
        key = flag.lstrip("-").replace("-", "_")
        if key == "top":
            data[key] = int(value)
        elif key in ("gpus", "seq_len", "global_batch"):
            data[key] = [int(v) for v in value.split(",")]
        else:
            data[key] = value.split(",")
    return SweepSpec.model_validate(data), SearchSpace()


def sweep_inprocess(out: Path, args: list[str] = SMALL, **kw) -> dict:
    from autoparallel.search.sweep import run_sweep

    spec, space = spec_of(args)
    return run_sweep(spec, space, out, **kw)


_REF: dict = {}


def reference(tmp: Path, args: list[str] = SMALL) -> bytes:
    """The bytes of an uninterrupted sweep (computed once per process and grid)."""
    key = tuple(args)
    if key not in _REF:
        import hashlib

        out = tmp / f"reference-{hashlib.sha1(repr(key).encode()).hexdigest()[:10]}.csv"
        if out.exists():
            out.unlink()
        sweep_inprocess(out, args)
        _REF[key] = out.read_bytes()
    return _REF[key]


def leftovers(folder: Path) -> list[str]:
    """Empty files and temporary files left in `folder`."""
    bad = []
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.stat().st_size == 0:
            bad.append(f"0-byte file {p.name}")
        if p.name.startswith(".") and p.name.endswith((".tmp", ".new")):
            bad.append(f"temporary file left: {p.name}")
    return bad


def _compare(got: bytes, want: bytes, what: str) -> list[str]:
    if got == want:
        return []
    n = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    line = got[:n].count(b"\n") + 1
    return [f"{what}: not byte-identical to the uninterrupted run ({len(got)} vs {len(want)} "
            f"bytes, first difference on line {line})"]


def cut_case(rng: random.Random, tmp: Path, args: list[str] = SMALL) -> list[str]:
    """Cut the reference at a random offset and resume in-process."""
    ref = reference(tmp, args)
    off = rng.randrange(len(ref) + 1)
    case = tmp / f"cut-{off}"
    case.mkdir(exist_ok=True)
    out = case / "s.csv"
    out.write_bytes(ref[:off])
    sweep_inprocess(out, args)
    return _compare(out.read_bytes(), ref, f"cut at byte {off}") + leftovers(case)


def _child_sweep(out: str, args: list[str], events_fd: int, limit: int | None) -> None:
    """Child process body: a sweep that writes one byte to `events_fd` per finished problem;
    exits 0 (done), 2 (OutputError, message on stderr), 3 (refused: another writer)."""
    from autoparallel.errors import OutputError

    if limit is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        sweep_inprocess(Path(out), args, jobs=1,
                        progress=lambda done, total, label: os.write(events_fd, b"."))
    except OutputError as exc:
        try:  # stderr may be a file the size limit also stops (a test's capture)
            sys.stderr.write(f"error: {exc}\n")
            sys.stderr.flush()
        except OSError:
            pass
        os._exit(3 if "another writer" in str(exc) else 2)
    os._exit(0)


def _fork_sweep(out: Path, args: list[str], limit: int | None = None):
    r, w = os.pipe()
    proc = get_context("fork").Process(target=_child_sweep, args=(str(out), args, w, limit))
    proc.start()
    os.close(w)
    return proc, r


def kill_case(rng: random.Random, tmp: Path, args: list[str] = SMALL) -> list[str]:
    """SIGKILL a (forked, in-process) sweep right after a random number of problems was
    written (it carries on computing until the signal lands), then resume."""
    ref = reference(tmp, args)
    k = rng.randrange(0, 8)
    case = tmp / f"kill-{k}-{rng.randrange(10**9)}"
    case.mkdir()
    out = case / "s.csv"
    proc, events = _fork_sweep(out, args)
    got = 0
    with os.fdopen(events, "rb", buffering=0) as ev:
        while got < k:
            if not ev.read(1):
                break  # finished before the k-th event
            got += 1
        os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    bad = [p for p in leftovers(case) if "temporary" in p]  # resume may see a cut header
    sweep_inprocess(out, args)
    return bad + _compare(out.read_bytes(), ref, f"killed after {got} problems") + leftovers(case)


def full_case(rng: random.Random, tmp: Path, args: list[str] = SMALL,
              level: int | None = None) -> list[str]:
    """The output limited to a random size (RLIMIT_FSIZE: writes beyond it fail with EFBIG):
    the sweep must stop with an OutputError (exit 2), leave no empty file and no partial
    problem; the resumed sweep (no limit) is byte-identical."""
    ref = reference(tmp, args)
    level = rng.randrange(len(ref)) if level is None else level
    case = tmp / f"full-{level}"
    case.mkdir()
    out = case / "s.csv"
    proc, events = _fork_sweep(out, args, limit=level)
    with os.fdopen(events, "rb", buffering=0) as ev:
        ev.read()
    proc.join()
    bad = []
    if proc.exitcode != 2:
        bad.append(f"fill level {level}: exit {proc.exitcode}, expected 2 (OutputError)")
    if out.exists():
        raw = out.read_bytes()
        if not raw:
            bad.append(f"fill level {level}: left a 0-byte output")
        elif not ref.startswith(raw):
            bad.append(f"fill level {level}: what is left is not a prefix of the full run")
        elif raw.count(b"\n") and raw[: raw.rfind(b"\n") + 1] != raw:
            bad.append(f"fill level {level}: a partial line is left")
    bad += leftovers(case)
    sweep_inprocess(out, args)
    return bad + _compare(out.read_bytes(), ref, f"full at {level} bytes, then resumed")


def two_writers_case(rng: random.Random, tmp: Path, args: list[str] = SMALL,
                     wait: bool = False) -> list[str]:
    """Two forked sweeps on one output, released together: no problem written twice."""
    ref = reference(tmp, args)
    case = tmp / f"two-{rng.randrange(10**9)}"
    case.mkdir()
    out = case / "s.csv"
    go_r, go_w = os.pipe()
    ctx = get_context("fork")

    def body(events_w: int):
        os.read(go_r, 1)  # the barrier: both start when the parent writes two bytes
        from autoparallel.errors import OutputError

        try:
            sweep_inprocess(out, args, jobs=1, wait=wait,
                            progress=lambda *a: os.write(events_w, b"."))
        except OutputError as exc:
            sys.stderr.write(f"error: {exc}\n")
            os._exit(3 if "another writer" in str(exc) else 2)
        os._exit(0)

    procs = []
    for _ in range(2):
        r, w = os.pipe()
        p = ctx.Process(target=body, args=(w,))
        p.start()
        os.close(w)
        procs.append((p, r))
    os.write(go_w, b"xx")
    for p, r in procs:
        with os.fdopen(r, "rb", buffering=0) as ev:
            ev.read()
        p.join()
    os.close(go_r)
    os.close(go_w)
    codes = sorted(p.exitcode for p, _ in procs)
    bad = []
    allowed = ([0, 0],) if wait else ([0, 0], [0, 3])
    if codes not in allowed:
        bad.append(f"two writers{' (--wait)' if wait else ''}: exit codes {codes}")
    rows = out.read_bytes().split(b"\n")
    if len(rows) != len(set(rows)):
        bad.append("two writers: a row was written twice")
    return bad + _compare(out.read_bytes(), ref, "two writers") + leftovers(case)


# --- command-line cases -------------------------------------------------------------------

def _lines_at_least(path: Path, n: int, proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until `path` holds `n` lines (or the process ended): a file event, polled."""
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if path.read_bytes().count(b"\n") >= n:
                return True
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    return False


NOTE = "note: "
"""Prefix of an outcome that is not a failure (counted apart)."""


def _before_our_code(code: int, sig: int, err: str) -> bool:
    """The process ended by `sig` before it ran any of our code: killed by SIGTERM's default
    action with nothing printed, or Python's own KeyboardInterrupt traceback from start-up
    modules (site, encodings, the import system) without a frame of autoparallel."""
    if code == -sig and not err.strip():
        return True
    tb = "Traceback (most recent call last)" in err and err.strip().endswith("KeyboardInterrupt")
    return tb and "autoparallel" not in err


def _interrupted_line(err: str) -> list[str]:
    bad = []
    if "Traceback" in err:
        bad.append("traceback on stderr")
    lines = [ln for ln in err.splitlines() if ln.startswith("interrupted (")]
    if len(lines) != 1:
        bad.append(f"{len(lines)} 'interrupted' lines (want 1): {err.strip()[-200:]!r}")
    return bad


def signal_case(rng: random.Random, tmp: Path, sig: int, args: list[str] = LARGER,
                jobs: int = 2, at_line: int | None = None, delay: float | None = None,
                resume_cli: bool = True) -> list[str]:
    """A CLI sweep sent `sig` after a random number of written lines (or a random delay from
    its start), then resumed with the CLI."""
    ref = reference(tmp, args)
    case = tmp / f"sig-{int(sig)}-{rng.randrange(10**9)}"
    case.mkdir()
    out = case / "s.csv"
    proc = popen("sweep", *args, "--output", out, "--jobs", jobs)
    if delay is not None:
        time.sleep(delay)  # a random moment, by design (benchmark only)
    else:
        n = at_line if at_line is not None else rng.randrange(1, ref.count(b"\n"))
        _lines_at_least(out, n, proc, time.monotonic() + 300)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    bad = []
    if proc.returncode == 130:
        bad += _interrupted_line(err)
    elif _before_our_code(proc.returncode, sig, err):
        bad.append(NOTE + "the signal came while the Python interpreter itself started, "
                   "before any autoparallel code ran")
    elif proc.returncode != 0:
        bad.append(f"exit {proc.returncode} after {signal.Signals(sig).name}: {err.strip()[-200:]!r}")
    bad += _resume(out, args, jobs, resume_cli)
    return bad + _compare(out.read_bytes(), ref, f"{signal.Signals(sig).name}, resumed") + leftovers(case)


def _resume(out: Path, args: list[str], jobs: int, with_cli: bool) -> list[str]:
    """Resume the sweep with the command line (or in this process, which writes the same)."""
    if not with_cli:
        sweep_inprocess(out, args)
        return []
    r = cli("sweep", *args, "--output", out, "--jobs", jobs)
    if r.returncode != 0:
        return [f"resume: exit {r.returncode}: {r.stderr.strip()[-200:]!r}"]
    return []


def cli_kill_case(rng: random.Random, tmp: Path, args: list[str] = LARGER, jobs: int = 2,
                  delay: float | None = None, resume_cli: bool = True) -> list[str]:
    """SIGKILL a CLI sweep (worker processes included) at a random moment, resume with the
    CLI; no worker may outlive its parent."""
    ref = reference(tmp, args)
    case = tmp / f"clikill-{rng.randrange(10**9)}"
    case.mkdir()
    out = case / "s.csv"
    proc = popen("sweep", *args, "--output", out, "--jobs", jobs)
    if delay is None:
        _lines_at_least(out, rng.randrange(1, ref.count(b"\n")), proc, time.monotonic() + 300)
    else:
        time.sleep(delay)
    kids = _children(proc.pid)
    proc.kill()
    proc.communicate()
    bad = []
    deadline = time.monotonic() + 10
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.01)
    alive = [k for k in kids if _alive(k)]
    if alive:
        bad.append(f"worker process(es) {alive} outlived the killed sweep")
    bad += [p for p in leftovers(case) if "temporary" in p]
    bad += _resume(out, args, jobs, resume_cli)
    return bad + _compare(out.read_bytes(), ref, "SIGKILL, resumed") + leftovers(case)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def devfull_commands(tmp: Path) -> list[tuple[str, list[str]]]:
    """(name, argv) of every command with a file output, aimed at /dev/full (a symbolic link
    with the wanted file type where a flag checks it)."""
    def link(name: str) -> str:
        p = tmp / name
        if not p.is_symlink():
            p.symlink_to("/dev/full")
        return str(p)

    batch = tmp / "batch.csv"
    batch.write_text("model,gpu,n_gpus,gpus_per_node,seq_len,global_batch,dp,tp,pp,vp,cp,ep,"
                     "zero,recompute,sp,micro_batch\n"
                     "llama3-8b,h100,8,8,4096,64,,1,1,1,1,1,2,none,,2\n")
    p8 = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
          "--global-batch", "64"]
    runs = str(HERE / "data" / "runs_subset.csv")
    return [
        ("sweep --output", ["sweep", *SMALL[:-2], "--top", "1", "--output", "/dev/full"]),
        ("estimate --input --output", ["estimate", "--input", str(batch), "--output", "/dev/full"]),
        ("plan --plot", ["plan", *p8, "--top", "2", "--plot", link("plan.png")]),
        ("export --output", ["export", *p8, "--target", "megatron", "--rank", "1", "--output",
                             "/dev/full"]),
        ("capacity --plot", ["capacity", "--model", "llama3-8b", "--tokens", "1T", "--seq-len",
                             "4096", "--global-batch", "512", "--gpu", "h100", "--gpus", "64",
                             "--plot", link("cap.png")]),
        ("validate --output", ["validate", "--runs", runs, "--memory-runs", "none", "--output",
                               "/dev/full"]),
        ("validate --plot", ["validate", "--runs", runs, "--memory-runs", "none", "--plot",
                             link("val.png")]),
        ("calibrate --output", ["calibrate", "--gpu", "h100", "--runs", runs, "--no-loso",
                                "--output", link("prof.toml")]),
    ]


def devfull_case(name: str, argv: list[str]) -> list[str]:
    """One command writing to /dev/full, run in this process: exit 2 naming the output."""
    from fuzzing import run_inprocess

    code, _, err = run_inprocess(argv)
    bad = []
    if code != 2:
        bad.append(f"{name}: exit {code} (want 2): {err.strip()[-200:]!r}")
    elif "no space left" not in err:
        bad.append(f"{name}: the reason is not given: {err.strip()[-200:]!r}")
    if "Traceback" in err:
        bad.append(f"{name}: traceback")
    return bad


def stdout_full_case(argv: list[str]) -> list[str]:
    """A command whose standard output is /dev/full: exit 2 with a message."""
    with open("/dev/full", "w") as full:
        e = dict(os.environ)
        e.pop("PYTHONUNBUFFERED", None)
        r = subprocess.run([sys.executable, "-m", "autoparallel", *argv], stdout=full,
                           stderr=subprocess.PIPE, text=True, env=e, timeout=300)
    if r.returncode != 2 or "standard output" not in r.stderr:
        return [f"{argv[0]} > /dev/full: exit {r.returncode}: {r.stderr.strip()[-200:]!r}"]
    return []


ABSURD = ["0", "-1", "-0.0", "inf", "-inf", "nan", "1e300", "1e-9", "0.000001"]
"""Step times no job can report (a 1e-9 s step of 8B on 8 H100s is far above 100 % MFU)."""


def absurd_case(tmp: Path, value: str) -> list[str]:
    """`tune` whose every measurement is `value`: no COMPLETE trial; strict JSON."""
    from fuzzing import run_inprocess

    argv = ["tune", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "64", "--measure", f"echo step_time_s={value}", "--metric-regex",
            r"step_time_s=(\S+)", "--trials", "2", "--seeds", "1", "--format", "json",
            "--workdir", str(tmp / f"wd-{value}")]
    code, out, err = run_inprocess(argv)
    bad = []
    try:
        data = strict_loads(out)
    except ValueError as exc:
        return [f"tune {value}: output is not strict JSON ({exc})"]
    done = [t for t in data["trials"] if t["state"] == "COMPLETE"]
    if done:
        bad.append(f"tune {value}: {len(done)} COMPLETE trial(s) with step time {value}")
    fails = [t for t in data["trials"] if t["state"] == "FAIL"]
    if not fails or any(t["failure"] != "implausible" for t in fails):
        bad.append(f"tune {value}: failures {[t['failure'] for t in fails]} (want implausible)")
    if code != 1:
        bad.append(f"tune {value}: exit {code} (want 1: nothing measured)")
    return bad


def storage_files(tmp: Path) -> dict[str, Path]:
    """Broken SQLite storages: text, truncated, garbled, foreign schema, foreign version."""
    import sqlite3

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    good = tmp / "good.db"
    if not good.exists():
        optuna.create_study(storage=f"sqlite:///{good}", study_name="x")
    raw = good.read_bytes()
    files = {"text": b"hello, not a database\n", "truncated": raw[: len(raw) // 2]}
    garbled = bytearray(raw)
    garbled[100:4000] = b"\xff" * 3900
    files["garbled"] = bytes(garbled)
    out = {}
    for name, data in files.items():
        out[name] = tmp / f"{name}.db"
        out[name].write_bytes(data)
    out["foreign schema"] = tmp / "foreign.db"
    if not out["foreign schema"].exists():
        con = sqlite3.connect(out["foreign schema"])
        con.execute("CREATE TABLE studies (x TEXT)")
        con.commit()
        con.close()
    out["foreign version"] = tmp / "version.db"
    if not out["foreign version"].exists():
        con = sqlite3.connect(out["foreign version"])
        con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32))")
        con.execute("INSERT INTO alembic_version VALUES ('v0.0.1')")
        con.commit()
        con.close()
    return out


STORAGE_WORDS = {"text": "not an SQLite database", "truncated": "corrupt", "garbled": "corrupt",
                 "foreign schema": "foreign schema", "foreign version": "foreign schema"}


def storage_case(name: str, path: Path) -> list[str]:
    from fuzzing import run_inprocess

    argv = ["tune", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "64", "--measure", "echo step_time_s=3", "--trials", "1",
            "--storage", f"sqlite:///{path}"]
    code, _, err = run_inprocess(argv)
    if code != 2 or STORAGE_WORDS[name] not in err:
        return [f"storage {name}: exit {code}: {err.strip()[-200:]!r}"]
    return []


def json_cases() -> list[list[str]]:
    p8 = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
          "--global-batch", "64"]
    return [["plan", *p8, "--top", "3", "--format", "json"],
            ["plan", *p8, "--objective", "time,memory", "--format", "json"],
            ["plan", *p8, "--objective", "time,gpus", "--format", "json"],
            ["plan", "--model", "llama3-405b", "--gpu", "h100", "--gpus", "8", "--seq-len",
             "8192", "--global-batch", "64", "--format", "json"],
            ["estimate", *p8, "--tp", "2", "--format", "json"],
            ["estimate", "--model", "llama3-405b", "--gpu", "h100", "--gpus", "8", "--seq-len",
             "8192", "--global-batch", "64", "--format", "json"],
            ["capacity", "--model", "llama3-8b", "--tokens", "1T", "--seq-len", "4096",
             "--global-batch", "512", "--gpu", "h100", "--gpus", "8,64", "--format", "json"],
            ["schema", "plan"]]


def json_case(argv: list[str]) -> list[str]:
    from fuzzing import run_inprocess

    code, out, err = run_inprocess(argv)
    if code not in (0, 1):
        return [f"{' '.join(argv[:1])} json: exit {code}: {err.strip()[-200:]!r}"]
    if code == 1 and not out.strip():
        return []  # nothing fits: the message is on stderr
    try:
        strict_loads(out)
    except ValueError as exc:
        return [f"{' '.join(argv)}: not strict JSON ({exc})"]
    return []


def tmpfs(folder: Path, size_kib: int) -> bool:
    """Mount a tmpfs of `size_kib` at `folder` (root only); False when it cannot."""
    folder.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(folder)],
                       capture_output=True)
    return r.returncode == 0


def umount(folder: Path) -> None:
    subprocess.run(["umount", str(folder)], capture_output=True)


def enospc_case(rng: random.Random, tmp: Path, args: list[str] = SMALL) -> list[str]:
    """A real full disk: a small tmpfs, pre-filled to a random level, holds the CLI sweep's
    output; exit 2 naming ENOSPC; after the filler is removed the resume is byte-identical."""
    ref = reference(tmp, args)
    mnt = tmp / f"tmpfs-{rng.randrange(10**9)}"
    if not tmpfs(mnt, 64):
        return ["tmpfs: cannot mount (not root?)"]
    try:
        free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
        fill = max(0, free - rng.randrange(0, len(ref) + 4096))
        filler = mnt / "filler"
        with open(filler, "wb") as f:
            try:
                f.write(b"\0" * fill)
            except OSError:
                pass
        out = mnt / "s.csv"
        r = cli("sweep", *args, "--output", out, "--jobs", 1)
        bad = []
        if r.returncode not in (0, 2):
            bad.append(f"tmpfs full: exit {r.returncode}: {r.stderr.strip()[-200:]!r}")
        if r.returncode == 2 and "no space left" not in r.stderr:
            bad.append(f"tmpfs full: reason not given: {r.stderr.strip()[-200:]!r}")
        bad += [b for b in leftovers(mnt) if "filler" not in b]
        filler.unlink()
        r = cli("sweep", *args, "--output", out, "--jobs", 1)
        if r.returncode != 0:
            bad.append(f"tmpfs resume: exit {r.returncode}: {r.stderr.strip()[-200:]!r}")
        bad += _compare(out.read_bytes(), ref, "full disk, resumed")
        return bad
    finally:
        umount(mnt)


def readonly_storage_case(tmp: Path) -> list[str]:
    """A storage on a read-only mount (root only: a read-only bind mount): exit 2, 'read-only'."""
    import shutil

    from fuzzing import run_inprocess

    src, mnt = tmp / "ro-src", tmp / "ro"
    src.mkdir(exist_ok=True)
    mnt.mkdir(exist_ok=True)
    storage_files(tmp)
    shutil.copy(tmp / "good.db", src / "good.db")
    if subprocess.run(["mount", "--bind", str(src), str(mnt)], capture_output=True).returncode:
        return ["read-only storage: cannot bind-mount (not root?)"]
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)], capture_output=True,
                       check=True)
        bad = []
        for name in ("good.db", "new.db"):
            code, _, err = run_inprocess([
                "tune", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len",
                "4096", "--global-batch", "64", "--measure", "echo step_time_s=3", "--trials",
                "1", "--storage", f"sqlite:///{mnt / name}"])
            if code != 2 or "read-only" not in err:
                bad.append(f"read-only storage {name}: exit {code}: {err.strip()[-200:]!r}")
        return bad
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
