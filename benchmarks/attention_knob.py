"""Does the H100 attention efficiency that NeMo's long-sequence table identifies hold for the
other H100 runs? (issue: long context, "dense predictions without CP unchanged")

The Megatron stacks' H100 profile fits `cudnn_attention_efficiency` on every H100 source; only
NeMo's 4K-1M Llama-2-7B table (`nemo_longseq_h100`, context parallel) has enough attention time
to identify it. This prints the in-sample step-time error of the H100 Megatron-Core /
Megatron-Bridge runs under the shipped profile and under the same profile with the knob at the
GPU preset's prior (every other knob as shipped), per source and for the runs without context
parallelism. Benchmarks print figures; nothing here is asserted.

    python benchmarks/attention_knob.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel.data import PUBLISHED_RUNS  # noqa: E402
from autoparallel.presets import load_gpu, load_stack  # noqa: E402
from autoparallel.problem import stack_profile  # noqa: E402
from autoparallel.validation.report import predict  # noqa: E402
from autoparallel.validation.runs import load_cases, read_runs  # noqa: E402

STACKS = ("megatron-core", "megatron-bridge")
KNOB = "cudnn_attention_efficiency"


def main() -> None:
    cases, _ = load_cases(read_runs(PUBLISHED_RUNS))
    cases = [c for c in cases if c.gpu == "h100" and c.stack in STACKS]
    gpu = load_gpu("h100")
    prior = getattr(gpu.default_profile(), KNOB)
    shipped, moved = {}, {}
    for s in STACKS:
        prof, _ = stack_profile(load_stack(s), gpu)
        shipped[s] = getattr(prof, KNOB)
        moved[(s, "h100")] = prof.model_copy(update={KNOB: prior})
    fit = predict(cases)
    alt = predict(cases, moved)
    m = fit[["row_id", "source", "layout", "step_err"]].merge(
        alt[["row_id", "step_err"]], on="row_id", suffixes=("_shipped", "_prior"))
    m["cp1"] = ~m["layout"].str.contains(r"-cp(?:[2-9]|\d\d)", regex=True)
    print(f"H100 {KNOB}: shipped {', '.join(f'{s} {v:.3f}' for s, v in shipped.items())}; "
          f"prior (GPU preset) {prior:.3f}; {len(m)} H100 runs of these stacks\n")

    def line(name: str, g: pd.DataFrame) -> dict:
        return {"runs": name, "n": len(g),
                "median |err| shipped": f"{g.step_err_shipped.abs().median():.1%}",
                "median |err| prior": f"{g.step_err_prior.abs().median():.1%}",
                "bias shipped": f"{g.step_err_shipped.median():+.1%}",
                "bias prior": f"{g.step_err_prior.median():+.1%}"}

    rows = [line(src, g) for src, g in m.groupby("source")]
    others = m[(m.source != "nemo_longseq_h100") & m.cp1]
    rows.append(line("other sources, cp = 1", others))
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
