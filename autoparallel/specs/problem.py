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

    def moe_settings_changed(self) -> dict:
        """The MoE job settings (and offloaded modules) that differ from the stack's defaults,
        for an MoE model: {field: value}; empty for a dense model or the stack's defaults."""
        if self.model.moe is None:
            return {}
        st, job = self.stack, self.job
        default = {"moe_dispatcher": st.moe_dispatcher, "moe_a2a_overlap": st.moe_a2a_overlap,
                   "moe_routing": st.moe_routing, "cuda_graphs": st.cuda_graphs,
                   "offload_modules": "none"}
        out = {k: getattr(job, k) for k, v in default.items() if getattr(job, k) != v}
        if job.moe_routing == "capacity":
            out["moe_capacity_factor"] = job.moe_capacity_factor
        return out

    def job_settings(self) -> dict:
        """Every job setting (JobSpec fields) as used, in declaration order."""
        return {k: getattr(self.job, k) for k in JOB_FIELDS}
