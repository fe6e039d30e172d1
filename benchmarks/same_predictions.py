"""Are the cost model's predictions unchanged? A check for work on the model's speed.

`--save FILE` writes the predictions of: every shipped measured run (published_runs.csv and
memory_runs.csv, shipped profiles: step time, every time item, memory figures), every
enumerated layout of a few problems (all time and memory ledger arrays, reject flags), and the
top 10 of `plan` on them. `--check FILE` recomputes them and prints the largest relative
difference per group and whether each plan's top 10 is the same; exit 1 beyond `--rtol`.

    python benchmarks/same_predictions.py --save /tmp/before.npz
    ... change the code ...
    python benchmarks/same_predictions.py --check /tmp/before.npz [--rtol 1e-9]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel import evaluate, make_problem  # noqa: E402
from autoparallel.data import MEMORY_RUNS, PUBLISHED_RUNS  # noqa: E402
from autoparallel.search.enumerate import enumerate_layouts  # noqa: E402
from autoparallel.search.plan import plan  # noqa: E402
from autoparallel.validation.report import predict  # noqa: E402
from autoparallel.validation.runs import load_cases, read_runs  # noqa: E402

PROBLEMS = {
    "405b-16384": ("llama3-405b", "h100", 16384, 8192, 2048),
    "dsv3-1024": ("deepseek-v3", "h100", 1024, 4096, 2048),
    "8b-8": ("llama3-8b", "h100", 8, 4096, 64),
    "mixtral-64": ("mixtral-8x7b", "h100", 64, 4096, 512),
}


def collect() -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for tag, path in (("runs", PUBLISHED_RUNS), ("memruns", MEMORY_RUNS)):
        cases, _ = load_cases(read_runs(path))
        pred = predict(cases)
        for col in pred.columns:
            if col.startswith("time_") or col.startswith("predicted_"):
                out[f"{tag}/{col}"] = pred[col].to_numpy(dtype=np.float64)
    for name, args in PROBLEMS.items():
        problem = make_problem(*args)
        ev = evaluate(problem, enumerate_layouts(problem))
        out[f"{name}/reject"] = ev.reject.astype(np.float64)
        for k, v in ev.memory.items():
            out[f"{name}/mem/{k}"] = np.broadcast_to(np.asarray(v, dtype=np.float64), len(ev))
        for k, v in ev.time.items():
            out[f"{name}/time/{k}"] = np.broadcast_to(np.asarray(v, dtype=np.float64), len(ev))
        res = plan(problem, top=10)
        top = res.ranked.table
        out[f"{name}/plan/slugs"] = np.array([top.row(i).slug for i in range(min(10, len(top)))])
        out[f"{name}/plan/step"] = np.asarray(res.ranked.time["step"][:10], dtype=np.float64)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save")
    g.add_argument("--check")
    ap.add_argument("--rtol", type=float, default=1e-9)
    args = ap.parse_args()
    now = collect()
    if args.save:
        np.savez_compressed(args.save, **now)
        print(f"saved {len(now)} arrays to {args.save}")
        return
    ref = dict(np.load(args.check))
    bad = sorted(set(ref) ^ set(now))
    worst: dict[str, float] = {}
    for k in sorted(set(ref) & set(now)):
        a, b = ref[k], now[k]
        if a.dtype.kind in "US":
            if a.shape != b.shape or not np.array_equal(a, b):
                bad.append(k)
            continue
        if a.shape != b.shape:
            bad.append(k)
            continue
        same_inf = (a == b) | (np.isnan(a) & np.isnan(b))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(same_inf, 0.0, np.abs(a - b) / np.maximum(np.abs(a), 1e-300))
        r = float(np.max(rel)) if rel.size else 0.0
        group = k.split("/")[0]
        worst[group] = max(worst.get(group, 0.0), r)
        if r > args.rtol:
            bad.append(f"{k} (max rel {r:.2e})")
    for group, r in worst.items():
        print(f"{group:>12}: max relative difference {r:.2e}")
    if bad:
        print("DIFFERENT:", *bad, sep="\n  ")
        sys.exit(1)
    print(f"same predictions ({len(now)} arrays, rtol {args.rtol:g})")


if __name__ == "__main__":
    main()
