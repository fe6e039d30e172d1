"""Hardware specifications: one GPU kind (`GPUSpec`), the efficiency knobs (`Profile`) and the
cluster (`ClusterSpec`). Numbers in presets carry their source in a `[sources]` table."""

from __future__ import annotations

from typing import Literal

from pydantic import (Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError,
                      model_validator)

from ..limits import MAX_GPUS

from ._base import Spec
from .network import NetworkSpec


class Profile(Spec):
    """Efficiency knobs of the time model. Defaults follow cost-model-reference §6-§8; each GPU
    preset may override them, and `autoparallel calibrate` fits them to measured runs."""

    gemm_efficiency: float = Field(0.78, gt=0, le=1)
    """Fraction of dense peak that large BF16 GEMMs reach (MAMF: H100 80%, A100 87%; ref §7.1)."""
    gemm_overhead_us: NonNegativeFloat = 4.0
    """Fixed time per GEMM (launch, tail, wave quantisation), microseconds (ref §7.2 rule 3)."""
    fp8_gemm_efficiency: float = Field(0.70, gt=0, le=1)
    """Fraction of the dense FP8 peak that large FP8 GEMMs reach (MAMF: H100 70.9%, H200 73.4%,
    B200 76.3%, GB200 72.3%; ref §7.1). Used for every low-precision recipe at the FP8 peak."""
    fp4_gemm_efficiency: float = Field(0.70, gt=0, le=1)
    """Fraction of the dense FP4 peak that large NVFP4 GEMMs reach. No MAMF measurement is
    published; the FP8 fraction is assumed until `calibrate` fits it on NVFP4 runs."""
    attention_efficiency: float = Field(0.45, gt=0, le=1)
    """Fraction of peak reached by the fused attention kernel (FA2 35-50%, FA3/cuDNN 60-75%; ref §7.3)."""
    cudnn_attention_efficiency: float = Field(0.6, gt=0, le=1)
    """Fraction of peak reached by cuDNN fused attention / FlashAttention-3 (Transformer Engine;
    `attention = "cudnn"`): 60-75% of H100 peak (ref §7.3, FA3 ~740 TFLOP/s [recalled])."""
    scan_efficiency: float = Field(0.25, gt=0, le=1)
    """Compute ceiling of the chunked scans of hybrid models (Mamba-2 SSD, gated DeltaNet;
    `cost.ssm_mixer.scan_time`): the fraction of the dense BF16 peak their FLOPs reach at best.
    The scan's time is the longer of that and its kernels' HBM traffic (counted in
    `cost.mamba`, `cost.linear_attention`), and the scans of the shipped models are memory-bound
    under this default: the traffic alone is the FLOPs' time at 7.6-10 % of the peak (H100 runs
    fit 8 %). Default: an assumption (Triton chunk kernels on 64-128 tiles, below
    the attention kernels' 45-60 %) that does not bind for them; fitted per GPU where the runs
    are slower than the traffic (`benchmarks/fit_scan_efficiency.py`; the stacks' `[profile]`
    tables)."""
    hbm_efficiency: float = Field(0.85, gt=0, le=1)
    """Fraction of HBM bandwidth reached by memory-bound kernels (STREAM 85-90%; ref §7.2 rule 1)."""
    elementwise_factor: NonNegativeFloat = 1.0
    """Multiplier on the modelled elementwise traffic (norms, activations, residuals, rotary)."""
    scaleup_efficiency: float = Field(0.82, gt=0, le=1)
    """Ring all-reduce/all-gather/reduce-scatter bus bandwidth over NVLink as a fraction of the
    unidirectional spec (H100 ~370 of 450 GB/s; ref §6.2)."""
    nvls_allreduce_factor: PositiveFloat = 1.0
    """All-reduce bus bandwidth / spec when NVLink SHARP applies (H100/H200 1.06, B200 0.93; ref §6.2);
    1.0 where the GPU has no NVLS."""
    nic_efficiency: float = Field(0.92, gt=0, le=1)
    """Per-NIC ring bandwidth as a fraction of line rate (NDR 46-48 of 50 GB/s; ref §6.2)."""
    latency_base_us: NonNegativeFloat = 14.0
    """Base latency of one collective (NCCL ring LL128 base; ref §5.2)."""
    latency_intra_hop_us: NonNegativeFloat = 1.9
    """Latency per ring step over NVLink (NCCL LL128; ref §5.2)."""
    latency_inter_hop_us: NonNegativeFloat = 4.0
    """Latency per ring step over the network (NCCL LL128; ref §5.2)."""
    ep_overlap: float = Field(0.0, ge=0, le=1)
    """Fraction of expert-parallel all-to-alls hidden behind compute."""
    dp_overlap: float = Field(1.0, ge=0, le=1)
    """Fraction of the overlappable compute (backward of the last micro-batch; forward of the
    first for parameter gathers) that actually hides data-parallel communication (ref §5.6)."""
    overlap_sm_fraction: float = Field(0.18, ge=0, lt=1)
    """Share of the GPU's SMs that NCCL kernels take while they overlap compute: hidden
    communication still slows compute by this fraction of its duration. An NCCL all-gather on
    H100 launched 24 thread blocks, i.e. 24 of 132 SMs (NVIDIA developer forum thread 337991,
    "Compute-Communication Overlap Causes Severe GEMM Performance Degradation")."""
    step_overhead_ms: NonNegativeFloat = 0.0
    """Fixed time per step outside the model (data loading, logging, launch gaps), milliseconds."""
    host_link_efficiency: float = Field(0.8, gt=0, le=1)
    """Share of the host link's per-direction spec (`GPUSpec.host_link_gb_per_s`) that pinned
    host<->device copies reach, the rate activation and optimizer offload move at. Assumption
    from CUDA `bandwidthTest` pinned-memory figures [recalled]: PCIe Gen4 x16 ~25-26 of 32 GB/s,
    Gen5 x16 ~50-55 of 64 GB/s; not measured by the project."""
    cpu_adam_params_per_s: PositiveFloat = 1.1e8
    """Parameters per second the host's CPU Adam step updates for one GPU (optimizer offload).
    ZeRO-Offload (Ren et al. 2021, arXiv 2101.06840, CPU-Adam latency table): about 1.1 s per
    1e9 parameters with the whole host's cores [recalled], i.e. ~0.9e9/s per host, shared by the
    8 GPU processes of a node: ~1.1e8/s per GPU. Set it to the host's measured rate."""
    moe_host_overhead_us: NonNegativeFloat = 1000.0
    """Host time per MoE layer, micro-batch and pass pair (forward + backward) that the GPU waits
    for with dynamic-shape (dropless) routing: the dispatcher copies the tokens-per-expert counts
    to the host (Megatron `_maybe_dtoh_and_synchronize`), so the CPU cannot run ahead and the
    layer's remaining kernel launches (~40 forward, ~80 backward in the alltoall path, ~10 us each
    in PyTorch eager [derived: kernel counts of Megatron's router, permute, dispatcher and grouped
    MLP]) are exposed. Removed by static shapes (capacity routing, HybridEP buffers) and CUDA
    graphs (`cost.moe_layer.host_overhead`). Fitted per stack."""
    grouped_gemm_expert_us: NonNegativeFloat = 4.0
    """Fixed time per local expert in a grouped GEMM (each expert's GEMM ends in its own partial
    wave of tiles), microseconds; the same floor as `gemm_overhead_us` (reference §7.2 rule 3:
    5-10 us per kernel, 1024^3 FP8 GEMMs at 14 % of peak)."""
    moe_dropless_imbalance: float = Field(1.1, ge=1.0, le=8.0)
    """Tokens on the busiest expert-parallel rank over the balanced share, with dropless routing
    and an auxiliary load-balancing loss (the slowest rank paces every all-to-all). Assumption:
    per-expert max violations of 0.04-0.7 with loss-free vs auxiliary-loss balancing [recalled:
    Wang et al. 2024, arXiv 2408.15664], averaged over a rank's E / ep experts; not measured by
    the project. Forced balancing (benchmarks) is 1."""
    memory_overhead_gib: NonNegativeFloat = 0.0
    """Fixed per-GPU memory inside the caching allocator beyond the ledger's items and the GEMM
    workspaces the ledger computes from the GPU generation and the stack (PyTorch's cuBLAS and
    Transformer Engine's cuBLASLt workspaces, 12-64 MiB; `cost.device_memory.workspace_bytes`);
    0 by default: a job with extra fixed buffers (e.g. DeepSpeed's bucket sizes) sets it. (It was a
    1.0 GiB budget from ref §3.6's 0.5-2 GB for the context and workspaces together; PyTorch's and
    TE's sources give the workspaces, the context is outside the allocator, `cost.device_memory`.)"""


class GPUSpec(Spec):
    """One accelerator kind, dense (no sparsity) peaks."""

    name: str
    """Preset name, e.g. `h100`."""
    description: str = ""
    """Marketing name and form factor."""
    bf16_tflops: PositiveFloat
    """Dense BF16 peak, TFLOP/s (the 16-bit tensor peak: FP16 where the GPU has no BF16)."""
    fp32_tflops: PositiveFloat | None = None
    """FP32 peak without tensor cores (CUDA cores), TFLOP/s: PyTorch runs an fp32 matmul there
    (`torch.backends.cuda.matmul.allow_tf32` is False by default), e.g. Megatron's fp32 MoE
    router (`--moe-router-dtype fp32`). None: such GEMMs are costed at the BF16 rate."""
    bf16: bool = True
    """Whether the tensor cores take BF16 (Volta has FP16 only: `--precision fp16`)."""
    fp8_tflops: PositiveFloat | None = None
    """Dense FP8 peak, TFLOP/s (None where the GPU has no FP8 tensor cores)."""
    fp4_tflops: PositiveFloat | None = None
    """Dense FP4 (NVFP4) peak, TFLOP/s (None where the GPU has no FP4 tensor cores)."""
    block_scaling: bool = False
    """Whether the tensor cores apply MX/NVFP4 block scales in hardware (Blackwell)."""
    generation: Literal["volta", "ampere", "hopper", "blackwell", "cdna3", "other"] = "other"
    """Architecture generation: selects a stack's attention kernel and which profile of a stack
    is the nearest when the stack has none fitted on this GPU."""
    sfu_exp_tera_per_s: PositiveFloat | None = None
    """Exponentials per second the special function units retire (MUFU.EX2), 10^12/s: the
    softmax of fused attention runs on them (`cost.compute.attention_time`); None = not
    modelled (attention at its matmul efficiency only)."""
    hbm_gib: PositiveFloat
    """HBM capacity, GiB."""
    hbm_tb_per_s: PositiveFloat
    """HBM bandwidth, TB/s."""
    scaleup_gb_per_s: PositiveFloat
    """Scale-up (NVLink/xGMI) bandwidth per GPU, one direction, GB/s."""
    scaleup_domain: PositiveInt = 8
    """GPUs that share the scale-up fabric (8 for HGX boards, 72 for GB200 NVL72)."""
    scaleup_fabric: Literal["switch", "mesh"] = "switch"
    """How the scale-up links join the domain. `switch` (NVSwitch): each GPU's whole
    `scaleup_gb_per_s` reaches any peer, so a group of any size inside the domain gets it.
    `mesh` (point-to-point links, one per peer: AMD xGMI): `scaleup_gb_per_s` is the sum of the
    domain - 1 links, and a group of g GPUs inside the domain uses only its g - 1 links."""
    scaleup_spans_nodes: bool = False
    """Whether the scale-up domain joins several nodes (GB200 NVL72: 18 trays of 4 GPUs behind
    NVLink switches). False (HGX/DGX boards, MI300X platforms): NVLink stops at the node, so a
    node of fewer GPUs than `scaleup_domain` is a domain of its own size."""
    gpus_per_node: PositiveInt = 8
    """GPUs per node (the server, or the compute tray of a rack) this GPU comes in: the default
    of `--gpus-per-node`, so that jobs come in whole nodes and launcher files ask for the
    node's GPUs. HGX/DGX boards hold 8; a GB200/GB300 NVL72 rack is 18 compute trays of 4."""
    nic_gbit_per_s: PositiveFloat
    """Scale-out network bandwidth per GPU, Gbit/s."""
    host_link_gb_per_s: PositiveFloat | None = None
    """GPU <-> host (CPU memory) link, one direction, GB/s: PCIe or NVLink-C2C. Prices activation
    and optimizer offload; None = unknown (offload then cannot be costed on this GPU)."""
    nvls: bool = False
    """Whether all-reduce inside the scale-up domain can use NVLink SHARP."""
    tdp_w: PositiveFloat | None = None
    """Maximum board power (TDP) of one GPU, watts (energy estimates of `autoparallel capacity`)."""
    profile: dict[str, float] = Field(default_factory=dict)
    """Overrides of `Profile` defaults that apply to this GPU (calibrated where the preset says so)."""
    reference_profile: dict[str, float] | None = None
    """The knobs' literature values before calibration (hardware measurements, reference §6-§8):
    the start point and prior centre of `autoparallel calibrate`, so that a fit (or a
    leave-one-source-out check) never starts from numbers already fitted to the runs it is
    judged on. Defaults to `profile`."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Where each number comes from (field -> citation)."""

    @model_validator(mode="after")
    def _check_profile_keys(self) -> GPUSpec:
        unknown = (set(self.profile) | set(self.reference_profile or {})) - set(Profile.model_fields)
        if unknown:
            raise ValueError(
                f"unknown profile knob(s) {sorted(unknown)}; known: {sorted(Profile.model_fields)}"
            )
        for table, knobs in (("profile", self.profile), ("reference_profile", self.reference_profile)):
            try:
                Profile(**(knobs or {}))
            except ValidationError as exc:  # name the knob, its value and its range
                err = exc.errors()[0]
                knob = ".".join(str(p) for p in err["loc"])
                raise ValueError(f"`{table}.{knob}` = {err.get('input')!r}: {err['msg']}") from None
        return self

    def default_profile(self) -> Profile:
        """The efficiency profile with this GPU's overrides applied."""
        return Profile(**self.profile)

    def reference(self) -> Profile:
        """The uncalibrated (literature) profile of this GPU: `reference_profile`, else `profile`."""
        return Profile(**(self.profile if self.reference_profile is None else self.reference_profile))


class ClusterSpec(Spec):
    """How many GPUs of one kind, and how they are grouped into nodes."""

    gpu: GPUSpec
    """The GPU kind."""
    n_gpus: PositiveInt = Field(le=MAX_GPUS)
    """GPUs in the job (at most 2^20, `limits.MAX_GPUS`)."""
    gpus_per_node: PositiveInt = 8
    """GPUs per server."""
    intra_gb_per_s: PositiveFloat | None = None
    """Override of the scale-up bandwidth per GPU (GB/s, one direction)."""
    inter_gb_per_s: PositiveFloat | None = None
    """Override of the network bandwidth per GPU (GB/s)."""
    intra_latency_us: NonNegativeFloat | None = None
    """Override of the per-step latency inside the scale-up domain (microseconds)."""
    inter_latency_us: NonNegativeFloat | None = None
    """Override of the per-step latency across the network (microseconds)."""
    network: NetworkSpec | None = None
    """The network's tiers (`autoparallel presets networks`); None: two levels, the GPU's
    scale-up domain and one flat network of its NICs."""

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        if self.n_gpus > self.gpus_per_node and self.n_gpus % self.gpus_per_node:
            raise ValueError(
                f"`n_gpus` ({self.n_gpus}) is not a multiple of `gpus_per_node` "
                f"({self.gpus_per_node}): jobs use whole nodes; try "
                f"{self.n_gpus // self.gpus_per_node * self.gpus_per_node} or "
                f"{(self.n_gpus // self.gpus_per_node + 1) * self.gpus_per_node}"
            )
        board = self._board_domain()
        if board < self.gpus_per_node and self.gpus_per_node % board:
            raise ValueError(
                f"`scaleup_domain` ({self.gpu.scaleup_domain}) of {self.gpu.name}: a node of "
                f"{self.gpus_per_node} GPUs does not split into whole scale-up domains of "
                f"{board}; give a domain that divides the node (or --gpus-per-node a multiple "
                "of it)")
        if self.network is not None:
            domain = self.nvlink_domain
            first = self.network.tiers[0].size
            if first is not None and first > self._board_domain():
                raise ValueError(
                    f"`network.tiers[0].size` = {first}: larger than the {self.gpu.name} scale-up "
                    f"domain of {self._board_domain()} GPUs ({self.gpus_per_node} per node); a "
                    "network tier cannot widen NVLink (leave it out for the GPU's domain)")
            below = domain
            for i, t in enumerate(self.network.tiers[1:-1], start=1):
                if t.size % below:
                    raise ValueError(
                        f"`network.tiers[{i}].size` = {t.size} ({t.name}): not a whole number of "
                        f"the {below}-GPU units below it (the {self.gpu.name} domain with "
                        f"{self.gpus_per_node} GPUs per node is {domain}); choose a network whose "
                        "units hold whole NVLink domains")
                below = t.size
        return self

    def _board_domain(self) -> int:
        gpn, dom = self.gpus_per_node, self.gpu.scaleup_domain
        if self.gpu.scaleup_spans_nodes and gpn < dom:
            return dom // gpn * gpn
        return min(gpn, dom)

    @property
    def nvlink_domain(self) -> int:
        """GPUs reachable over the scale-up fabric from any GPU (at most the whole job).

        Node and domain are kept apart: on boards whose NVLink stops at the node
        (`GPUSpec.scaleup_spans_nodes` false: HGX/DGX, MI300X) the domain is the node, at most
        the GPU's `scaleup_domain` (a 4-GPU H100 node is a 4-GPU domain); where the domain joins
        nodes (NVL72 racks of 4-GPU trays) it is the GPU's `scaleup_domain` in whole nodes."""
        domain = self._board_domain()
        if self.network is not None and self.network.tiers[0].size is not None:
            domain = min(domain, self.network.tiers[0].size)  # a partitioned domain (NVL4 of 72)
        return min(domain, self.n_gpus)

    @property
    def intra_bytes_per_s(self) -> float:
        """Scale-up bandwidth per GPU, bytes/s (spec, before efficiency)."""
        return (self.intra_gb_per_s or self.gpu.scaleup_gb_per_s) * 1e9

    @property
    def inter_bytes_per_s(self) -> float:
        """Network bandwidth per GPU, bytes/s (spec, before efficiency)."""
        if self.inter_gb_per_s is not None:
            return self.inter_gb_per_s * 1e9
        return self.gpu.nic_gbit_per_s * 1e9 / 8
