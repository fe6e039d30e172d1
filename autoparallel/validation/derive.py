"""The job a measured-run row describes, beyond the model: GPU preset, precision check, ZeRO
stage, parallel layout, gradient dtype, attention kernel, recompute. Each function either
returns what the row says (or allows to derive, recording the assumption) or raises `RowSkip`
with the counted reason. The rules are listed in `runs`' module docstring."""

from __future__ import annotations

import re

from .modelspec import RowSkip, _int, _num


def gpu_preset(text: str) -> str:
    """Preset name for the `gpu` column, or raise `RowSkip` (unknown GPU / power-capped variant)."""
    t = text.lower()
    if re.search(r"gb300|b300", t):
        raise RowSkip("unknown GPU (B300/GB300: no preset)")
    if "gb200" in t:
        return "gb200"
    if "b200" in t:
        return "b200"
    if "mi300x" in t:
        return "mi300x"
    if "h800" in t:
        return "h800"
    if "h200" in t:
        return "h200"
    if "h100" in t:
        if re.search(r"hbm2e|500\s*w|lower-tdp", t):
            raise RowSkip("unknown GPU (H100 HBM2e 500 W variant: no preset)")
        return "h100"
    if "a100" in t:
        m = re.search(r"(\d+)\s*gb", t)
        return "a100-40gb" if m and m.group(1) == "40" else "a100-80gb"
    raise RowSkip("unknown GPU" + (f" ({text.split()[0]})" if text.strip() else ""))


def _precision(row, allow_fp16: bool) -> None:
    p = str(row.get("precision") or "").lower()
    if re.search(r"fp8|float8|fp4|nvfp4|mxfp", p):
        raise RowSkip("precision not BF16 (FP8/FP4)")
    if "bf16" in p:
        return
    if "fp16" in p and allow_fp16:
        return
    raise RowSkip("precision not BF16" + (" (fp16)" if "fp16" in p else ""))


def _zero(row, assumptions: list[str]) -> int:
    z = _int(row, "zero_stage")
    if z is not None:
        if z > 3:
            raise RowSkip("`zero_stage` not in 0-3")
        return z
    fsdp = str(row.get("fsdp") or "").lower()
    if "shard_grad_op" in fsdp:
        return 2
    if fsdp.startswith(("fsdp", "yes")):
        return 3
    if "yes" in str(row.get("distributed_optimizer") or "").lower():
        return 1
    if "overlap-param-gather" in str(row.get("notes") or ""):
        return 1
    assumptions.append("ZeRO stage not stated: 1 (distributed optimizer)")
    return 1


def _layout(row, n_gpus: int, gbs: int, zero: int, assumptions: list[str]) -> dict:
    tp, pp = _int(row, "tp"), _int(row, "pp")
    cp, vp, ep = (_int(row, c) or 1 for c in ("cp", "vpp", "ep"))
    dp = _int(row, "dp")
    if tp is None or pp is None:
        if zero == 3 and dp == n_gpus:
            tp = tp or 1
            pp = pp or 1
        else:
            raise RowSkip("incomplete layout (tp/pp not stated)")
    if min(tp, pp, cp, vp, ep) < 1:
        raise RowSkip("incomplete layout (a degree is 0)")
    if dp is None:
        dp = n_gpus // (tp * pp * cp)
    if dp * tp * pp * cp != n_gpus:
        raise RowSkip("layout does not multiply to the GPU count")
    mb = _int(row, "mbs")
    ga = _int(row, "grad_accum")
    if not mb and ga and gbs % (dp * ga) == 0:
        mb = gbs // (dp * ga)
        assumptions.append("micro-batch = gbs / (dp x grad_accum)")
    if not mb:
        mb = 1
        assumptions.append("micro-batch not stated: 1")
    if _num(row, "ep") is None and str(row.get("arch_type") or "").startswith("moe"):
        raise RowSkip("incomplete layout (ep not stated for an MoE run)")
    return dict(dp=dp, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, zero=zero, micro_batch=mb)


def _grad_dtype(row, zero: int) -> str:
    """`fp32` (18 bytes/parameter: Megatron main grads, nanotron fp32 accumulation) or `bf16`
    (16 bytes/parameter) for PyTorch FSDP, whose sharded state is fp32 params (the master
    weights) 4 + fp32 grads 4 + Adam m, v 8 = 16 bytes (the ledger's 2 + 2 + 12), and for
    llm-foundry's "PURE" bf16 mode."""
    fsdp = str(row.get("fsdp") or "").lower()
    if "pure" in str(row.get("precision") or "").lower():
        return "bf16"
    if zero >= 2 and fsdp.startswith("fsdp"):
        return "bf16"
    return "fp32"


TE_STACKS = re.compile(r"megatron-core|megatron-bridge|nemo|transformer engine|\bTE\b", re.I)
HOPPER_OR_LATER = ("h100", "h200", "h800", "b200", "gb200")


def _attention(row, gpu: str) -> str:
    """The attention kernel a run's stack uses: Transformer Engine's cuDNN fused attention
    (FA3 class on Hopper and later) for Megatron-Core / NeMo / Megatron-Bridge / TE stacks,
    FlashAttention-2 class otherwise (llm-foundry, nanotron, torchtitan, Megatron-DeepSpeed)."""
    if gpu in HOPPER_OR_LATER and TE_STACKS.search(str(row.get("framework") or "")):
        return "cudnn"
    return "flash"


def _tp_comm_overlap(row) -> bool:
    """Whether the run overlapped TP collectives with GEMMs, as its notes or framework state
    (Megatron `--tp-comm-overlap`, TorchTitan async TP)."""
    text = f"{row.get('notes') or ''} {row.get('framework') or ''}".lower()
    return "tp-comm-overlap" in text or "async tp" in text or "asynctp" in text


def _recompute(row, assumptions: list[str]) -> str | None:
    r = str(row.get("recompute") or "").strip().lower()
    for word in ("full", "selective", "none"):
        if r.startswith(word):
            return word
    m = re.search(r"\b(full|selective) (?:activation )?recompute", str(row.get("notes") or ""), re.I)
    if m:
        assumptions.append(f"recompute from the notes: {m.group(1).lower()}")
        return m.group(1).lower()
    return None
