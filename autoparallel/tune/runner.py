"""Run one measurement: a real subprocess (never a shell) with a timeout; read the step time from
its output; classify failures as `oom`, `crash`, `timeout` or `no_metric`.

The job's stdout and stderr go, merged, to `output.log` in the trial directory (a file, not a
pipe, so a chatty job can never block on a full pipe). The job runs in its own process group so
that a timeout ends it and every process it started (e.g. torchrun's workers).

The job also dies with its worker, even when the worker is killed without any chance to clean
up (SIGKILL, the OOM killer): a watchdog process (`JobWatchdog`, one per `tune` process, in a
session of its own) holds the read end of a pipe whose write end only the `tune` process holds.
Each job's process group is registered on the pipe when it starts and unregistered when it has
been reaped; when the pipe closes without a clean goodbye, the kernel has closed it because the
worker died, and the watchdog ends every group still registered (SIGTERM, then SIGKILL after
the grace period). A parent-death signal (`prctl(PR_SET_PDEATHSIG)` in a `preexec_fn`) would
reach only the job's first process, fires when the forking *thread* ends rather than the
process, and `preexec_fn` is unsafe in a process with threads, which `tune` workers are.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError

DEFAULT_METRIC_REGEX = r"step_time_s\s*[=:]\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
"""Default `--metric-regex`: lines such as `step_time_s=1.234` or `step_time_s: 1.2e0`."""

OOM_PATTERN = re.compile(
    r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|RESOURCE_EXHAUSTED", re.I)
"""Output that marks an out-of-memory failure (CUDA/HIP OOM messages, torch's OutOfMemoryError,
cuBLAS allocation failures, XLA's RESOURCE_EXHAUSTED)."""

FAILURES = ("oom", "crash", "timeout", "no_metric")


class Interrupted(Exception):
    """The measurement was stopped from outside (`stop` was set); the job has been killed."""


@dataclass(frozen=True)
class MetricParser:
    """Reads the step time from a job's output.

    Every match of `regex` contributes one value: the named group `ms` (milliseconds) or `s`
    (seconds), else the first group (seconds). With three or more matches the first is dropped
    as warm-up; the step time is the median of the rest.
    """

    regex: re.Pattern

    @classmethod
    def compile(cls, pattern: str | None) -> MetricParser:
        """Compile `--metric-regex` (default `DEFAULT_METRIC_REGEX`), with readable errors."""
        text = DEFAULT_METRIC_REGEX if pattern is None else pattern
        try:
            rx = re.compile(text)
        except re.error as exc:
            raise SpecError(f"`--metric-regex` {text!r}: not a valid regular expression "
                            f"({exc})") from None
        except (OverflowError, RecursionError) as exc:  # a{4294967296}, deep nesting
            raise SpecError(f"`--metric-regex` {text[:80]!r}: too large for the regular "
                            f"expression engine ({exc}); a step-time pattern needs no repeat "
                            "counts beyond a few digits, e.g. 'step_time_s=([0-9.]+)'") from None
        if rx.groups == 0:
            raise SpecError(f"`--metric-regex` {text!r}: needs a group around the number, e.g. "
                            r"'step_time_s=([0-9.]+)', or a named group (?P<ms>...) for "
                            "milliseconds")
        return cls(rx)

    def values_s(self, text: str) -> list[float]:
        """Every step time (seconds) found in `text`."""
        out = []
        for m in self.regex.finditer(text):
            named = m.groupdict()
            raw, scale = ((named["ms"], 1e-3) if named.get("ms") is not None
                          else (named["s"], 1.0) if named.get("s") is not None
                          else (m.group(1), 1.0))
            try:
                out.append(float(raw) * scale)
            except (TypeError, ValueError):
                continue
        return out

    def step_time_s(self, text: str) -> float | None:
        """The step time: median after dropping a warm-up match; None without a match."""
        vals = self.values_s(text)
        if not vals:
            return None
        return float(statistics.median(vals[1:] if len(vals) >= 3 else vals))


@dataclass(frozen=True)
class Outcome:
    """Result of one measurement; `failure` is None when `step_time_s` was read."""

    step_time_s: float | None
    failure: str | None
    """One of `FAILURES`, or None."""
    detail: str
    """Why it failed (exit code, last relevant output line), or a short summary."""
    returncode: int | None
    wall_s: float
    log_path: Path


def _tail(text: str, n: int = 3, width: int = 300) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-width:]


def classify(text: str, returncode: int | None, timed_out: bool, metric: MetricParser,
             timeout_s: float) -> tuple[float | None, str | None, str]:
    """(step time, failure kind, detail) from a finished job's output and exit status.

    Order: a timeout wins; then an out-of-memory message when the job failed or gave no step
    time; then a non-zero exit (crash); then a clean exit without a step time (no_metric)."""
    if timed_out:
        return None, "timeout", f"no exit within {timeout_s:g} s; last output: {_tail(text)}"
    step = metric.step_time_s(text)
    oom = OOM_PATTERN.search(text)
    if oom and (returncode != 0 or step is None):
        line = next((ln for ln in text.splitlines() if OOM_PATTERN.search(ln)), "")
        return None, "oom", f"exit code {returncode}: {line.strip()[:300]}"
    if returncode != 0:
        return None, "crash", f"exit code {returncode}: {_tail(text)}"
    if step is None:
        return None, "no_metric", (f"exit code 0 but no match of {metric.regex.pattern!r}; "
                                   f"last output: {_tail(text)}")
    return step, None, f"{step:.6g} s"


_WATCHDOG_CODE = r"""
import os, signal, sys, time
grace = float(sys.argv[1])
groups, buf, clean = set(), b"", False
while True:
    chunk = os.read(0, 4096)
    if not chunk:
        break
    buf += chunk
    *lines, buf = buf.split(b"\n")
    for line in lines:
        op, arg = line[:1], line[1:]
        if op == b"+":
            groups.add(int(arg))
        elif op == b"-":
            groups.discard(int(arg))
        elif op == b"q":
            clean = True
if not clean:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pg in list(groups):
            try:
                os.killpg(pg, sig)
            except OSError:
                groups.discard(pg)
        deadline = time.monotonic() + grace
        while groups and time.monotonic() < deadline:
            for pg in list(groups):
                try:
                    os.killpg(pg, 0)
                except OSError:
                    groups.discard(pg)
            time.sleep(0.05)
"""
"""The watchdog's program: register (`+pgid`) and unregister (`-pgid`) process groups; `q` is the
clean goodbye. At end of input without it, end the registered groups."""


class JobWatchdog:
    """One helper process per `tune` process that ends the registered jobs' process groups if
    this process dies (see the module docstring). Started on first use; POSIX only."""

    _lock = threading.Lock()
    _proc: subprocess.Popen | None = None
    _pid: int | None = None

    @classmethod
    def _start(cls) -> None:
        """Start the watchdog on first use (or in a forked child); call with `_lock` held."""
        if cls._proc is None or cls._pid != os.getpid():
            cls._proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _WATCHDOG_CODE, "5"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            cls._pid = os.getpid()

    @classmethod
    def ready(cls) -> None:
        """Have the watchdog running before a job starts, so that registering the job is one
        pipe write: a worker killed while a first job starts would otherwise leave it unwatched
        for as long as the watchdog's interpreter takes to start."""
        if os.name == "posix":
            with cls._lock:
                cls._start()

    @classmethod
    def _send(cls, line: str) -> None:
        with cls._lock:
            cls._start()
            try:
                cls._proc.stdin.write(line.encode() + b"\n")
                cls._proc.stdin.flush()
            except (BrokenPipeError, OSError):  # the watchdog was killed: start another
                cls._proc = None

    @classmethod
    def register(cls, pgid: int) -> None:
        """Watch the process group `pgid`."""
        if os.name == "posix":
            cls._send(f"+{pgid}")

    @classmethod
    def unregister(cls, pgid: int) -> None:
        """Stop watching `pgid` (its leader has been reaped)."""
        if os.name == "posix":
            cls._send(f"-{pgid}")

    @classmethod
    def close(cls) -> None:
        """Say goodbye (nothing to end) and let the watchdog exit."""
        with cls._lock:
            if cls._proc is not None and cls._pid == os.getpid():
                try:
                    cls._proc.stdin.write(b"q\n")
                    cls._proc.stdin.close()
                    cls._proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            cls._proc = None


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the job's process group, then SIGKILL what is left after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_measurement(argv: Sequence[str], *, timeout_s: float, metric: MetricParser,
                    log_path: Path, env: Mapping[str, str] | None = None,
                    cwd: Path | None = None, kill_grace_s: float = 5.0,
                    stop: threading.Event | None = None) -> Outcome:
    """Run `argv` (no shell), wait at most `timeout_s`, and classify the result.

    A program that cannot be started (not found, not executable) is a `crash` with the reason.
    When `stop` is set while the job runs, the job is killed and `Interrupted` is raised.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    timed_out = False
    JobWatchdog.ready()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, shell=False, cwd=cwd,
                                    env=dict(env) if env is not None else None,
                                    start_new_session=True)
        except OSError as exc:
            msg = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
            log.write(msg.encode())
            return Outcome(None, "crash", msg, None, time.perf_counter() - t0, log_path)
        JobWatchdog.register(proc.pid)  # the group id is the leader's pid (new session)
        deadline = time.monotonic() + timeout_s
        try:
            while proc.poll() is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    _kill_group(proc, kill_grace_s)
                    break
                if stop is not None and stop.is_set():
                    raise Interrupted(f"stopped while running {argv[0]!r}")
                try:
                    proc.wait(timeout=min(left, 0.2))
                except subprocess.TimeoutExpired:
                    pass
        except BaseException:  # interrupted: never leave the job running
            _kill_group(proc, 0.5)
            raise
        finally:
            if proc.returncode is not None:  # reaped: the group id may be reused from now on
                JobWatchdog.unregister(proc.pid)
    wall = time.perf_counter() - t0
    text = log_path.read_text(encoding="utf-8", errors="replace")
    step, failure, detail = classify(text, proc.returncode, timed_out, metric, timeout_s)
    return Outcome(step, failure, detail, None if timed_out else proc.returncode, wall, log_path)
