"""Build a `Problem` from preset names or files plus plain numbers, with readable errors."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from .errors import SpecError, format_validation_error
from .presets import load_gpu, load_model, load_profile
from .specs import ClusterSpec, GPUSpec, ModelSpec, Problem, Profile, TrainingSpec


def make_problem(
    model: str | ModelSpec,
    gpu: str | GPUSpec,
    n_gpus: int,
    seq_len: int,
    global_batch: int,
    *,
    gpus_per_node: int = 8,
    profile: str | Path | Profile | None = None,
    intra_gb_per_s: float | None = None,
    inter_gb_per_s: float | None = None,
    intra_latency_us: float | None = None,
    inter_latency_us: float | None = None,
    grad_dtype: str = "bf16",
    usable_fraction: float = 0.9,
    attention: str = "flash",
    tp_comm_overlap: bool = False,
) -> Problem:
    """A `Problem` from a model and GPU (preset name, file or spec) and the job's numbers.

    Example:
        >>> p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
        >>> p.cluster.gpu.bf16_tflops
        989.0

    Raises:
        SpecError: an unknown preset, a missing file or an invalid value, with the field named.
    """
    model_spec = load_model(model)
    gpu_spec = load_gpu(gpu)
    try:
        cluster = ClusterSpec(
            gpu=gpu_spec, n_gpus=n_gpus, gpus_per_node=gpus_per_node,
            intra_gb_per_s=intra_gb_per_s, inter_gb_per_s=inter_gb_per_s,
            intra_latency_us=intra_latency_us, inter_latency_us=inter_latency_us,
        )
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, "cluster")) from None
    try:
        training = TrainingSpec(
            seq_len=seq_len, global_batch=global_batch, grad_dtype=grad_dtype,
            usable_fraction=usable_fraction, attention=attention,
            tp_comm_overlap=tp_comm_overlap,
        )
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, "training")) from None
    if profile is None:
        prof = gpu_spec.default_profile()
    elif isinstance(profile, Profile):
        prof = profile
    else:
        prof = load_profile(profile, base=gpu_spec.default_profile())
    return Problem(model=model_spec, cluster=cluster, training=training, profile=prof)
