"""Hidden "true" worlds for the fake launcher, and the truth the `tune` tests check against."""

import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np

from autoparallel import make_problem
from autoparallel.search.plan import plan

HERE = Path(__file__).parent
LAUNCHER = str(HERE / "fake_launcher.py")
sys.path.insert(0, str(HERE))
from fake_launcher import true_step_s  # noqa: E402

PROBLEM_ARGS = ("llama3-70b", "h100", 64, 8192, 512)
CLI_PROBLEM = ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--seq-len", "8192",
               "--global-batch", "512"]

DISTORTION = {
    # the hidden reality the cost model does not know: interleaved pipeline chunks, ZeRO-3
    # parameter gathers and ring attention over many ranks cost more than predicted; ZeRO-2
    # a little less
    "vp": {"10": 1.05, "8": 1.04, "5": 1.03, "4": 1.025, "2": 1.01},
    "z": {"3": 1.05, "2": 0.99},
    "cp": {"4": 1.02, "8": 1.08},
}


PENALTY = {"tp": 0.08, "pp": 0.06, "vp": 0.05, "cp": 0.07, "z": 0.05, "mb": 0.04, "flag": 0.06}
"""For `favour_rank`: what each axis value other than the favoured layout's costs extra."""


def _parts(slug: str) -> list[tuple[str, str]]:
    out = []
    for part in slug.split("-"):
        m = re.fullmatch(r"([a-z]+?)(\d+)", part)
        out.append((m[1], m[2]) if m else ("flag", part))
    return out


def favouring(slugs: list[str], target: str) -> dict:
    """A hidden distortion under which `target` is the fastest layout by construction: every axis
    value it does not use costs `PENALTY[axis]` more than the model predicts (an effect per axis
    value, the kind of error a cost model makes)."""
    mine = set(_parts(target))
    dist: dict = {}
    for s in slugs:
        for axis, value in _parts(s):
            if axis in PENALTY and (axis, value) not in mine:
                dist.setdefault(axis, {})[value] = 1 + PENALTY[axis]
    return dist


def make_world(path: Path, n_candidates: int = 40, *, distortion=None, oom_gib: float | str = 70.0,
               noise: float = 0.002, sleep_s: float = 0.05, scale: float = 1.0,
               favour_rank: int | None = None, **extra) -> dict:
    """Write the world file for the first `n_candidates` layouts that `plan` ranks (the pool
    `tune --candidates n_candidates` will use) and return the truth:
    {"pool": [slugs by predicted rank], "true_s": {slug: s}, "oom": set, "best": slug}.

    `oom_gib`: the hidden memory budget, GiB, or "median": the median predicted memory of the
    pool (about half of it runs out of memory, whatever the cost model predicts).
    `favour_rank`: hide the true best at (about) this predicted rank — the first layout from
    there on that fits the hidden memory budget — with `favouring` as the distortion."""
    res = plan(make_problem(*PROBLEM_ARGS))
    ev = res.survivors
    slugs = [ev.table.row(i).slug for i in range(min(n_candidates, len(ev)))]
    predicted = {s: [float(ev.time["step"][i]), float(ev.memory["total"][i]) / 2**30]
                 for i, s in enumerate(slugs)}
    # a template with launcher placeholders searches only the schedules Megatron can write:
    # the world knows those layouts too (they are not part of the pool of the plain template)
    mega = plan(make_problem(*PROBLEM_ARGS), target="megatron").survivors
    for i in range(min(n_candidates, len(mega))):
        predicted.setdefault(mega.table.row(i).slug, [float(mega.time["step"][i]),
                                                      float(mega.memory["total"][i]) / 2**30])
    if oom_gib == "median":
        oom_gib = float(np.median([predicted[s][1] for s in slugs]))
    if favour_rank is not None:
        target = next(s for s in slugs[favour_rank - 1:] if predicted[s][1] <= oom_gib)
        distortion = favouring(slugs, target)
    world = {"predicted": predicted, "distortion": DISTORTION if distortion is None else distortion,
             "oom_gib": oom_gib, "noise": noise, "sleep_s": sleep_s, "scale": scale, "seed": 7,
             **extra}
    path.write_text(json.dumps(world), encoding="utf-8")
    true = {s: true_step_s(world, s) for s in slugs}
    oom = {s for s in slugs if predicted[s][1] > oom_gib}
    fine = sorted((t, s) for s, t in true.items() if s not in oom)
    return {"pool": slugs, "true_s": true, "oom": oom, "best": fine[0][1],
            "gap": fine[1][0] / fine[0][0] - 1, "predicted": predicted}


def measure_template(world: Path, extra: str = "") -> str:
    """A `--measure` template running the fake launcher with the layout's own flags."""
    return (f"{shlex.quote(sys.executable)} {shlex.quote(LAUNCHER)} --world "
            f"{shlex.quote(str(world))} --layout {{layout}} --tp {{tp}} "
            f"--pp {{pp}} --vp {{vp}} --cp {{cp}} --zero {{zero}} {extra}").strip()


def wait_for_file(path: Path, timeout_s: float = 120.0) -> None:
    """Block until `path` exists (written whole by a rename), or fail after `timeout_s`: the
    test waits on the file itself, however long the writer takes (no fixed delay)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout_s:g} s")
        time.sleep(0.02)


def wait_gone(pid: int, timeout_s: float = 60.0) -> bool:
    """Block until process `pid` has exited (a zombie counts: it runs no more); False after
    `timeout_s`. Waits on a pidfd (Linux >= 5.3), which becomes readable when the process ends;
    elsewhere polls /proc."""
    import os
    import select
    import time

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            return bool(select.select([fd], [], [], timeout_s)[0])
        finally:
            os.close(fd)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.02)
    return False
