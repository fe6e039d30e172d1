"""Numeric precision of the training job: which GEMMs run at which tensor-core peak, and what a
low-precision recipe stores and moves.

Names and meaning (each a recipe that real stacks ship):

- `bf16`: BF16 mixed precision (fp32 master weights and optimizer state; BF16 GEMMs).
- `fp16`: FP16 mixed precision with loss scaling (same tensor-core peak as BF16 on every preset).
- `fp8`: FP8 with one scale per tensor: Transformer Engine `DelayedScaling` (scale from an amax
  history) or `Float8CurrentScaling` (amax of the tensor itself, one extra read), torchao float8
  tensorwise/rowwise in TorchTitan. E4M3 forward, E5M2 or E4M3 gradients (TE `Format.HYBRID`).
  Needs FP8 tensor cores (Hopper, Ada, Blackwell, CDNA3).
- `fp8-blockwise`: DeepSeek-V3's recipe (arXiv 2412.19437 Sec. 3.3): 1x128 tiles for activations,
  128x128 blocks for weights, one fp32 scale each; TE `Float8BlockScaling`. FP8 tensor cores.
- `mxfp8`: OCP Microscaling MXFP8 (OCP MX spec v1.0): FP8 elements in blocks of 32 sharing one
  E8M0 (1-byte) scale; TE `MXFP8BlockScaling`. Needs hardware block scaling (Blackwell).
- `nvfp4`: NVIDIA NVFP4 (NVIDIA NVFP4 pretraining report, arXiv 2509.25149): FP4 E2M1 elements in
  blocks of 16 with an FP8 E4M3 scale, plus a per-tensor fp32 scale; weight-gradient inputs pass a
  16x16 random Hadamard transform. Needs FP4 tensor cores (Blackwell).

In every recipe the transformer blocks' linear layers (QKV, output projection, MLP, experts) run
in low precision; attention, the router, norms and the output layer (LM head) stay in BF16 (TE
and torchao quantise only `Linear` modules; Megatron keeps the LM head outside TE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PrecisionName = Literal["bf16", "fp16", "fp8", "fp8-blockwise", "mxfp8", "nvfp4"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "fp8-blockwise", "mxfp8", "nvfp4")


@dataclass(frozen=True)
class PrecisionRecipe:
    """What one precision means for the cost model."""

    name: str
    peak: str
    """Which GPU peak the linear GEMMs run at: `bf16`, `fp8` or `fp4`."""
    element_bytes: float
    """Bytes per quantised element including its block scales: fp8 1 (+4/128 for 1x128 fp32
    tiles, +1/32 for MX E8M0 blocks), nvfp4 0.5 + 1/16 (one E4M3 scale per 16)."""
    amax_pass: bool
    """Whether quantising a tensor first reads it once for its amax (per-tensor current scaling;
    delayed scaling takes the amax from history, block formats compute it inside the cast)."""
    hadamard: bool = False
    """Whether weight-gradient inputs pass a random Hadamard transform (NVFP4 recipe)."""
    needs: str = ""
    """Hardware it needs, for the error message."""
    source: str = ""

    @property
    def low(self) -> bool:
        """Whether the linear layers run below 16 bits."""
        return self.peak != "bf16"


RECIPES: dict[str, PrecisionRecipe] = {
    "bf16": PrecisionRecipe("bf16", "bf16", 2.0, False, source="BF16 mixed precision",
                            needs="BF16 tensor cores (Ampere or later; use --precision fp16)"),
    "fp16": PrecisionRecipe("fp16", "bf16", 2.0, False,
                            source="FP16 mixed precision; FP16 = BF16 tensor-core peak on every preset"),
    "fp8": PrecisionRecipe("fp8", "fp8", 1.0, True, needs="FP8 tensor cores (Hopper or later, CDNA3)",
                           source="TE DelayedScaling / Float8CurrentScaling; torchao float8"),
    "fp8-blockwise": PrecisionRecipe("fp8-blockwise", "fp8", 1.0 + 4.0 / 128, False,
                                     needs="FP8 tensor cores (Hopper or later)",
                                     source="DeepSeek-V3 report Sec. 3.3; TE Float8BlockScaling"),
    "mxfp8": PrecisionRecipe("mxfp8", "fp8", 1.0 + 1.0 / 32, False,
                             needs="hardware MX block scaling (Blackwell)",
                             source="OCP MX spec v1.0; TE MXFP8BlockScaling"),
    "nvfp4": PrecisionRecipe("nvfp4", "fp4", 0.5 + 1.0 / 16, False, hadamard=True,
                             needs="FP4 tensor cores (Blackwell)",
                             source="arXiv 2509.25149; TE NVFP4BlockScaling"),
}


def recipe(name: str) -> PrecisionRecipe:
    """The recipe of a precision name (validated by the job spec before it gets here)."""
    return RECIPES[name]


def supported(gpu, name: str) -> bool:
    """Whether `gpu` (a `GPUSpec`) can run precision `name`."""
    r = RECIPES[name]
    if name == "bf16":
        return gpu.bf16
    if r.peak == "bf16":
        return True
    if name == "mxfp8":
        return gpu.block_scaling and gpu.fp8_tflops is not None
    if r.peak == "fp4":
        return gpu.fp4_tflops is not None
    return gpu.fp8_tflops is not None


def supported_names(gpu) -> list[str]:
    """The precisions `gpu` can run."""
    return [p for p in PRECISIONS if supported(gpu, p)]
