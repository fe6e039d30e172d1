"""One measurement: metric parsing and failure classification, with real subprocesses."""

import sys
import time

import pytest

from autoparallel.errors import SpecError
from autoparallel.tune.runner import MetricParser, run_measurement

PY = sys.executable
DEFAULT = MetricParser.compile(None)


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def test_default_metric_drops_warmup_and_takes_the_median():
    text = "step_time_s=9.0\nstep_time_s=1.0\nnoise\nstep_time_s: 1.2\nstep_time_s=1.1e0\n"
    assert DEFAULT.values_s(text) == [9.0, 1.0, 1.2, 1.1]
    assert DEFAULT.step_time_s(text) == pytest.approx(1.1)
    assert DEFAULT.step_time_s("step_time_s=2.5") == 2.5
    assert DEFAULT.step_time_s("no number here") is None


def test_megatron_style_milliseconds_with_a_named_group():
    m = MetricParser.compile(r"elapsed time per iteration \(ms\): (?P<ms>[0-9.]+)")
    text = "\n".join(f" iteration {i}/ 10 | elapsed time per iteration (ms): {v} |"
                     for i, v in enumerate((3000.0, 1500.0, 1510.0, 1490.0)))
    assert m.step_time_s(text) == pytest.approx(1.5)


@pytest.mark.parametrize("regex,needle", [("step_time_s=(", "not a valid regular expression"),
                                          ("step_time_s=[0-9.]+", "needs a group")])
def test_bad_metric_regex_is_a_spec_error(regex, needle):
    with pytest.raises(SpecError, match=needle):
        MetricParser.compile(regex)


def test_success(tmp_path):
    out = run_measurement(py("print('step_time_s=0.5'); print('step_time_s=0.4')"),
                          timeout_s=30, metric=DEFAULT, log_path=tmp_path / "log")
    assert out.failure is None and out.step_time_s == pytest.approx(0.45) and out.returncode == 0


def test_cuda_oom_is_recognised(tmp_path):
    code = ("import sys; print('step_time_s=1.0'); "
            "sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB\\n');"
            " sys.exit(1)")
    out = run_measurement(py(code), timeout_s=30, metric=DEFAULT, log_path=tmp_path / "log")
    assert out.failure == "oom" and "CUDA out of memory" in out.detail and out.returncode == 1


def test_plain_out_of_memory_with_exit_zero_but_no_metric_is_oom(tmp_path):
    out = run_measurement(py("print('RuntimeError: HIP out of memory')"), timeout_s=30,
                          metric=DEFAULT, log_path=tmp_path / "log")
    assert out.failure == "oom"


def test_crash_is_a_nonzero_exit(tmp_path):
    out = run_measurement(py("import sys; print('boom'); sys.exit(3)"), timeout_s=30,
                          metric=DEFAULT, log_path=tmp_path / "log")
    assert out.failure == "crash" and out.returncode == 3 and "boom" in out.detail


def test_missing_program_is_a_crash(tmp_path):
    out = run_measurement([str(tmp_path / "no-such-launcher")], timeout_s=30, metric=DEFAULT,
                          log_path=tmp_path / "log")
    assert out.failure == "crash" and "cannot start" in out.detail


def test_clean_exit_without_metric(tmp_path):
    out = run_measurement(py("print('done')"), timeout_s=30, metric=DEFAULT,
                          log_path=tmp_path / "log")
    assert out.failure == "no_metric" and out.returncode == 0


def test_timeout_kills_the_whole_process_group(tmp_path, monkeypatch):
    """The job and a grandchild it started are both gone after the timeout. The runner's clock
    stands still until the job reports that its grandchild runs, then jumps past the deadline:
    the timeout fires right after that event and never before it, however loaded the machine
    (no wall-clock race between the job's start-up and a short timeout)."""
    import types

    from autoparallel.tune import runner

    pidfile = tmp_path / "grandchild.pid"
    log = tmp_path / "log"
    code = ("import subprocess, sys, time; "
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
            "time.sleep(60)")
    start = time.monotonic()

    def monotonic():
        started = log.exists() and "started" in log.read_text(errors="replace")
        return time.monotonic() + 1e6 if started else start

    monkeypatch.setattr(runner, "time", types.SimpleNamespace(
        monotonic=monotonic, perf_counter=time.perf_counter, sleep=time.sleep))
    out = run_measurement(py(code), timeout_s=1.5, metric=DEFAULT, log_path=log, kill_grace_s=1.0)
    assert out.failure == "timeout"
    assert "started" in out.detail
    from tuneworld import wait_gone

    gc = int(pidfile.read_text())
    # the grandchild was killed with its group: it ends (gone, or a zombie), waited on its pidfd
    assert wait_gone(gc, 60), "the grandchild survived the timeout"


def test_output_goes_to_the_log_file(tmp_path):
    log = tmp_path / "sub" / "output.log"
    run_measurement(py("import sys; print('out'); sys.stderr.write('err\\n'); print('step_time_s=1')"),
                    timeout_s=30, metric=DEFAULT, log_path=log)
    text = log.read_text()
    assert "out" in text and "err" in text


def test_a_sigkilled_worker_takes_its_job_and_the_jobs_children_with_it(tmp_path):
    """The worker (here a small process calling `run_measurement`) is SIGKILLed while its job
    runs; the job and a grandchild the job started both end (the watchdog ends the group)."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from tuneworld import wait_for_file, wait_gone

    pids = tmp_path / "pids.json"
    job = ("import json, os, subprocess, sys, time; "
           "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
           f"open({str(pids)!r} + '.tmp', 'w').write(json.dumps([os.getpid(), c.pid])); "
           f"os.replace({str(pids)!r} + '.tmp', {str(pids)!r}); time.sleep(120)")
    worker = ("import sys; from pathlib import Path; "
              "from autoparallel.tune.runner import MetricParser, run_measurement; "
              f"run_measurement([sys.executable, '-c', {job!r}], timeout_s=300, "
              f"metric=MetricParser.compile(None), log_path=Path({str(tmp_path / 'log')!r}))")
    proc = subprocess.Popen([sys.executable, "-c", worker])
    try:
        wait_for_file(pids)
        job_pid, child_pid = json.loads(pids.read_text())
        assert os.getpgid(job_pid) == job_pid != os.getpgid(proc.pid)  # a group of its own
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_gone(job_pid, 60), "the job outlived its SIGKILLed worker"
        assert wait_gone(child_pid, 60), "the job's child outlived the worker"
    finally:
        proc.kill()


def test_the_watchdog_starts_with_the_first_job_and_leaves_on_goodbye(tmp_path):
    """A measured job starts the watchdog; after the job has been reaped (unregistered) the
    goodbye ends the watchdog cleanly (exit 0), with nothing to kill."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", (
        "import sys, os; from pathlib import Path; "
        "from autoparallel.tune.runner import JobWatchdog, MetricParser, run_measurement; "
        "o = run_measurement([sys.executable, '-c', 'print(\"step_time_s=0.5\")'], timeout_s=60, "
        f"metric=MetricParser.compile(None), log_path=Path({str(tmp_path / 'log')!r})); "
        "w = JobWatchdog._proc; print(o.step_time_s, w is not None); JobWatchdog.close(); "
        "print(w.returncode)")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0.5", "True", "0"]
