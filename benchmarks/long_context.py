"""Long context: the measured runs at 32K tokens or more, NeMo's Llama-2-7B table from 4K to 1M
tokens (CP up to 32), and the context-parallel forms a plan ranks at 1M tokens. Benchmarks print
figures; nothing here is asserted (docs/validation.md "Long context" quotes them).

    python benchmarks/long_context.py

1. The FLOP convention of NeMo's performance tables: NeMo 24.07's summary gives tokens/s and
   TFLOP/s for the same runs, so the convention that turns one into the other is read off it.
2. NeMo 24.03.01's long-sequence rows (TFLOP/s only): measured step from that convention,
   predicted with the shipped profiles (no shipped fit saw these rows), per row and median; the
   same under the causal convention for comparison; and, as a diagnostic only (not shipped), the
   cuDNN attention efficiency that alone would fit these nine rows.
3. The same table's CP speedups (TFLOP/s with CP over the best without, a ratio the convention
   cancels from) against the planner's best cp = 1 layout on the same GPUs.
4. Every used run at >= 32K tokens, in-sample error per source.
5. `plan --model llama3-8b --gpu h100 --gpus 64 --seq-len 1048576 --global-batch 64`: the fastest
   fitting layout of each context-parallel form megatron-core offers.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel import make_problem  # noqa: E402
from autoparallel.cost.model_arch import build_arch  # noqa: E402
from autoparallel.data import PUBLISHED_RUNS  # noqa: E402
from autoparallel.search.explain import cp_forms_line  # noqa: E402
from autoparallel.search.plan import plan  # noqa: E402
from autoparallel.search.space import SearchSpace  # noqa: E402
from autoparallel.validation import conventions  # noqa: E402
from autoparallel.validation.calibrate import fit  # noqa: E402
from autoparallel.validation.modelspec import RowSkip, model_from_row  # noqa: E402
from autoparallel.validation.report import predict  # noqa: E402
from autoparallel.validation.runs import load_cases, read_runs  # noqa: E402

NEMO = "nemo_longseq_h100"


def _row(r) -> dict:
    return {k: (None if v == "" else v) for k, v in r.items()}


def convention_evidence(frame: pd.DataFrame) -> None:
    print("1. NeMo 24.07 summary (nemo_perf_2407, dense): reported TFLOP/s vs tokens/s x FLOPs "
          "per token")
    for _, r in frame[frame.source_key == "nemo_perf_2407"].iterrows():
        if not r.tokens_per_s_per_gpu or not r.tflops_per_gpu:
            continue
        try:
            model, _ = model_from_row(_row(r))
        except RowSkip:  # a row without the full architecture (e.g. no vocabulary)
            continue
        arch = build_arch(model)
        if arch.n_moe_layers:
            continue
        tps, tf, s = float(r.tokens_per_s_per_gpu), float(r.tflops_per_gpu), int(r.seq_len)
        errs = {c: tps * conventions.flops_per_token(c, arch, s) / 1e12 / tf - 1
                for c in ("megatron_causal", "megatron_noncausal")}
        print(f"   {r.model:14s} seq {s:6d}: causal {errs['megatron_causal']:+.1%}, "
              f"non-causal {errs['megatron_noncausal']:+.1%}")


def nemo_rows(frame: pd.DataFrame) -> list:
    cases, skipped = load_cases(frame[frame.source_key == NEMO])
    assert not len(skipped), skipped
    return cases


def nemo_errors(frame: pd.DataFrame) -> None:
    print(f"\n2. {NEMO} (NeMo 24.03.01, H100, FP8, ring CP): predicted / measured - 1")
    shipped = conventions.SOURCE_CONVENTIONS[NEMO]
    preds = {}
    for conv in (shipped, "megatron_causal"):
        conventions.SOURCE_CONVENTIONS[NEMO] = conv
        preds[conv] = predict(nemo_rows(frame))
    conventions.SOURCE_CONVENTIONS[NEMO] = shipped
    p = preds[shipped]
    for i, r in p.iterrows():
        print(f"   {r.seq_len:8d} {r.layout:42s} measured {r.measured_step_s:6.2f} s, predicted "
              f"{r.predicted_step_s:6.2f} s: {r.step_err:+.1%} ({shipped}); "
              f"{preds['megatron_causal'].step_err[i]:+.1%} (causal); {r.top_items}")
    for conv, q in preds.items():
        a = q.step_err.abs()
        print(f"   {conv}: median |err| {a.median():.1%}, p90 {a.quantile(0.9):.1%}, bias "
              f"{q.step_err.median():+.1%}")
    cases = nemo_rows(frame)
    base = cases[0].problem().profile
    res = fit(cases, base, knobs=("cudnn_attention_efficiency",))
    err = np.expm1(res.residuals[: len(cases)])
    print(f"   diagnostic (not shipped): cudnn_attention_efficiency fitted on these 9 rows alone "
          f"{res.knobs['cudnn_attention_efficiency']:.3f} (shipped {base.cudnn_attention_efficiency:.3f}) "
          f"-> median |err| {np.median(np.abs(err)):.1%}, worst {np.max(np.abs(err)):.1%}")


def speedups(frame: pd.DataFrame) -> None:
    print("\n3. CP speedup (TFLOP/s with CP / best without; the convention cancels) vs the "
          "planner's best cp = 1 layout")
    rows = frame[frame.source_key == NEMO]
    for case, (_, row) in zip(nemo_rows(frame), rows.iterrows()):
        m = re.search(r"best no-CP config achieved ([\d.]+)", str(row.notes))
        measured = float(row.tflops_per_gpu) / float(m[1])
        with_cp = float(predict([case]).predicted_step_s[0])
        no_cp = plan(case.problem(), SearchSpace(cp=[1]), top=1, with_study=False)
        best = float(no_cp.ranked.time["step"][0]) if len(no_cp.ranked) else float("nan")
        print(f"   {case.seq_len:8d} cp {case.layout.cp:2d}: measured x{measured:.2f}, planner "
              f"x{best / with_cp:.2f} (best cp 1: {no_cp.ranked.table.row(0).resolved(case.n_gpus).slug if len(no_cp.ranked) else 'none fits'})")


def long_runs(frame: pd.DataFrame) -> None:
    print("\n4. used runs at >= 32K tokens, in-sample (shipped profiles)")
    cases, _ = load_cases(frame[frame.seq_len.astype(int) >= 32768])
    p = predict(cases)
    for src, g in p.groupby("source"):
        a = g.step_err.abs()
        print(f"   {src:22s} {len(g):3d} runs: median |err| {a.median():.1%}, p90 "
              f"{a.quantile(0.9):.1%}, bias {g.step_err.median():+.1%}")
    a = p.step_err.abs()
    print(f"   all {len(p)} runs: median |err| {a.median():.1%}, p90 {a.quantile(0.9):.1%}")


def forms_at_1m() -> None:
    print("\n5. llama3-8b on 64 x h100, seq 1048576, global batch 64 (megatron-core)")
    p = make_problem("llama3-8b", "h100", 64, seq_len=1048576, global_batch=64)
    res = plan(p, top=10, with_study=False)
    print(f"   {res.n_layouts:,} layouts, {res.n_fit:,} fit; rejected {res.reject_counts}")
    print("   " + cp_forms_line(res))
    for rec in res.records()[:3]:
        print(f"   #{rec['rank']} cp {rec['layout']['cp']} {rec['layout']['cp_comm']} "
              f"(a2a {rec['layout']['cp_a2a']}): step {rec['time_s']['step']:.1f} s, cp_comm "
              f"{rec['time_s']['cp_comm']:.2f} s, {rec['memory_gib']['total']:.1f} GiB")


def main() -> None:
    frame = read_runs(PUBLISHED_RUNS)
    convention_evidence(frame)
    nemo_errors(frame)
    speedups(frame)
    long_runs(frame)
    forms_at_1m()


if __name__ == "__main__":
    main()
