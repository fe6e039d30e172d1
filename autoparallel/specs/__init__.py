"""User-facing specifications (pydantic v2, frozen, unknown keys rejected)."""

from .hardware import ClusterSpec, GPUSpec, Profile
from .layout import Layout, Recompute
from .model import MLASpec, ModelSpec, MoESpec
from .problem import Problem
from .training import TrainingSpec

__all__ = [
    "ClusterSpec", "GPUSpec", "Layout", "MLASpec", "ModelSpec", "MoESpec", "Problem", "Profile",
    "Recompute", "TrainingSpec",
]
