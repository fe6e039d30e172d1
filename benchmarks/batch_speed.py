"""Speed of `estimate --input` (issue: >= 2,000 rows/s beyond start-up on a 240-row mixed table).

Table: 240 rows, 60 layouts each of llama3-8b on 8 H100, llama3-70b and mixtral-8x7b on 64, and
llama3-405b on 1,024 (seq 4096, global batch 512), drawn with a fixed seed over TP, PP, EP, ZeRO,
recompute and micro-batch; some rows are rejected by the rules (their `error` is filled, as a
user's what-if table has them). Prints rows scored per second by `batch.score_frame` (the
in-process part of `estimate --input`; start-up is `autoparallel --help`'s), best of 5.
Run: python benchmarks/batch_speed.py [--rows-out FILE]  (FILE: the table, to time the command)
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import pandas as pd  # noqa: E402

from autoparallel.batch import score_frame  # noqa: E402

MODELS = (("llama3-8b", 8), ("llama3-70b", 64), ("mixtral-8x7b", 64), ("llama3-405b", 1024))


def mixed_table(per_model: int = 60, seed: int = 0) -> pd.DataFrame:
    """The benchmark's what-if table (strings, as `read_layouts_csv` reads a CSV)."""
    rng = random.Random(seed)
    rows = []
    for model, n in MODELS:
        for _ in range(per_model):
            tp, pp = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4, 8])
            ep = rng.choice([1, 2, 4, 8]) if model.startswith("mixtral") else 1
            rows.append({"model": model, "gpu": "h100", "n_gpus": n, "gpus_per_node": 8,
                         "seq_len": 4096, "global_batch": 512, "dp": "", "tp": tp, "pp": pp,
                         "vp": 1, "cp": 1, "ep": ep, "zero": rng.choice([0, 1, 2, 3]),
                         "recompute": rng.choice(["none", "selective", "full"]), "sp": "",
                         "micro_batch": rng.choice([1, 2])})
    return pd.DataFrame(rows).astype(str)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-out", help="also write the table as CSV here")
    args = ap.parse_args()
    frame = mixed_table()
    if args.rows_out:
        frame.to_csv(args.rows_out, index=False)
    score_frame(frame)  # warm: presets and spec classes
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        out = score_frame(frame)
        times.append(time.perf_counter() - t0)
    bad = int((out["error"] != "").sum())
    print(f"rows: {len(frame)} ({bad} rejected with a reason), problems: {len(MODELS)}")
    print(f"score_frame: {len(frame) / min(times):,.0f} rows/s ({min(times) * 1e3:.1f} ms, best of 5)")


if __name__ == "__main__":
    main()
