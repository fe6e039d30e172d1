"""Where a fit's attention knobs start: the kernel benchmarks' efficiency times what training
keeps of it, measured across the sources whose runs pin attention.

The GPU presets' reference (literature) attention efficiencies are kernel benchmarks: a forward
pass of FlashAttention-2 or cuDNN / FlashAttention-3 alone (reference §7.3: FA2 forward 33 % of
H100 peak, 58 % of A100's; cuDNN / FA3 60-75 % of H100's). Inside a training step the model
prices the backward at the same efficiency (`cost.compute.ATTN_BWD`), and the backward kernels
reach less than the forward (FlashAttention-3 paper, arXiv 2407.08608: H100 BF16 forward up to
740 TFLOP/s, backward 1.5-1.75x FA2's, about 450-550), so the efficiency a training run shows
is well below the forward benchmark. Only runs with long sequences pin it (attention is a few
per cent of a 4K-token step); three (source, GPU, kernel) cells of the shipped runs do, each in
its own stack's profile, fitted in sample (+- the standard error from the runs alone):

| source | GPU | kernel | fitted | kernel reference | kept |
|---|---|---|---|---|---|
| llmfoundry_mpt (16K-64K tokens, FSDP) | H100 | FlashAttention-2 | 0.1791 +- 0.0042 | 0.33 | 0.543 |
| llmfoundry_mpt (16K-64K tokens, FSDP) | A100 | FlashAttention-2 | 0.3146 +- 0.0032 | 0.50 | 0.629 |
| nemo_longseq_h100 (16K-1M tokens, CP) | H100 | cuDNN fused | 0.3360 +- 0.014 | 0.60 | 0.560 |

(`presets/stacks/fsdp.toml` and `megatron-bridge.toml`, `[profile."h100"]` / `"a100-*"`, as
`benchmarks/calibrate_stacks.py --write` fits them from these priors: the identified values move
under 2 % with the prior, so the cells are a fixed point; the kernel references are
`presets/gpus/*.toml` `[reference_profile]`.) Three stacks, two GPUs and
two kernels keep 54-63 % of the forward benchmark. Their geometric mean, `KEPT`, scales both
attention knobs of the reference profile every fit starts from and is pulled towards
(`derated`): a GPU or stack without long-sequence runs then prices attention at what training
shows rather than at the forward benchmark (before, Megatron-Bridge on B200/GB200 kept 0.59,
its cuDNN reference, and a long-context plan there priced attention 1.7x too fast).

Leave-one-source-out folds take `KEPT` without the held-out source's cells (`kept(exclude)`),
so a held-out long-sequence source is predicted from the others' measurement only. A GPU
preset's own profile, the fallback of a stack with no fit anywhere (`problem.stack_profile`),
takes `KEPT` on each attention knob it leaves at the literature value (`preset_profile`).
"""

from __future__ import annotations

import math

from .specs.hardware import GPUSpec, Profile

CELLS: tuple[tuple[str, str, float, float], ...] = (
    ("llmfoundry_mpt", "h100", 0.1791, 0.33),
    ("llmfoundry_mpt", "a100", 0.3146, 0.50),
    ("nemo_longseq_h100", "h100", 0.3360, 0.60),
)
"""(source, GPU, fitted attention efficiency in training, the kernel's forward benchmark): the
cells of the shipped runs that pin attention (module docstring)."""
KNOBS = ("attention_efficiency", "cudnn_attention_efficiency")
"""The reference profile's attention knobs `derated` scales."""


def kept(exclude: str | None = None) -> float:
    """Geometric mean of fitted / benchmark over `CELLS`, less the cells of source `exclude`."""
    ratios = [fitted / bench for source, _, fitted, bench in CELLS if source != exclude]
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


KEPT = kept()
"""What training keeps of the attention kernels' forward benchmark, across every cell: 0.576."""


def derated(reference: Profile, exclude: str | None = None) -> Profile:
    """`reference` (a GPU's literature profile) with both attention knobs times `kept(exclude)`:
    the start point and prior centre of a fit (`calibrate.fit`)."""
    k = kept(exclude)
    return reference.model_copy(update={name: getattr(reference, name) * k for name in KNOBS})


def preset_profile(gpu: GPUSpec) -> Profile:
    """The GPU preset's profile with each attention knob it leaves at its literature value (equal
    to `reference()`'s: not calibrated) times `KEPT`; knobs fitted on runs are kept as fitted."""
    prof, ref = gpu.default_profile(), gpu.reference()
    update = {name: getattr(prof, name) * KEPT for name in KNOBS
              if getattr(prof, name) == getattr(ref, name)}
    return prof.model_copy(update=update)
