"""How many measurements `tune` needs to find the true best layout, per sampler scheme.

    python benchmarks/tune_sampler.py [--worlds 20] [--seeds 3] [--candidates 40]

Each hidden world is the cost model's prediction times a random effect per axis value (30% of
the values present in the pool get an effect ~ lognormal(0, 4%)), with the fake launcher's
memory budget (OOM above 70 GiB predicted) and 0.2% noise; measurements are simulated in
process (the same numbers `tests/fake_launcher.py` would print). For every scheme it reports,
over worlds x seeds (deterministic schemes, `none` and `predicted`, once per world), the
number of trials until the true best was measured: mean, median, 90th
percentile, worst. Schemes: `tpe`, `random`, `none` (tune's sampler choices, all using the
learned score of `pool.py`), and baselines without the learned score: `tpe-snap` (TPE proposal
snapped to the nearest pool layout, predicted-time tie-breaks), `random-snap`, `predicted`
(measure in predicted order).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import autoparallel.tune.loop as loop  # noqa: E402
import autoparallel.tune.pool as pool  # noqa: E402
from autoparallel import make_problem  # noqa: E402
from autoparallel.tune import TuneConfig, tune  # noqa: E402
from autoparallel.tune.command import CommandTemplate  # noqa: E402
from autoparallel.tune.runner import Outcome  # noqa: E402
from fake_launcher import true_step_s  # noqa: E402
from tuneworld import PROBLEM_ARGS, make_world  # noqa: E402

SCHEMES = {  # name: (sampler, learned score, proposal penalty per differing axis)
    "tpe": ("tpe", True, pool.PROPOSAL_PENALTY),
    "random": ("random", True, pool.PROPOSAL_PENALTY),
    "none": ("none", True, 0.0),
    "tpe-snap": ("tpe", False, 100.0),
    "random-snap": ("random", False, 100.0),
    "predicted": ("none", False, 0.0),
}


def random_worlds(slugs: list[str], n: int) -> list[dict]:
    values: dict[str, set] = {}
    for s in slugs:
        for part in s.split("-"):
            m = re.fullmatch(r"([a-z]+?)(\d+)", part)
            axis, value = (m[1], m[2]) if m else ("flag", part)
            values.setdefault(axis, set()).add(value)
    worlds = []
    for w in range(n):
        rng = random.Random(100 + w)
        dist: dict = {}
        for axis, vs in sorted(values.items()):
            for v in sorted(vs):
                if rng.random() < 0.3:
                    dist.setdefault(axis, {})[v] = math.exp(rng.gauss(0, 0.04))
        worlds.append(dist)
    return worlds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--candidates", type=int, default=40)
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tune-bench-"))
    state: dict = {}

    def simulated(argv, *, timeout_s, metric, log_path, env=None, cwd=None, kill_grace_s=5.0,
                  stop=None):
        world = state["world"]
        slug = argv[argv.index("--layout") + 1]
        if world["predicted"][slug][1] > world["oom_gib"]:
            return Outcome(None, "oom", "out of memory", 1, 0.0, log_path)
        rng = random.Random(zlib.crc32(f"{world['seed']}:{slug}".encode()))
        step = true_step_s(world, slug) * (1 + world["noise"] * rng.gauss(0, 1))
        return Outcome(step, None, "ok", 0, 0.0, log_path)

    loop.run_measurement = simulated
    learned = pool.CandidatePool.optimistic_s
    problem = make_problem(*PROBLEM_ARGS)
    template = CommandTemplate.parse("launcher --layout {layout}")
    n = args.candidates
    base = make_world(tmp / "w.json", n)
    worlds = random_worlds(base["pool"], args.worlds)
    print(f"{len(worlds)} worlds x {args.seeds} seeds, {n} candidates; trials until the true "
          "best is measured")
    for name in args.schemes.split(","):
        sampler, use_learned, penalty = SCHEMES[name]
        pool.PROPOSAL_PENALTY = penalty
        pool.CandidatePool.optimistic_s = learned if use_learned else (
            lambda self, measured: {c.slug: c.predicted_s for c in self.candidates})
        found = []
        for dist in worlds:
            truth = make_world(tmp / "w.json", n, distortion=dist)
            state["world"] = json.loads((tmp / "w.json").read_text())
            for seed in range(args.seeds if sampler != "none" else 1):
                cfg = TuneConfig(problem, template, trials=n, sampler=sampler, seed=seed,
                                 seeds=3, workdir=tmp / "wd")
                rows = sorted(tune(cfg, candidates=n).rows, key=lambda r: r.number)
                found.append([r.layout for r in rows].index(truth["best"]) + 1)
        found.sort()
        print(f"{name:12s} mean {statistics.mean(found):5.1f}  median {statistics.median(found):5.1f}"
              f"  p90 {found[max(0, int(0.9 * len(found)) - 1)]:3d}  worst {found[-1]:3d}")


if __name__ == "__main__":
    main()
