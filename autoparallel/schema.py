"""JSON Schemas of the inputs (from the pydantic specs) and of the JSON outputs (from pydantic
models that mirror them). `SCHEMA_VERSION` changes whenever an output schema changes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, create_model

from .errors import SpecError
from .specs import GPUSpec, Layout, ModelSpec, Profile
from .specs.docstrings import DocstringFields
from .specs.job import JobSpec
from .specs.network import NetworkSpec
from .specs.stack import StackSpec

SCHEMA_VERSION = "8"
"""Version of the output schemas (`estimate`, `plan`, `capacity`). Version 2: field descriptions
with units and a typed `problem` object in the plan output. Version 3: the job settings
(`JobSpec`: stack, precision, dtypes, overlaps, overrides) in the estimate's `job` object and
the plan's `problem`, `profile_basis`; error bands (`time_s.step_low`, `time_s.step_high`,
`memory_gib.total_high`, `band`), `tied` and `robustness` per ranked layout, `rank_by` and
`n_tied` in the plan, the capacity output, and `layout.stage_layers` / `layout.schedule`
(uneven pipeline splits and pipeline schedules), and `model_params` (total and active
parameter counts), memory as the allocator and nvidia-smi see it (`memory_gib.reserved`,
`device`, `headroom`, `by_stage`) and `layout.recompute_layers` (partial full recompute).
Version 4: `layout.recompute_group` (uniform recompute groups), `layout.recompute_modules`
(named-module selective recompute), `layout.offload_layers` (activation offload),
`layout.optimizer_offload` (optimizer-state offload) and `time_s.offload`. Version 5:
`layout.etp` and `layout.edp` (MoE parallel folding: expert tensor- and data-parallel degrees),
`time_s.host` (exposed host launch time of dynamic-shape MoE layers) and the MoE job settings
(`moe_dispatcher`, `moe_a2a_overlap`, `moe_routing`, `moe_capacity_factor`, `cuda_graphs`);
`time_s.pp_comm` also holds the tied-embedding gradient all-reduce between the first and last
pipeline stage; `layout.split` (even, balanced or custom stage split) and `notes` (what the estimate filled in,
such as the balanced split of a layout whose pp x vp does not divide the layers);
`job.fp8_param_gather` (low-precision weights kept and all-gathered in the recipe's format);
`job.network` (the network preset or file, `--network`);
`slug` (the layout's slug, as `--versus` and `export --layout` take it) and
`memory_risk` (the memory band's upper end above the usable memory) per estimate and ranked
layout, `robustness.memory_over`; `layout.cp_comm` (the context-parallel form: ring, a2a,
allgather, a2a+ring; null when cp = 1) and `layout.cp_a2a` (the hierarchical form's all-to-all
group), `time_s.cp_comm` and `memory_gib.overhead` costing the layout's form. Version 6:
`job.offload_modules` (fine-grained activation offload of MoE modules' saved inputs). Version 7:
`job.model_code` also takes `atorch` (ATorch's 3D pipeline on Hugging Face layers).
`tests/golden/schema/v<N>.json` freezes each
version; changing an output model needs a new version and a new golden file."""


class _Out(DocstringFields, BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class LayoutOut(_Out):
    """One layout, every axis explicit."""

    dp: int
    """Data-parallel degree."""
    tp: int
    """Tensor-parallel degree."""
    pp: int
    """Pipeline-parallel degree."""
    vp: int
    """Virtual pipeline stages (model chunks) per pipeline rank."""
    cp: int
    """Context-parallel degree."""
    cp_comm: Literal["ring", "a2a", "allgather", "a2a+ring"] | None
    """With cp > 1, how the CP ranks exchange what attention needs: ring (K, V passed around,
    Megatron-Core `--cp-comm-type p2p`), a2a (DeepSpeed-Ulysses all-to-alls over the heads),
    allgather (K, V of the whole sequence gathered), a2a+ring (hierarchical: a2a inside groups
    of `cp_a2a`, ring across); null when cp = 1."""
    cp_a2a: int | None
    """With cp_comm a2a+ring: ranks per all-to-all group (Megatron-Core
    `--hierarchical-context-parallel-sizes cp_a2a cp/cp_a2a`); null otherwise."""
    ep: int
    """Expert-parallel degree (1 for dense models)."""
    etp: int
    """Expert tensor-parallel degree (Megatron `--expert-tensor-parallel-size`; tp by default)."""
    edp: int
    """Expert data-parallel degree, tp x cp x dp / (etp x ep): the expert grid etp x ep x edp
    folds onto each pipeline stage's tp x cp x dp ranks (MoE Parallel Folding)."""
    zero: int
    """ZeRO stage 0-3 over dp x cp (1 = distributed optimizer)."""
    recompute: str
    """Activation recomputation: none, selective or full."""
    sp: bool
    """Sequence parallelism with TP."""
    micro_batch: int
    """Sequences per micro-batch."""
    grad_accum: int
    """Micro-batches per optimizer step per data-parallel replica (global batch / (dp x micro_batch))."""
    stage_layers: list[int | float]
    """Transformer layers per pipeline stage, first to last (one value when pp = 1)."""
    split: Literal["even", "balanced", "custom"]
    """How the layers are split over the stages: `even` (n_layers / pp each), `balanced` (the
    uneven split `plan` takes for this pp x vp: the most loaded stage's FLOPs, output layer
    included, as light as the equal middle stages allow), `custom` (another uneven split)."""
    schedule: str
    """Pipeline schedule: 1f1b, interleaved, zb-h1, zbv, dualpipe or dualpipev."""
    recompute_layers: int | None
    """With full recompute: layers fully recomputed per model chunk, the first ones (Megatron
    `--recompute-method block --recompute-num-layers`); null = every layer."""
    recompute_group: int | None
    """With full recompute of every layer: layers per uniform checkpoint group (Megatron
    `--recompute-method uniform --recompute-num-layers`; 1 = each layer); null otherwise."""
    recompute_modules: list[str] | None
    """With selective recompute: the submodules re-run in backward (Megatron
    `--recompute-modules`; core_attn is its default); null otherwise."""
    offload_layers: int
    """Transformer layers per pipeline stage whose saved activations are offloaded to host
    memory (Megatron-Core `--cpu-offloading-num-layers`); 0 = none."""
    optimizer_offload: float
    """Share of the optimizer state kept in host memory and stepped by the CPU (Megatron
    `--optimizer-offload-fraction`, ZeRO-Offload); 0 = none."""


class StageMemoryOut(_Out):
    """Memory of one pipeline stage kind, GiB."""

    stage: Literal["only", "first", "middle", "last"]
    """`first` holds the embedding and the most in-flight micro-batches, `last` the output layer,
    logits and loss; `middle` is the most loaded of the others; `only` when pp = 1."""
    pp_ranks: list[int]
    """Pipeline ranks of this kind."""
    params: float
    """bf16 parameters of the stage's layers on one GPU."""
    grads: float
    """Gradients of those parameters."""
    optimizer: float
    """Optimizer state of those parameters."""
    activations: float
    """Activations of the micro-batches the stage holds at its peak."""
    embedding_logits: float
    """Token ids / embedding output (first stage), logits and loss inputs (last stage)."""
    overhead: float
    """Fixed overhead plus the stage's transients."""
    allocated: float
    """Sum of the items (`torch.cuda.max_memory_allocated`)."""
    reserved: float
    """allocated plus the allocator reserve (`max_memory_reserved`)."""
    device: float
    """reserved plus CUDA context and NCCL memory (`nvidia-smi`)."""


class MemoryOut(_Out):
    """Per-GPU memory of the most-loaded pipeline stage, GiB (2^30 bytes)."""

    params: float
    """bf16 parameters held by one GPU (after TP, PP, EP and ZeRO-3 sharding)."""
    grads: float
    """Gradients (bf16 or fp32 per `grad_dtype`; sharded from ZeRO-2 on)."""
    optimizer: float
    """fp32 master weights and Adam moments, 12 bytes/parameter (sharded from ZeRO-1 on)."""
    model_states: float
    """params + grads + optimizer."""
    activations: float
    """Stored activations of the micro-batches in flight on the stage."""
    embedding_logits: float
    """Embedding output and fp32 logits of the first / last stage."""
    overhead: float
    """Fixed overhead inside the allocator (cuBLAS / Transformer Engine workspaces, buckets) plus
    transients (ZeRO-3 gathers, recompute working set, CP ring buffers, autocast's cast cache,
    a foreach optimizer step's excess)."""
    total: float
    """params + grads + optimizer + activations + embedding_logits + overhead."""
    capacity: float
    """HBM of one GPU."""
    usable: float
    """What the fit figure may reach: capacity less CUDA context and NCCL memory
    (default; the figure is `reserved`), or capacity x usable_fraction (explicit fraction; the
    figure is `total`)."""
    reserved: float
    """`torch.cuda.max_memory_reserved`: total plus the caching allocator's fitted fragmentation
    reserve and block rounding."""
    device: float
    """What `nvidia-smi` shows: reserved plus CUDA context and NCCL memory (per communicator the
    rank uses, `cost.device_memory`)."""
    headroom: float
    """usable minus the fit figure; negative when the layout does not fit."""
    total_high: float
    """Upper end of the memory band: total x exp(-p10) of the leave-one-source-out memory
    residuals ln(predicted / measured) (`band.memory_*`)."""
    by_stage: list[StageMemoryOut]
    """One entry per pipeline stage kind (first, middle, last; `only` when pp = 1)."""


class TimeOut(_Out):
    """Seconds per training step of the pacing (slowest) pipeline stage."""

    compute: float
    """Forward and backward kernels of every micro-batch."""
    recompute: float
    """Forward kernels re-run in backward (selective or full recompute)."""
    tp_comm: float
    """Tensor-parallel collectives not hidden by compute."""
    cp_comm: float
    """Context-parallel ring exchange not hidden by attention."""
    ep_comm: float
    """Expert-parallel all-to-alls not hidden by compute."""
    pp_comm: float
    """Pipeline point-to-point sends on the fill and drain path, and with tied embeddings the
    exposed all-reduce of the shared embedding's gradient between the first and last stage."""
    dp_comm: float
    """Data-parallel gradient reduction / parameter gathering left exposed after overlap."""
    bubble: float
    """Pipeline bubble, (pp - 1) / vp x the slowest stage's time per micro-batch."""
    optimizer: float
    """Optimizer step on the local shard plus the fixed per-step overhead."""
    offload: float
    """Host-link transfers not hidden by compute (activation offload) plus the offloaded
    optimizer share's gradient and parameter copies and CPU Adam step."""
    host: float
    """Host (CPU) launch time the GPU waits for: dynamic-shape MoE layers sync their token
    counts to the host each layer, so their kernel launches are exposed (less with CUDA graphs;
    0 with static shapes)."""
    step: float
    """Sum of the items above: one optimizer step."""
    step_low: float
    """Lower end of the step-time band: step x exp(-p90) of the leave-one-source-out residuals
    ln(predicted / measured) of comparable runs (`band`); about 1 in 10 measurements below."""
    step_high: float
    """Upper end of the step-time band: step x exp(-p10); about 1 in 10 measurements above."""


class BandOut(_Out):
    """Where the error band comes from (`autoparallel.bands`, docs/validation.md)."""

    regime: str
    """`compute` or `comm` (exposed communication at least 10 % of the step)."""
    exposed_comm_share: float
    """Exposed TP + CP + EP + PP + DP communication / step, 0-1."""
    step_level: str
    """Which residuals the step band uses: stack+gpu, gpu, stack or global (both: this GPU has
    no runs; quantiles doubled), none (default x0.5-x2)."""
    step_runs: int
    """Validation runs behind the step band (0 = default band)."""
    step_sources: list[str]
    """Sources of those runs."""
    step_log_p10: float
    """p10 of ln(predicted / measured) applied (clamped to <= -0.01)."""
    step_log_p90: float
    """p90 of ln(predicted / measured) applied (clamped to >= +0.01)."""
    memory_level: str
    """Which residuals the memory band uses (same levels; none = default +25 %)."""
    memory_runs: int
    """Validation runs with a measured peak memory behind the memory band."""
    memory_sources: list[str]
    """Sources of those runs."""
    memory_log_p10: float
    """p10 of ln(predicted / measured) memory applied (clamped to <= -0.01)."""
    note: str
    """The step band's basis in words."""


class ModelParamsOut(_Out):
    """Parameter counts of the model as the cost model sees it (biases and the few norms the
    count leaves out are under 0.1 %)."""

    total: int
    """Every parameter (all experts, embeddings, output layer unless tied)."""
    active: int
    """Parameters one token passes through (top-k routed experts only); = total for dense models."""


class EstimateOut(_Out):
    """Output of `autoparallel estimate --format json` (and `autoparallel.estimate`)."""

    model: str
    """Model name."""
    gpu: str
    """GPU preset name."""
    n_gpus: int
    """GPUs in the job."""
    slug: str
    """The layout's slug (`Layout.slug`), e.g. dp4-tp8-pp2-vp10-cp1-ep1-z1-rnone-sp-mb1: what
    `plan --versus`, `export --layout` and `estimate --layout` take."""
    layout: LayoutOut
    """The layout, every axis explicit."""
    memory_gib: MemoryOut
    """Memory per GPU, GiB."""
    fits: bool
    """Whether the fit figure (memory_gib.reserved; total with an explicit usable_fraction) is at
    most memory_gib.usable."""
    memory_risk: bool
    """Whether memory_gib.total_high, the upper end of the memory band, exceeds
    memory_gib.usable: the layout may run out of memory although its predicted peak fits."""
    time_s: TimeOut
    """Time per step, seconds."""
    mfu: float
    """Model FLOPs utilisation, 0-1 (model FLOPs per step / (step x peak x n_gpus))."""
    tokens_per_s_per_gpu: float
    """Training throughput, tokens per second per GPU."""
    model_flops_per_step: float
    """Model FLOPs of one optimizer step (no recompute), FLOP."""
    job: JobSpec
    """Every job setting as the cost model used it (the stack's defaults filled in)."""
    profile_basis: str
    """Where the efficiency profile comes from (the stack's fit on this GPU, the nearest GPU's,
    the GPU preset's, a profile file)."""
    band: BandOut
    """Basis of the error bands in `time_s` and `memory_gib`."""
    model_params: ModelParamsOut
    """Total and active parameter counts of the model."""
    notes: list[str]
    """What the estimate chose for the layout that it was not given (e.g. the balanced split
    where pp x vp does not divide the layers), one line each; the CLI prints them as `note:`."""


class RobustnessOut(_Out):
    """Robustness of a layout (`autoparallel.search.robust`); lower penalty = more robust."""

    score_s: float
    """step x (1 + penalty), seconds: the order of the tied group under `--rank-by robust`."""
    penalty: float
    """net_sensitivity + gemm_sensitivity + exposed_comm_share + 0.10 x memory_used
    + 0.02 x (parallel_dims - 1) + 0.05 x (TP x EP across the scale-up domain) + memory_over."""
    net_sensitivity: float
    """Step time with 20 % less scale-out bandwidth / step - 1."""
    gemm_sensitivity: float
    """Step time with 10 % lower GEMM efficiency / step - 1."""
    exposed_comm_share: float
    """Exposed communication / step, 0-1."""
    memory_used: float
    """Memory total / usable, 0-1."""
    parallel_dims: int
    """How many of dp, tp, pp, cp, ep exceed 1."""
    tp_ep_in_node: bool
    """Whether tp and the expert-TP x EP block (etp x ep) each fit in the scale-up domain."""
    memory_over: float
    """max(0, memory_gib.total_high / memory_gib.usable - 1): how far the memory band reaches
    past the usable memory (a term of the penalty)."""


class RankedOut(EstimateOut):
    """One ranked layout of a plan."""

    rank: int
    """1 = first under `rank_by` (fastest for `time`)."""
    tied: bool
    """Whether this layout's step band overlaps the fastest layout's (its step_low <= the
    fastest's step_high): the model cannot tell them apart."""
    robustness: RobustnessOut
    """Robustness penalty and its terms."""


class _ProblemOut(_Out):
    """The planned problem."""

    model: str
    """Model name."""
    gpu: str
    """GPU preset name."""
    n_gpus: int
    """GPUs in the job."""
    gpus_per_node: int
    """GPUs per node."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""


ProblemOut = create_model(
    "ProblemOut", __base__=_ProblemOut, __doc__="The planned problem and every job setting.",
    **{name: (field.annotation, field) for name, field in JobSpec.model_fields.items()},
)


class PlanOut(_Out):
    """Output of `autoparallel plan --format json` (and `autoparallel.plan(...).out`)."""

    schema_version: str
    """`SCHEMA_VERSION` of this output."""
    problem: ProblemOut
    """What was planned: model, GPU kind and count, sequence length, global batch."""
    model_params: ModelParamsOut
    """Total and active parameter counts of the model."""
    n_layouts: int
    """Layouts enumerated."""
    n_valid: int
    """Layouts that pass every rule except memory."""
    n_fit: int
    """Valid layouts that fit in usable memory."""
    search_s: float
    """Wall time of the search, seconds."""
    rank_by: str
    """`time` (fastest first) or `robust` (the tied group by robust score first)."""
    n_tied: int
    """Fitting layouts tied with the fastest (band overlap)."""
    ranked: list[RankedOut]
    """The best fitting layouts in `rank_by` order (at most `--top`)."""


class CapacityJobOut(_Out):
    """The job planned for."""

    model: str
    """Model name."""
    tokens: float
    """Token budget of the run."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    global_batch_tokens: int
    """Tokens per optimizer step (global_batch x seq_len)."""
    rank_by: str
    """How each row's layout was chosen: time (fastest) or robust."""


class AssumptionsOut(_Out):
    """Goodput and energy assumptions (defaults and sources: `autoparallel.capacity_model`)."""

    mtbf_gpu_hours: float
    """Mean time between job interruptions per GPU, hours (default from the Llama 3 report: 419
    interruptions in 54 days on 16,384 H100)."""
    ckpt_write_s: float
    """Seconds a checkpoint stalls training."""
    ckpt_restore_s: float
    """Seconds from an interruption to training again."""
    power_fraction: float
    """Average GPU power / TDP."""
    node_overhead: float
    """Host power per watt of GPU power."""
    pue: float
    """Data-centre power usage effectiveness."""


class CapacityRowOut(_Out):
    """One GPU kind and count. `_low` / `_high`: the same figure at the fast / slow end of the
    step-time band (for tokens_per_s, `_low` is the slow end)."""

    gpu: str
    """GPU preset name."""
    n_gpus: int
    """GPUs in the job."""
    fits: bool
    """Whether any layout fits; when false the other fields are absent."""
    layout: str | None
    """The chosen layout (slug)."""
    step_s: float | None = None
    """Predicted step time, seconds."""
    step_low_s: float | None = None
    """Lower end of the step-time band, seconds."""
    step_high_s: float | None = None
    """Upper end of the step-time band, seconds."""
    mfu: float | None = None
    """Model FLOPs utilisation, 0-1."""
    goodput: float | None = None
    """Share of wall time that advances training (checkpoints, lost work and restarts removed)."""
    checkpoint_interval_s: float | None = None
    """Young/Daly interval sqrt(2 x write time x job MTBF), seconds."""
    job_mtbf_h: float | None = None
    """Mean time between interruptions of the whole job, hours."""
    band_level: str | None = None
    """Which residuals the step band uses (see `band.step_level` of the estimate schema)."""
    tokens_per_s: float | None = None
    """Training throughput of the job, tokens/s (no interruptions)."""
    tokens_per_s_low: float | None = None
    """Throughput at the slow end of the band."""
    tokens_per_s_high: float | None = None
    """Throughput at the fast end of the band."""
    days: float | None = None
    """Wall-clock days to train the token budget, goodput included."""
    days_low: float | None = None
    """Days at the fast end of the band."""
    days_high: float | None = None
    """Days at the slow end of the band (the pessimistic figure `--deadline` uses)."""
    gpu_hours: float | None = None
    """days x 24 x n_gpus."""
    gpu_hours_low: float | None = None
    """GPU-hours at the fast end."""
    gpu_hours_high: float | None = None
    """GPU-hours at the slow end."""
    cost: float | None = None
    """gpu_hours x the price given for this GPU kind (null without --price)."""
    cost_low: float | None = None
    """Cost at the fast end."""
    cost_high: float | None = None
    """Cost at the slow end."""
    energy_mwh: float | None = None
    """gpu_hours x TDP x power_fraction x (1 + node_overhead) x PUE, MWh (null without a TDP)."""
    energy_mwh_low: float | None = None
    """Energy at the fast end, MWh."""
    energy_mwh_high: float | None = None
    """Energy at the slow end, MWh."""


class DeadlineOut(_Out):
    """Answer to `--deadline`."""

    days: float
    """The deadline, days."""
    smallest_n_gpus: dict[str, int | None]
    """Per GPU kind, the smallest count evaluated whose days_high meets the deadline (null: none)."""


class CapacityOut(_Out):
    """Output of `autoparallel capacity --format json`."""

    schema_version: str
    """`SCHEMA_VERSION` of this output."""
    job: CapacityJobOut
    """Model, tokens, sequence length and global batch."""
    assumptions: AssumptionsOut
    """Goodput and energy assumptions used."""
    rows: list[CapacityRowOut]
    """One row per GPU kind and count."""
    deadline: DeadlineOut | None
    """Smallest count per GPU kind meeting `--deadline` (null when not asked)."""


_SCHEMAS = {
    "estimate": EstimateOut, "plan": PlanOut, "capacity": CapacityOut, "model": ModelSpec,
    "gpu": GPUSpec, "profile": Profile, "layout": Layout, "stack": StackSpec, "job": JobSpec,
    "network": NetworkSpec,
}


def schema_for(what: str) -> dict:
    """JSON Schema of `what` (estimate, plan, capacity, model, gpu, profile, layout, stack, job,
    network)."""
    if what not in _SCHEMAS:
        raise SpecError(f"`schema` {what!r} unknown; choose one of {', '.join(_SCHEMAS)}")
    schema = _SCHEMAS[what].model_json_schema()
    schema["$comment"] = f"autoparallel schema version {SCHEMA_VERSION}"
    return schema
