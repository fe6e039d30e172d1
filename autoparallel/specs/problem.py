"""`Problem`: what is trained, on what, and how (model + cluster + job + stack + efficiency profile)."""

from __future__ import annotations

from ._base import Spec
from .hardware import ClusterSpec, Profile
from .job import JOB_FIELDS, JobSpec
from .model import ModelSpec
from .stack import StackSpec
from .training import TrainingSpec


class Problem(Spec):
    """Everything the cost model needs except the layout."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    profile: Profile
    """Efficiency knobs: the GPU preset's, then the stack's for this GPU, then a profile file."""
    stack: StackSpec
    """The software stack (defaults and low-precision behaviour)."""
    job: JobSpec
    """The job settings with the stack's defaults filled in (what the cost model used)."""
    profile_basis: str = ""
    """Where the efficiency profile comes from (which stack fit, which GPU, which file)."""

    def describe(self) -> dict:
        """Flat summary used in outputs: the problem's numbers, then every job setting."""
        out = {
            "model": self.model.name,
            "gpu": self.cluster.gpu.name,
            "n_gpus": self.cluster.n_gpus,
            "gpus_per_node": self.cluster.gpus_per_node,
            "seq_len": self.training.seq_len,
            "global_batch": self.training.global_batch,
        }
        return out | self.job_settings()

    def job_settings(self) -> dict:
        """Every job setting (JobSpec fields) as used, in declaration order."""
        return {k: getattr(self.job, k) for k in JOB_FIELDS}
