"""Dead ends turned into next steps: when nothing fits, `plan` searches again and names what
does (a saver it left out, the GPU count); a capacity deadline no count meets says what count
it implies; `tune` says where its logs are, removes the temporary directory it made unless it
is asked to keep it, and does not list trials that never ran."""

import json
import re
import shlex
import sys
from pathlib import Path

from autoparallel import make_problem
from autoparallel.problem import with_gpu_count
from autoparallel.search.next_steps import next_steps
from autoparallel.search.plan import plan
from autoparallel.search.space import SearchSpace
from conftest import run_cli

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_llama70b_on_8_h100_names_offload_and_the_gpu_count_that_fit():
    """Llama-3 70B on one node of 8 H100 does not fit (model states alone are 16 bytes x 70.6B
    = 1.13 TB against 8 x 80 GiB): the next steps say which saver fits and how many GPUs do,
    and each claim is checked here by searching again independently."""
    p = make_problem("llama3-70b", "h100", 8, 4096, 64)
    res = plan(p, keep=0)
    assert res.n_fit == 0
    steps = next_steps(res)
    offload = [s for s in steps if s.startswith("--offload fits")]
    assert offload, steps
    with_saver = plan(p, SearchSpace().narrowed(optimizer_offload=[0.0, 0.5, 1.0],
                                                offload_auto=True), top=1, keep=0)
    assert with_saver.n_fit > 0 and with_saver.records()[0]["slug"] in offload[0]
    more = [s for s in steps if " GPUs fit (--gpus " in s]
    assert more, steps
    n = int(re.search(r"--gpus (\d+)", more[0])[1])
    assert plan(with_gpu_count(p, n), top=1, keep=0).n_fit > 0
    assert plan(with_gpu_count(p, n // 2), top=1, keep=0).n_fit == 0
    # the README quotes this example
    quoted = re.search(r"Llama-3 70B on 8 H100: `--offload` fits, and (\d+) GPUs do", README)
    assert quoted and int(quoted[1]) == n


def test_plan_prints_the_next_steps_after_its_error():
    r = run_cli("plan", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "8", "--seq-len",
                "4096", "--global-batch", "64", "--keep", "0")
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[0].startswith("error: 0 of ")
    assert any(line.startswith("  next step: --offload fits") for line in lines)
    assert any(re.match(r"  next step: \d+ GPUs fit \(--gpus \d+", line) for line in lines)


def test_a_deadline_no_count_meets_says_what_count_it_implies():
    r = run_cli("capacity", "--model", "llama3-8b", "--tokens", "15T", "--seq-len", "8192",
                "--global-batch", "512", "--gpu", "h100", "--gpus", "8,16", "--deadline", "7d",
                "--format", "json")
    out = json.loads(r.stdout)
    row = max((x for x in out["rows"] if x["fits"]), key=lambda x: x["n_gpus"])
    need = -(-row["n_gpus"] * row["days_high"] // 7)  # linear scaling from the largest count
    t = run_cli("capacity", "--model", "llama3-8b", "--tokens", "15T", "--seq-len", "8192",
                "--global-batch", "512", "--gpu", "h100", "--gpus", "8,16", "--deadline", "7d")
    flat = " ".join(t.stdout.split())
    assert f"the largest, {row['n_gpus']:,}, takes {row['days_high']:.1f} days" in flat
    assert f"at least {int(need):,} GPUs" in flat


def _measure(seconds: float, fail: bool = False) -> str:
    code = f"print('step_time_s={seconds}')" + ("; raise SystemExit(3)" if fail else "")
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def _tune(*extra):
    import fuzzing as F

    return F.run_inprocess(["tune", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8",
                            "--seq-len", "4096", "--global-batch", "64", "--candidates", "4",
                            *extra])


def _workdir(err: str) -> Path:
    return Path(re.search(r"trial logs and configs: (\S+)", err)[1])


def test_tune_names_its_temporary_directory_and_removes_it():
    for measure, want in ((_measure(3.1), 0), (_measure(3.1, fail=True), 1)):
        code, out, err = _tune("--measure", measure, "--trials", "2", "--seeds", "2")
        assert code == want, err
        where = _workdir(err)
        assert "removed at the end; --keep-workdir keeps it" in err and not where.exists()
        assert "trial logs and configs" not in out  # nothing left to point at
    flat = " ".join(err.split())  # the failed run: the end of the trial's output, how to keep
    assert "crash (trial 0: exit code 3: step_time_s=3.1)" in flat and "--keep-workdir" in flat


def test_tune_keep_workdir_keeps_it_and_says_where(tmp_path):
    import shutil

    code, out, err = _tune("--measure", _measure(3.1, fail=True), "--trials", "1", "--seeds",
                           "1", "--keep-workdir")
    where = _workdir(err)
    try:
        assert code == 1 and where.is_dir() and list(where.glob("trial-*/output.log"))
        assert f"output.log is in {where}" in " ".join(err.split())
        assert f"trial logs and configs: {where}" in " ".join(out.split())
    finally:
        shutil.rmtree(where, ignore_errors=True)
    own = tmp_path / "runs"
    code, _, err = _tune("--measure", _measure(3.1), "--trials", "1", "--seeds", "1",
                         "--workdir", own)
    assert code == 0 and own.is_dir()  # a directory the user named is never removed


def test_trials_that_never_start_are_not_listed():
    """Three seeds are enqueued, one trial is measured: the two waiting ones are counted, not
    listed as trials."""
    code, out, err = _tune("--measure", _measure(3.1), "--trials", "1", "--seeds", "3",
                           "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert [t["state"] for t in data["trials"]] == ["COMPLETE"]
    assert data["waiting"] == 2
