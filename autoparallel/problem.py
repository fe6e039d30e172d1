"""Build a `Problem` from preset names or files plus plain numbers, with readable errors.

The job settings are the fields of `specs.job.JobSpec` (one declaration); a setting left at None
takes the stack's default, and the efficiency profile is resolved per (stack, GPU)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .errors import SpecError, format_validation_error
from .presets import load_gpu, load_model, load_network, load_profile, load_stack
from .specs import ClusterSpec, GPUSpec, ModelSpec, Problem, Profile, TrainingSpec
from .specs.job import JOB_FIELDS, JobSpec, job_flag
from .specs.precision import RECIPES, supported, supported_names
from .specs.stack import STACK_KNOBS, StackSpec

LEGACY_NAMES = {"intra_gb_per_s": "intra_gbps", "inter_gb_per_s": "inter_gbps"}
"""Older keyword names still accepted by `make_problem`."""


def make_problem(
    model: str | ModelSpec,
    gpu: str | GPUSpec,
    n_gpus: int,
    seq_len: int,
    global_batch: int,
    *,
    gpus_per_node: int | None = None,
    **job: Any,
) -> Problem:
    """A `Problem` from a model and GPU (preset name, file or spec), the job's numbers and its
    settings (`JobSpec` fields: stack, precision, grad_dtype, attention, tp_comm_overlap, ...;
    `profile` may also be a `Profile`). `gpus_per_node` defaults to the GPU's node
    (`GPUSpec.gpus_per_node`: 8, 4 on a GB200/GB300 tray).

    Example:
        >>> p = make_problem("llama3-70b", "h100", 64, seq_len=8192, global_batch=512)
        >>> p.cluster.gpu.bf16_tflops, p.job.stack, p.training.tp_comm_overlap
        (989.0, 'megatron-core', True)

    Raises:
        SpecError: an unknown preset or keyword, a missing file, an invalid value, or a
            precision the GPU or the stack cannot run, with the field named.
    """
    job = {LEGACY_NAMES.get(k, k): v for k, v in job.items()}
    unknown = sorted(set(job) - set(JOB_FIELDS))
    if unknown:
        raise SpecError(f"unknown job setting(s) {', '.join(unknown)}; known: "
                        f"gpus_per_node, {', '.join(JOB_FIELDS)}")
    profile_obj = job.pop("profile", None)
    profile_ref = None if isinstance(profile_obj, Profile) or profile_obj is None else str(profile_obj)
    stack_obj = job.get("stack")
    if isinstance(stack_obj, StackSpec):
        job["stack"] = stack_obj.name
    try:
        given = JobSpec(**job, profile=profile_ref)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, "job")) from None
    model_spec = load_model(model)
    gpu_spec = load_gpu(gpu)
    stack = stack_obj if isinstance(stack_obj, StackSpec) else load_stack(given.stack)
    _check_precision(gpu_spec, stack, given.precision)
    resolved = given.model_copy(update={
        "stack": stack.name,
        "grad_dtype": given.grad_dtype or stack.grad_dtype,
        "grad_reduce_dtype": given.grad_reduce_dtype or stack.grad_reduce_dtype,
        "optimizer_dtype": given.optimizer_dtype or stack.optimizer_dtype,
        "attention": given.attention or stack.attention_for(gpu_spec.generation),
        "model_code": given.model_code or stack.model_code,
        "torch_compile": stack.torch_compile if given.torch_compile is None else given.torch_compile,
        "autocast": stack.autocast if given.autocast is None else given.autocast,
        "tp_comm_overlap": (stack.tp_comm_overlap if given.tp_comm_overlap is None
                            else given.tp_comm_overlap),
        "moe_dispatcher": given.moe_dispatcher or stack.moe_dispatcher,
        "moe_a2a_overlap": (stack.moe_a2a_overlap if given.moe_a2a_overlap is None
                            else given.moe_a2a_overlap),
        "moe_routing": given.moe_routing or stack.moe_routing,
        "cuda_graphs": given.cuda_graphs or stack.cuda_graphs,
        "offload_modules": given.offload_modules or "none",
        "fp8_param_gather": (stack.low_precision_allgather if given.fp8_param_gather is None
                             else given.fp8_param_gather),
    })
    _check_moe(gpu_spec, stack, resolved, model_spec)
    if resolved.moe_routing == "capacity" and resolved.moe_capacity_factor is None:
        resolved = resolved.model_copy(update={"moe_capacity_factor": 1.0})
    try:
        cluster = ClusterSpec(
            gpu=gpu_spec, n_gpus=n_gpus,
            gpus_per_node=gpus_per_node if gpus_per_node is not None else gpu_spec.gpus_per_node,
            intra_gb_per_s=resolved.intra_gbps, inter_gb_per_s=resolved.inter_gbps,
            intra_latency_us=resolved.intra_latency_us, inter_latency_us=resolved.inter_latency_us,
            network=load_network(resolved.network) if resolved.network is not None else None,
        )
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, "cluster")) from None
    try:
        training = TrainingSpec(
            seq_len=seq_len, global_batch=global_batch, grad_dtype=resolved.grad_dtype,
            usable_fraction=resolved.usable_fraction, attention=resolved.attention,
            tp_comm_overlap=resolved.tp_comm_overlap, precision=resolved.precision,
            stack=stack.name, grad_reduce_dtype=resolved.grad_reduce_dtype,
            optimizer_dtype=resolved.optimizer_dtype, model_code=resolved.model_code,
            torch_compile=resolved.torch_compile, autocast=resolved.autocast,
            moe_dispatcher=resolved.moe_dispatcher, moe_a2a_overlap=resolved.moe_a2a_overlap,
            moe_routing=resolved.moe_routing, cuda_graphs=resolved.cuda_graphs,
            moe_capacity_factor=resolved.moe_capacity_factor or 1.0,
            offload_modules=resolved.offload_modules,
            fp8_param_gather=resolved.fp8_param_gather,
        )
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, "training")) from None
    prof, basis = stack_profile(stack, gpu_spec)
    if isinstance(profile_obj, Profile):
        prof, basis = profile_obj, "a Profile given by the caller"
    elif profile_ref is not None:
        prof = load_profile(profile_ref, base=prof)
        basis = f"{profile_ref} over {basis}"
    return Problem(model=model_spec, cluster=cluster, training=training, profile=prof,
                   stack=stack, job=resolved, profile_basis=basis)


def _check_moe(gpu: GPUSpec, stack: StackSpec, job: JobSpec, model) -> None:
    """MoE job settings the stack, the GPU and the routing can run, each refused with the field:
    a dispatcher the stack lacks; DeepEP on a multi-node NVLink domain (DeepEP's kernels are
    intra-node NVLink + RDMA; Megatron-Bridge's overlap guide: DeepEP on Ampere, Hopper, B200,
    B300; HybridEP also on GB200/GB300 NVL72); a capacity factor without capacity routing; full
    CUDA graphs of a dropless MoE model (dynamic shapes: Megatron's MoE guide, 'MoE layers
    uncapturable' without a capacity factor and padding, unless HybridEP's static buffers);
    offloaded modules the stack cannot offload, on a model without MoE layers or a GPU without
    a host link."""
    if job.moe_dispatcher not in stack.moe_dispatchers:
        raise SpecError(f"`{job_flag('moe_dispatcher')}` = {job.moe_dispatcher!r}: stack "
                        f"{stack.name!r} implements {', '.join(stack.moe_dispatchers)}")
    if job.moe_dispatcher == "deepep" and gpu.scaleup_domain > 8:
        raise SpecError(f"`{job_flag('moe_dispatcher')}` = 'deepep' on {gpu.name}: DeepEP moves "
                        "tokens over NVLink inside a node and RDMA between nodes, not across a "
                        f"{gpu.scaleup_domain}-GPU NVLink domain; use hybridep (multi-node NVLink) "
                        "or alltoall")
    if job.moe_capacity_factor is not None and job.moe_routing != "capacity":
        raise SpecError(f"`{job_flag('moe_capacity_factor')}` = {job.moe_capacity_factor:g} needs "
                        f"`{job_flag('moe_routing')}` capacity (token dropping); it is "
                        f"{job.moe_routing}")
    if job.moe_a2a_overlap and job.moe_dispatcher == "allgather":
        raise SpecError(f"`{job_flag('moe_a2a_overlap')}` with the allgather dispatcher: "
                        "Megatron-Core overlaps the alltoall and flex dispatchers only "
                        "(transformer_config.py); use --moe-dispatcher alltoall, deepep or hybridep")
    if job.cuda_graphs not in stack.cuda_graph_modes:
        raise SpecError(f"`{job_flag('cuda_graphs')}` = {job.cuda_graphs!r}: stack "
                        f"{stack.name!r} implements {', '.join(stack.cuda_graph_modes)}")
    if job.offload_modules != "none":
        asked = job.offload_modules.split("+")
        missing = [m for m in asked if m not in stack.offload_modules]
        if missing:
            can = ", ".join(stack.offload_modules) or "none"
            raise SpecError(f"`{job_flag('offload_modules')}` = {job.offload_modules!r}: stack "
                            f"{stack.name!r} cannot offload {', '.join(missing)} (it offloads: "
                            f"{can}); use --offload-modules none")
        if model.moe is None:
            raise SpecError(f"`{job_flag('offload_modules')}` = {job.offload_modules!r}: model "
                            f"{model.name!r} has no MoE layers, whose modules these are; use "
                            "--offload-modules none")
        if gpu.host_link_gb_per_s is None:
            raise SpecError(f"`{job_flag('offload_modules')}` = {job.offload_modules!r}: GPU "
                            f"{gpu.name!r} has no `host_link_gb_per_s`, so the copies cannot be "
                            "costed; add it to the GPU spec or use --offload-modules none")
    if (model.moe is not None and job.cuda_graphs == "full" and job.moe_routing != "capacity"
            and job.moe_dispatcher != "hybridep"):
        raise SpecError(f"`{job_flag('cuda_graphs')}` = 'full' with {job.moe_routing} routing and "
                        f"the {job.moe_dispatcher} dispatcher: dropless MoE layers have dynamic "
                        "shapes and cannot be captured (Megatron-Core MoE guide); use "
                        "--moe-routing capacity, --moe-dispatcher hybridep, or --cuda-graphs scoped")


def _check_precision(gpu: GPUSpec, stack: StackSpec, precision: str) -> None:
    if not supported(gpu, precision):
        raise SpecError(
            f"`{job_flag('precision')}` = {precision!r}: {gpu.name} cannot run it (needs "
            f"{RECIPES[precision].needs}); {gpu.name} runs {', '.join(supported_names(gpu))}")
    if precision not in stack.precisions:
        raise SpecError(
            f"`{job_flag('precision')}` = {precision!r}: stack {stack.name!r} does not implement it; "
            f"it runs {', '.join(stack.precisions)} (or choose another --stack)")


GENERATION_ORDER = ("hopper", "blackwell", "ampere", "cdna3", "volta", "other")
"""Preference among other GPUs when a stack has no fit on this one: the same generation first,
then this order (the generation with the most measured runs first)."""


def gpu_nearness(target: GPUSpec, other: GPUSpec) -> tuple:
    """Sort key of `other` as a stand-in for `target` (smaller is nearer): the same generation
    first (then GENERATION_ORDER), then the closest tensor-core peaks, summed |ln ratio| of the
    BF16, FP8 and FP4 peaks both have (B300's nearest is GB300, the same Blackwell Ultra chip, not
    B200), then the name."""
    import math

    peaks = [(getattr(target, k), getattr(other, k)) for k in ("bf16_tflops", "fp8_tflops",
                                                                "fp4_tflops")]
    gap = sum(abs(math.log(a / b)) for a, b in peaks if a and b)
    return (other.generation != target.generation, GENERATION_ORDER.index(other.generation),
            round(gap, 9), other.name)


def _nearest_fit(stack: StackSpec, gpu: GPUSpec) -> str | None:
    """The GPU preset of the stack's fitted profiles nearest to `gpu` (`gpu_nearness`): the same
    preset, else the nearest of the same generation, else of the generation with most runs."""
    if gpu.name in stack.profile:
        return gpu.name
    if not stack.profile:
        return None
    from .presets import load_gpu as _load

    return min(stack.profile, key=lambda g: gpu_nearness(gpu, _load(g)))


def stack_profile(stack: StackSpec, gpu: GPUSpec) -> tuple[Profile, str]:
    """The efficiency profile of `stack` on `gpu` and a sentence saying where it comes from.

    The GPU preset's profile (hardware knobs; literature or fitted across stacks) is overlaid
    with the stack's knobs fitted on this GPU; where the stack has no runs on this GPU, its knobs
    fitted on the nearest GPU are used: they are fractions of peak and per-step overheads, so
    they carry over with the new GPU's peaks (GEMMs, attention and bandwidth scale with it)."""
    from .attention_prior import preset_profile

    base = preset_profile(gpu)  # its uncalibrated attention at what training keeps
    near = _nearest_fit(stack, gpu)
    if near is None:
        return base, f"{gpu.name} preset (no {stack.name} fit on any GPU)"
    knobs = {k: v for k, v in stack.profile[near].items() if k in STACK_KNOBS}
    prof = base.model_copy(update=knobs)
    if near == gpu.name:
        return prof, f"{stack.name} fitted on {gpu.name}"
    return prof, (f"{stack.name} fitted on {near} (nearest GPU with {stack.name} runs), as "
                  f"fractions of the {gpu.name} peaks")


def with_gpu_count(problem: Problem, n_gpus: int) -> Problem:
    """The same problem (model, GPU, job, stack, profile) on `n_gpus` GPUs; nodes smaller than
    `gpus_per_node` when `n_gpus` is."""
    c = problem.cluster
    gpn = min(c.gpus_per_node, n_gpus)
    try:
        cluster = c.model_copy(update={"n_gpus": n_gpus, "gpus_per_node": gpn})
        cluster = ClusterSpec.model_validate(cluster.model_dump())
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, "cluster")) from None
    return problem.model_copy(update={"cluster": cluster})


__all__ = ["GENERATION_ORDER", "gpu_nearness", "make_problem", "stack_profile", "with_gpu_count"]
