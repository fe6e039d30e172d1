"""Leave-one-source-out validation of the time model on the shared measured runs.

For every GPU group with runs (H100; A100 40GB + 80GB; ...) and every source, fit the default
knobs to the other sources' runs and predict the held-out source. Prints the error table per
GPU group and source, overall, the H100 + A100 target figures, the worst rows, and the knobs each
fold found. Benchmarks print figures; nothing here is asserted.

    python benchmarks/validate.py [--runs FILE] [--gpus h100,a100-80gb,a100-40gb] [--output loso.csv]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel.data import PUBLISHED_RUNS  # noqa: E402
from autoparallel.validation.loso import loso_predictions  # noqa: E402
from autoparallel.validation.report import predict, summary, worst  # noqa: E402
from autoparallel.validation.runs import load_cases, read_runs  # noqa: E402



BLACKWELL = ("b200", "b300", "gb200", "gb300")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(PUBLISHED_RUNS), help="runs CSV (default: the shipped one)")
    ap.add_argument("--gpus", default="h100,h100-96gb,h200,h800,a100-80gb,a100-40gb,b200,b300,"
                    "gb200,gb300",
                    help="GPU presets whose runs are validated")
    ap.add_argument("--output", default=None, help="write the held-out predictions to this CSV")
    args = ap.parse_args()
    pd.set_option("display.width", 220)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.max_colwidth", 60)

    t0 = time.time()
    cases, skipped = load_cases(read_runs(args.runs))
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    held, fitted = loso_predictions(cases, gpus)
    print(f"{len(cases)} usable runs ({len(skipped)} rows skipped); LOSO over {', '.join(gpus)}; "
          f"{time.time() - t0:.0f} s\n")
    fmt = {"median_abs_err": "{:.1%}", "p90_abs_err": "{:.1%}", "bias": "{:+.1%}",
           "mem_median_abs_err": "{:.1%}", "mem_bias": "{:+.1%}"}

    def show(frame: pd.DataFrame, title: str, by: str = "source") -> None:
        s = summary(frame, by=by).drop(columns=["skipped"])
        for k, f in fmt.items():
            s[k] = s[k].map(lambda v, f=f: "-" if pd.isna(v) else f.format(v))
        print(title)
        print(s.to_string(index=False), "\n")

    held["group"] = held["gpu"].map(lambda g: "a100" if g.startswith("a100") else g)
    for grp, frame in held.groupby("group"):
        show(frame, f"== {grp}: leave-one-source-out step-time error per source")
    show(held, "== all groups, by GPU", by="group")
    held["group_arch"] = held["group"] + " " + held["arch"]
    show(held, "== all groups, by GPU and architecture (dense / MoE)", by="group_arch")
    blackwell = held["gpu"].isin(BLACKWELL) & (held["arch"] == "dense")
    show(held[blackwell], "== dense Blackwell runs (B200, B300, GB200, GB300), held out",
         by="group")
    shipped = predict(cases)
    shipped["group_arch"] = shipped["gpu"] + " " + shipped["arch"]
    show(shipped, "== in sample (the shipped profiles), by GPU and architecture", by="group_arch")
    blackwell = shipped["gpu"].isin(BLACKWELL) & (shipped["arch"] == "dense")
    show(shipped[blackwell], "== dense Blackwell runs, in sample", by="gpu")
    show(held, "== all groups, by stack", by="stack")
    show(held, "== all groups, by precision", by="precision")
    show(held, "== how each held-out prediction was made (stack fit / GPU fit / reference)",
         by="heldout_fit")
    print("== worst ten held-out rows")
    print(worst(held, 10).to_string(index=False), "\n")
    print("== knobs fitted per held-out source (fit on the others)")
    print(pd.DataFrame(fitted).T.round(4).to_string(), "\n")
    if args.output:
        held.to_csv(args.output, index=False)
        print(f"held-out predictions -> {args.output}")


if __name__ == "__main__":
    main()
