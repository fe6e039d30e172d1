"""`Problem`: what is trained, on what, and how (model + cluster + job + stack + efficiency profile)."""

from __future__ import annotations

from ._base import Spec
from .hardware import ClusterSpec, Profile
from .job import JOB_FIELDS, JobSpec, flags_text
from .model import ModelSpec
from .precision import recipe
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
        for an MoE model: {field: value} (`moe_settings_changed`)."""
        return moe_settings_changed(self.job.model_dump(), self.stack, self.model.moe is not None)

    def ignored_moe_settings(self) -> dict:
        """The MoE job settings (and offloaded modules) set away from the stack's defaults for a
        dense model, which has no experts for them to act on: {field: value}; empty for an MoE
        model."""
        if self.model.moe is not None:
            return {}
        return moe_settings_changed(self.job.model_dump(), self.stack, True)

    def ignored_note(self) -> str | None:
        """The line `estimate` (in its notes) and `plan` say when settings were given that change
        nothing for this problem, instead of dropping them silently: MoE settings for a dense
        model (`ignored_moe_settings`), low-precision parameter gathers without a low-precision
        recipe; None when there are none."""
        parts = []
        ignored = self.ignored_moe_settings()
        graphs = {k: ignored.pop(k) for k in ("cuda_graphs",) if k in ignored}
        if ignored:
            parts.append(f"{flags_text(ignored)}: no effect, {self.model.name} is dense (no experts to "
                         "dispatch, route or offload)")
        if graphs:  # `cost.moe_layer.host_overhead`: the host stalls only where MoE layers sync it
            parts.append(f"{flags_text(graphs)}: no effect, {self.model.name} is dense (the host "
                         "time CUDA graphs remove is priced where an MoE layer's token counts "
                         "sync the host every layer; a dense model's host runs ahead of the GPU)")
        if (self.job.fp8_param_gather and not self.stack.low_precision_allgather
                and not recipe(self.job.precision).low):
            parts.append(f"--fp8-param-gather: no effect at --precision {self.job.precision} "
                         "(its weights are gathered in 16 bits; a low-precision recipe, e.g. "
                         "fp8 or mxfp8, keeps them in its format)")
        return "; ".join(parts) or None

    def job_settings(self) -> dict:
        """Every job setting (JobSpec fields) as used, in declaration order."""
        return {k: getattr(self.job, k) for k in JOB_FIELDS}


def moe_settings_changed(job: dict, stack: StackSpec, moe: bool) -> dict:
    """Of a job's settings (`JobSpec` fields as used), the MoE ones and the offloaded modules
    that differ from `stack`'s defaults, with the capacity factor under capacity routing; empty
    for a dense model (`moe` False). What `plan` and `estimate` print beside the stack."""
    if not moe:
        return {}
    default = {"moe_dispatcher": stack.moe_dispatcher, "moe_a2a_overlap": stack.moe_a2a_overlap,
               "moe_routing": stack.moe_routing, "cuda_graphs": stack.cuda_graphs,
               "offload_modules": "none"}
    out = {k: job[k] for k, v in default.items() if job[k] != v}
    if job["moe_routing"] == "capacity":
        out["moe_capacity_factor"] = job["moe_capacity_factor"]
    return out
