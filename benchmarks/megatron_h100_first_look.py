"""First look (issue: estimate): predicted vs measured MFU on the nine Megatron-LM H100 weak-scaling
rows (shared/data/published_runs.csv, source `megatron_readme_2024`, GT0061-GT0069).

The rows give model shape, TP/PP/DP, GPUs, global batch and MFU, not the micro-batch or the
recompute setting: assumed here micro-batch 1, no recompute, SP on with TP, distributed optimizer
(ZeRO-1), no interleaving, fp32 gradients (Megatron's default), Transformer Engine's cuDNN
attention (`attention="cudnn"`), TP communication overlapped (the rows state `--tp-comm-overlap`). The README's MFU uses Megatron's FLOP count, the same convention
as ours, so the two are comparable.
Run: python benchmarks/megatron_h100_first_look.py [--profile FILE] [--reference]
(--reference: the H100 preset's literature profile, i.e. before calibration)
"""

from __future__ import annotations

import csv
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from autoparallel import Layout, ModelSpec, estimate, make_problem  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "published_runs.csv")


def main(profile: str | None = None) -> None:
    rows = [r for r in csv.DictReader(open(DATA)) if r["source_key"] == "megatron_readme_2024"
            and r["tp"] and r["pp"]]
    print(f"{'row':7} {'model':8} {'GPUs':>5} {'TPxPPxDP':>9} {'measured':>9} {'predicted':>9} {'error':>7}  largest time items")
    errs = []
    for r in rows:
        m = ModelSpec(name=r["model"].split()[0], n_layers=int(r["layers"]), hidden_size=int(r["hidden"]),
                      n_heads=int(r["heads"]), ffn_hidden_size=int(r["ffn_hidden"]),
                      vocab_size=int(r["vocab"]), activation="gelu")
        p = make_problem(m, "h100", int(r["num_gpus"]), int(r["seq_len"]), int(r["gbs"]),
                         grad_dtype="fp32", profile=profile, attention="cudnn",
                         tp_comm_overlap=True)
        rec = estimate(p, Layout(tp=int(r["tp"]), pp=int(r["pp"]), zero=1, micro_batch=1))
        mfu = rec["mfu"] * 100
        meas = float(r["mfu_pct"])
        errs.append(mfu / meas - 1)
        ts = rec["time_s"]
        top = sorted(((k, v) for k, v in ts.items() if k != "step"), key=lambda kv: -kv[1])[:3]
        items = ", ".join(f"{k} {v / ts['step']:.0%}" for k, v in top)
        shape = f"{r['tp']}x{r['pp']}x{r['dp']}"
        print(f"{r['row_id']:7} {r['model'].split()[0][4:]:8} {r['num_gpus']:>5} {shape:>9} "
              f"{meas:>8.0f}% {mfu:>8.1f}% {mfu / meas - 1:>+7.1%}  {items}")
    abs_errs = [abs(e) for e in errs]
    print(f"median |error| {statistics.median(abs_errs):.1%}, max {max(abs_errs):.1%}, "
          f"mean signed {statistics.mean(errs):+.1%}")


if __name__ == "__main__":
    if "--reference" in sys.argv:
        from autoparallel import load_gpu

        main(load_gpu("h100").reference())
    else:
        main(sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else None)
