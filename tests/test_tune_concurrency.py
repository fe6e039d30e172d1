"""Many workers on one study — SQLite here, and a real PostgreSQL server (started by .ci/run or
by the `postgres_url` fixture): every trial recorded, no layout measured twice, a worker killed
mid-trial loses nothing else and its layout is retried."""

import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter

import optuna
import pytest
from optuna.trial import TrialState

from autoparallel.tune.claims import SqlClaims, normalize_url
from tuneworld import CLI_PROBLEM, make_world, measure_template, wait_for_file, wait_gone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request, tmp_path):
    """(storage URL, a study name of its own) on SQLite or on the PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}", "study"
    return request.getfixturevalue("postgres_url"), f"t-{uuid.uuid4().hex[:10]}"


def _claim_all(url: str, study: str, keys: list[str], seed: int, out: str, barrier) -> None:
    claims = SqlClaims(url, study, {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None)
    order = keys[:]
    random.Random(seed).shuffle(order)
    won = []
    for k in order:
        # every process claims its i-th key in the same round: the claiming phases overlap by
        # construction, however the processes are scheduled (no sleeps)
        barrier.wait(timeout=120)
        if claims.claim(k, seed):
            won.append(k)
    with open(out, "w") as f:
        json.dump([seed, won], f)


def test_claims_are_won_exactly_once_across_processes(storage, tmp_path):
    """The uniqueness mechanism itself: 6 processes race to claim the same 60 keys in different
    orders; every key is won by exactly one process."""
    url, study = storage
    keys = [f"layout-{i}" for i in range(60)]
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(6)
    procs = [ctx.Process(target=_claim_all,
                         args=(url, study, keys, s, str(tmp_path / f"{s}.json"), barrier))
             for s in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    results = [json.loads((tmp_path / f"{s}.json").read_text()) for s in range(6)]
    wins = Counter(k for _, won in results for k in won)
    assert sorted(wins) == sorted(keys) and set(wins.values()) == {1}
    # a real race, not one winner: the first round's keys differ between the orders, and each
    # distinct key of that round is won by one of the processes that tried it
    firsts = set()
    for s in range(6):
        order = keys[:]
        random.Random(s).shuffle(order)
        firsts.add(order[0])
    assert len(firsts) >= 2
    assert sum(1 for _, won in results if won) >= 2
    claims = SqlClaims(url, study)
    assert claims.keys() == set(keys)
    for seed, won in results:
        assert all(claims.owner(k)[0] == seed for k in won)
    # compare-and-swap: only the holder's number moves a claim
    k = keys[0]
    holder = claims.owner(k)[0]
    assert not claims.transfer(k, holder + 100, 999)
    assert claims.transfer(k, holder, 999) and claims.owner(k)[0] == 999


def _worker(url, study, world, trials, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "autoparallel", "tune", *CLI_PROBLEM, "--measure",
         measure_template(world), "--candidates", "40", "--trials", str(trials),
         "--storage", url, "--study", study, "--format", "json", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=os.environ | {"AUTOPARALLEL_DEBUG": "1"})  # a failing worker shows its traceback


def _load(url, study):
    return optuna.load_study(study_name=study, storage=normalize_url(url))


def _claim_rows(url, study):
    claims = SqlClaims(url, study)
    return {k: claims.owner(k)[0] for k in claims.keys() if not k.startswith("__")}


@pytest.mark.parametrize("k,m", [(3, 4)])
def test_k_workers_record_k_times_m_trials_and_no_layout_twice(storage, tmp_path, k, m):
    url, study = storage
    world = tmp_path / "world.json"
    truth = make_world(world, 40, oom_gib=1e9, sleep_s=0.15)
    procs = [_worker(url, study, world, m, "--workdir", str(tmp_path / f"wd{i}")) for i in range(k)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    trials = _load(url, study).get_trials()
    assert len(trials) == k * m
    assert all(t.state == TrialState.COMPLETE for t in trials)
    layouts = [t.user_attrs["layout"] for t in trials]
    assert len(set(layouts)) == k * m, Counter(layouts).most_common(3)
    assert set(layouts) <= set(truth["pool"])
    # each process measured its own M, and they overlapped in time (really concurrent)
    by_pid = Counter(t.user_attrs["worker"].split(":")[1] for t in trials)
    assert sorted(by_pid.values()) == [m] * k
    # the claims table agrees: one claim per measured layout, held by the trial that measured it
    claims = _claim_rows(url, study)
    assert claims == {t.user_attrs["layout"]: t.number for t in trials}
    # the seeds (analytically best) were enqueued once and measured once
    seeds = [t for t in trials if t.user_attrs.get("seed")]
    assert sorted(t.user_attrs["layout"] for t in seeds) == sorted(truth["pool"][:3])
    # every worker's final report shows the whole study at its end
    assert max(len(json.loads(o)["trials"]) for o, _ in outs) == k * m


def test_a_worker_killed_mid_trial_loses_nothing_else_and_its_layout_is_retried(storage, tmp_path):
    """SIGKILL one of three workers mid-trial: its training job dies with it (the watchdog), and
    the survivors, their own budgets spent, fail the stale trial themselves and measure its
    retry; nothing else is lost and no layout is measured twice."""
    url, study = storage
    world = tmp_path / "world.json"
    truth = make_world(world, 40, oom_gib=1e9, sleep_s=0.1)
    victim_layout = truth["pool"][1]  # the second seed: measured early by some worker
    marker = tmp_path / "hung.json"
    w = json.loads(world.read_text())
    w["hang"] = {"layouts": [victim_layout], "once_marker": str(marker), "sleep_s": 120}
    world.write_text(json.dumps(w))
    hb = ["--heartbeat", "1", "--grace", "6"]  # generous: a loaded CI machine delays heartbeats
    procs = [_worker(url, study, world, 4, *hb, "--workdir", str(tmp_path / f"wd{i}"))
             for i in range(3)]
    wait_for_file(marker)
    hung = json.loads(marker.read_text())
    victim = next(p for p in procs if p.pid == hung["ppid"])
    victim.send_signal(signal.SIGKILL)  # the worker dies mid-trial, without any cleanup
    victim.wait(timeout=30)
    assert wait_gone(hung["pid"], 60), "the killed worker's training job survived it"
    survivors = [p for p in procs if p is not victim]
    outs = []
    for p in survivors:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        outs.append(out)

    trials = _load(url, study).get_trials()
    lost = [t for t in trials if t.state == TrialState.FAIL]
    assert len(lost) == 1 and lost[0].user_attrs["layout"] == victim_layout
    assert "failure" not in lost[0].user_attrs  # failed by the heartbeat check, not measured
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == lost[0].number]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE
    assert retry[0].user_attrs["layout"] == victim_layout
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    layouts = [t.user_attrs["layout"] for t in done]
    assert len(set(layouts)) == len(layouts), "a layout was measured twice"
    # nothing else lost: the two survivors' 4 + 4 measurements, what the victim finished before
    # it died, and the retried layout (measured by a survivor)
    victim_pid = str(victim.pid)
    by_victim = [t for t in done if t.user_attrs["worker"].split(":")[1] == victim_pid]
    assert len(done) == 4 + 4 + len(by_victim) + 1
    assert retry[0].user_attrs["worker"].split(":")[1] in {str(p.pid) for p in survivors}
    assert _claim_rows(url, study)[victim_layout] == retry[0].number
    report = json.loads(outs[[str(p.pid) for p in survivors].index(
        retry[0].user_attrs["worker"].split(":")[1])])
    assert [r["failure"] for r in report["trials"] if r["state"] == "FAIL"] == ["worker_lost"]


def test_sigterm_kills_the_running_job_and_a_rerun_retries_its_layout(tmp_path):
    url, study = f"sqlite:///{tmp_path / 'study.db'}", "study"
    world = tmp_path / "world.json"
    truth = make_world(world, 10, oom_gib=1e9)
    marker = tmp_path / "hung.json"
    w = json.loads(world.read_text())
    w["hang"] = {"layouts": [truth["pool"][0]], "once_marker": str(marker), "sleep_s": 120}
    world.write_text(json.dumps(w))
    hb = ["--heartbeat", "1", "--grace", "4"]
    p = _worker(url, study, world, 3, *hb, "--workdir", str(tmp_path / "wd"))
    wait_for_file(marker)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted" in err
    job = json.loads(marker.read_text())["pid"]
    assert wait_gone(job, 30)  # the training job went with it
    first = _load(url, study).get_trials()
    # the interrupted trial is not a result: left RUNNING for the heartbeat check; the other
    # seeds still wait in the queue
    assert [t.state for t in first] == [TrialState.RUNNING] + [TrialState.WAITING] * 2
    # a rerun at once: it measures the two queued seeds, then (its budget spent) waits for the
    # interrupted trial to go stale, fails it and measures its retry itself
    rerun = _worker(url, study, world, 2, *hb, "--workdir", str(tmp_path / "wd2"))
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-2000:]
    rows = [(r["state"], r["failure"], r["layout"], r["retry_of"]) for r in json.loads(out)["trials"]]
    assert rows == [("FAIL", "worker_lost", truth["pool"][0], None),
                    ("COMPLETE", None, truth["pool"][1], None),
                    ("COMPLETE", None, truth["pool"][2], None),
                    ("COMPLETE", None, truth["pool"][0], 0)]


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_two_attempts_at_one_queued_trial_measure_once(kind, tmp_path):
    """On SQLite two workers can pop the same queued trial (no SELECT ... FOR UPDATE): both see
    their trial number on the claim, but only the attempt whose token is on it may measure."""
    import threading
    from types import SimpleNamespace

    from autoparallel.tune.claims import MemoryClaims, new_token
    from autoparallel.tune.loop import _hold_claim

    claims = MemoryClaims() if kind == "memory" else SqlClaims(f"sqlite:///{tmp_path / 'c.db'}", "s")
    s = SimpleNamespace(claims=claims, study=SimpleNamespace(get_trials=lambda deepcopy=False: []))
    new_token()
    assert _hold_claim(s, "dp8-tp1", 5) == "held"
    assert _hold_claim(s, "dp8-tp1", 5) == "held"  # the same attempt asking again
    other = []
    t = threading.Thread(target=lambda: (new_token(), other.append(_hold_claim(s, "dp8-tp1", 5))))
    t.start()
    t.join()
    assert other == ["other_attempt"]
    new_token()  # a later attempt of this worker at the same trial is another attempt too
    assert _hold_claim(s, "dp8-tp1", 5) == "other_attempt"
    assert _hold_claim(s, "dp8-tp1", 6) == "taken"


def test_plan_stores_its_ranking_in_a_postgresql_url_as_tune_does(postgres_url):
    # `plan --storage postgresql://...` failed with Optuna's "Failed to import DB access module"
    # where only psycopg2 is installed, though `tune` took the same URL: both now pick the driver
    from autoparallel import make_problem
    from autoparallel.search.plan import plan

    name = f"p-{uuid.uuid4().hex[:10]}"
    res = plan(make_problem("llama3-8b", "h100", 8, 4096, 64), top=3, keep=5,
               storage=postgres_url, study_name=name)
    assert res.kept == 5
    study = optuna.load_study(study_name=name, storage=normalize_url(postgres_url))
    steps = sorted(t.value for t in study.get_trials(states=(TrialState.COMPLETE,)))
    assert len(steps) == 5 and steps[0] == pytest.approx(float(res.ranked.time["step"][0]))
