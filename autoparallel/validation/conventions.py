"""Measured step time of a run, and the FLOP conventions needed to recover it from a reported
TFLOP/s or MFU when a source gives neither a step time nor a throughput.

Sources count FLOPs differently (shared/data/README.md caveat 1; reference §2.1-2.2), so a
reported TFLOP/s is only turned back into tokens/s with *that source's own* formula; utilisation
is then recomputed from the throughput with one convention, ours (`Evaluation.model_flops_per_step`,
Megatron causal). Per-token training FLOPs of each convention, with L layers, hidden h, query
width q = a d_h, sequence s, vocab V, N parameters:

- `megatron_causal` (Megatron-LM since 8873b55, 2025-03; ours): `Arch.model_flops_per_sequence / s`.
- `megatron_noncausal` (Megatron-LM before 8873b55, Megatron-Core r0.8.0, reference §2.2): the same
  with the core-attention term doubled (no causal halving): + 3 s L a (d_qk + d_v).
- `nanotron` (huggingface/nanotron `models/llama.py::get_flops`): 3 x forward with QKV, output,
  three SwiGLU GEMMs, lm head and non-causal QK^T and PV (4 a d_h s^2 per layer): equal to
  `megatron_noncausal` for a Llama layer.
- `llmfoundry` (MosaicML, reference §2.2): 6 N + 12 L h s.
- `narayanan_eq3` (Narayanan et al. 2021, eq. 3, hardware FLOPs incl. full recompute):
  96 L h^2 (1 + s/(6h) + V/(16 L h)).
"""

from __future__ import annotations

import re

from ..cost.arch import Arch

TFLOPS = 1e12

SOURCE_CONVENTIONS = {
    "megatron_readme_2024": "megatron_noncausal",  # Megatron-Core r0.8.0 (2024)
    "nanotron_playbook_2025": "nanotron",
    "llmfoundry_mpt": "llmfoundry",
    "narayanan2021_t1": "narayanan_eq3",
    "narayanan2021_t2": "narayanan_eq3",
    "megatron_readme_2021jan": "narayanan_eq3",
    # NeMo 24.03.01 long-sequence table (TFLOP/s only): NeMo's performance tables of that era
    # count non-causal attention; the nearest release with both figures, NeMo 24.07
    # (`nemo_perf_2407`, six dense rows), reproduces its TFLOP/s from its tokens/s to 0.1 % with
    # this convention and is 2-11 % off with the causal one (docs/validation.md "Long context")
    "nemo_longseq_h100": "megatron_noncausal",
}
"""Which convention each source of shared/data/published_runs.csv uses (its README, §Sources)."""

MFU_PEAK_TFLOPS = {"nanotron_playbook_2025": 989.0}
"""Peak a source's MFU is relative to, where the row gives MFU only (H100 SXM dense BF16,
shared/data/README.md caveat 2)."""


def convention_of(row) -> str | None:
    """The FLOP convention of a row's TFLOP/s / MFU, from its source or its definition text."""
    key = str(row.get("source_key") or "")
    if key in SOURCE_CONVENTIONS:
        return SOURCE_CONVENTIONS[key]
    text = str(row.get("tflops_definition") or "").lower()
    if re.search(r"eq\.?\s*\(?3\)?|96\s*\*\s*b", text):
        return "narayanan_eq3"
    if "non-causal" in text or "noncausal" in text:
        return "megatron_noncausal"
    if "causal" in text:
        return "megatron_causal"
    return None


def flops_per_token(convention: str, arch: Arch, seq_len: int) -> float:
    """Training FLOPs per token under `convention` (see the module docstring)."""
    s, L, h = float(seq_len), arch.n_layers, float(arch.hidden)
    ours = arch.model_flops_per_sequence(seq_len) / s
    if convention == "megatron_causal":
        return ours
    if convention in ("megatron_noncausal", "nanotron"):
        return ours + 3.0 * s * L * arch.attn_score_width
    if convention == "llmfoundry":
        return 6.0 * arch.n_params + 12.0 * L * h * s
    if convention == "narayanan_eq3":
        return 96.0 * L * h * h * (1.0 + s / (6.0 * h) + arch.vocab / (16.0 * L * h))
    raise ValueError(f"unknown FLOP convention {convention!r}")


def _value(row, col):
    v = row.get(col)
    if v is None or (isinstance(v, float) and v != v) or str(v).strip() == "":
        return None
    try:
        x = float(v)
    except ValueError:
        return "bad"
    return x if x > 0 else "bad"


def measured_step_s(row, arch: Arch, n_gpus: int, seq_len: int, global_batch: int):
    """(seconds per step, how it was obtained) or (None, reason).

    Order: `iteration_time_s`; else tokens / (`tokens_per_s_per_gpu` x GPUs); else tokens x
    FLOPs-per-token(source convention) / (`tflops_per_gpu` x GPUs); else the same from `mfu_pct`
    x the source's peak.
    """
    tokens = float(seq_len) * global_batch
    values = {c: _value(row, c) for c in
              ("iteration_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu_pct")}
    bad = [c for c, v in values.items() if v == "bad"]
    if bad:
        return None, f"non-numeric or non-positive `{bad[0]}`"
    if values["iteration_time_s"]:
        return values["iteration_time_s"], "iteration_time_s"
    if values["tokens_per_s_per_gpu"]:
        return tokens / (values["tokens_per_s_per_gpu"] * n_gpus), "tokens_per_s_per_gpu"
    conv = convention_of(row)
    tflops = values["tflops_per_gpu"]
    how = "tflops_per_gpu"
    if tflops is None and values["mfu_pct"]:
        peak = MFU_PEAK_TFLOPS.get(str(row.get("source_key") or ""))
        if peak is None:
            return None, "MFU only, peak of its convention unknown"
        tflops, how = values["mfu_pct"] / 100.0 * peak, f"mfu_pct x {peak:g}"
    if tflops is None:
        return None, "no measured step time or throughput"
    if conv is None:
        return None, "TFLOP/s convention unknown"
    step = tokens * flops_per_token(conv, arch, seq_len) / (tflops * TFLOPS * n_gpus)
    return step, f"{how} ({conv})"
