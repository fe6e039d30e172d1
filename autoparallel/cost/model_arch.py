"""The `Arch` of any model: a transformer's from its shapes (`cost.arch`), a hybrid model's from
its pattern of layer types (`cost.layer_types`). The one entry point the rest of the package
builds an `Arch` through, so that neither of the two imports the other's upper layer."""

from __future__ import annotations

from ..specs.model import ModelSpec
from .arch import Arch, transformer_arch
from .layer_types import build_hybrid_arch


def build_arch(model: ModelSpec) -> Arch:
    """Derive the `Arch` numbers of a model."""
    if model.layers is not None:  # a pattern of layer types (Nemotron-H, Qwen3-Next, ...)
        return build_hybrid_arch(model)
    return transformer_arch(model)
