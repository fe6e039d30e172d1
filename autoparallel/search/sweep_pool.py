"""Plan a sweep's problems in worker processes and hand the results back in problem order.

Workers are forked (they inherit the loaded modules and the problem list, so nothing is
re-imported or pickled but an index out and a CSV block back). Each worker holds up to two
problems at a time; the parent writes block i only once blocks before it are written, so the
output is ordered exactly as with one process. Workers ignore Ctrl-C and SIGTERM (the parent stops them),
die with the parent (a parent-death signal, so a killed sweep leaves no process computing), and
close the parent's output descriptor, so a killed parent's lock on the output is released at
once.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import connection, get_context

from ..errors import AutoParallelError, ExportError, InfeasibleError, OutputError, SpecError

_KINDS = {"SpecError": SpecError, "InfeasibleError": InfeasibleError,
          "ExportError": ExportError, "OutputError": OutputError}
IN_FLIGHT = 2
"""Problems a worker holds at a time (one computing, one queued behind it)."""


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask; the default of `--jobs`)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(0)


def _worker(conn, items: Sequence, work: Callable, close_fds: Sequence[int], parent: int) -> None:
    # Ctrl-C and SIGTERM reach the whole process group (a terminal, Slurm): the parent stops
    # the workers itself, so that it always reports the interruption, not a dead worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent)
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    while True:
        try:
            i = conn.recv()
        except (EOFError, OSError):
            return
        if i is None:
            return
        try:
            reply = ("ok", i, work(items[i]))
        except AutoParallelError as exc:
            reply = ("error", i, (type(exc).__name__, str(exc)))
        except OSError as exc:  # reading a file failed: reported like any I/O error
            from ..output.files import output_error

            where = exc.filename if exc.filename is not None else "input/output"
            reply = ("error", i, ("OutputError", str(output_error("", where, exc, "I/O error"))))
        except Exception as exc:  # a bug: the parent reports it as an internal error
            reply = ("bug", i, (f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        try:
            conn.send(reply)
        except (OSError, EOFError):
            return


def _raise(kind: str, i: int, detail, label: Callable[[int], str]) -> None:
    if kind == "error":
        name, message = detail
        raise _KINDS.get(name, SpecError)(message)
    text, tb = detail
    if os.environ.get("AUTOPARALLEL_DEBUG") == "1":
        sys.stderr.write(tb)
    raise RuntimeError(f"while planning {label(i)} in a worker process: {text}")


def results_in_order(items: Sequence, todo: Sequence[int], work: Callable, jobs: int, *,
                     close_fds: Sequence[int] = (),
                     label: Callable[[int], str] = str) -> Iterator[tuple[int, object]]:
    """(i, work(items[i])) for every i of `todo`, in `todo` order, computed by `jobs` worker
    processes (in this process when `jobs` is 1 or there is at most one item). Errors raised by
    `work` are raised here, in order: results before the failing item are all yielded first.

    Call it with no other thread running (workers are forked)."""
    jobs = max(1, min(jobs, len(todo)))
    if jobs == 1:
        for i in todo:
            yield i, work(items[i])
        return
    ctx = get_context("fork")
    parent = os.getpid()
    workers = []
    try:
        for _ in range(jobs):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_worker, args=(theirs, items, work, close_fds, parent),
                               daemon=True)
            proc.start()
            theirs.close()
            workers.append((proc, mine))
        queue = list(todo)[::-1]
        busy = {conn: 0 for _, conn in workers}
        for _ in range(IN_FLIGHT):
            for _, conn in workers:
                if queue:
                    conn.send(queue.pop())
                    busy[conn] += 1
        done: dict[int, tuple] = {}
        order = list(todo)
        at = 0
        proc_of = {conn: proc for proc, conn in workers}
        while at < len(order):
            while order[at] in done:
                reply = done.pop(order[at])
                if reply[0] != "ok":
                    _raise(reply[0], reply[1], reply[2], label)
                yield reply[1], reply[2]
                at += 1
                if at == len(order):
                    return
            ready = connection.wait([c for c, n in busy.items() if n > 0])
            for conn in ready:
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    proc = proc_of[conn]
                    proc.join(1)
                    code = proc.exitcode
                    if code in (-signal.SIGINT, -signal.SIGTERM):
                        raise KeyboardInterrupt  # stopped from outside, like the parent
                    how = (f"killed by signal {-code}" if code is not None and code < 0
                           else f"exit code {code}")
                    raise AutoParallelError(
                        f"a sweep worker process died ({how}; out of memory?) while planning "
                        f"{label(order[at])}; the problems before it are written. Rerun the "
                        "same command to resume, or use --jobs 1") from None
                busy[conn] -= 1
                done[reply[1]] = reply
                if queue:
                    conn.send(queue.pop())
                    busy[conn] += 1
    finally:
        _stop(workers)


def _stop(workers) -> None:
    """End the workers: a polite goodbye when they are idle, SIGKILL otherwise (an interrupted
    or failed sweep does not wait for problems it will not write)."""
    for proc, conn in workers:
        try:
            conn.send(None)
        except (OSError, EOFError):
            pass
        conn.close()
    for proc, _ in workers:
        proc.join(0.2)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
