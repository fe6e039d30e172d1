"""`Problem`: what is trained, on what, and how (model + cluster + job + efficiency profile)."""

from __future__ import annotations

from ._base import Spec
from .hardware import ClusterSpec, Profile
from .model import ModelSpec
from .training import TrainingSpec


class Problem(Spec):
    """Everything the cost model needs except the layout."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    profile: Profile
    """Efficiency knobs (the GPU preset's defaults unless a profile file is given)."""

    def describe(self) -> dict:
        """Flat summary used in outputs."""
        return {
            "model": self.model.name,
            "gpu": self.cluster.gpu.name,
            "n_gpus": self.cluster.n_gpus,
            "gpus_per_node": self.cluster.gpus_per_node,
            "seq_len": self.training.seq_len,
            "global_batch": self.training.global_batch,
        }
