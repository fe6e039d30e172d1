"""`Exporter`: the contract every launcher target follows, and `Job`, the launch numbers derived
once from a (problem, layout) pair.

An exporter first lists what its launcher cannot express (`check`); `render` refuses with
those reasons rather than writing a file that would launch a different layout. Facts about
each launcher (flag names, defaults, validation) come from the project's launcher reference
`launchers.md` (read from each launcher's source at the commits it names; summarised in
`docs/export.md`); each module cites the section it follows.
"""

from __future__ import annotations

import textwrap
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ExportError
from ..specs.layout import Layout, Recompute, Schedule
from ..specs.problem import Problem

HARD_RULES = ("world", "heads", "layers", "seq", "batch", "interleave", "schedule", "experts",
              "cp_heads", "cp_window")
"""autoparallel's own feasibility rules that every launcher shares (launchers.md §7 items 1-3, 5,
6, 9, 11). `tp_in_node` and `ep_in_node` are performance rules, not launcher limits: a layout
that breaks them is still exported."""


@dataclass(frozen=True)
class Job:
    """The numbers every launcher file is written from (derived once, checked by the caller)."""

    problem: Problem
    layout: Layout
    """The layout with `dp` and `sp` resolved against the GPU count."""
    n_gpus: int
    """GPUs in the job (world size)."""
    n_nodes: int
    """Nodes the job occupies."""
    gpus_per_node: int
    """Processes (GPUs) started per node: `torchrun --nproc-per-node`."""
    micro_batches: int
    """Micro-batches per optimizer step per data-parallel replica, M = GBS / (MBS x DP): Megatron's
    num_microbatches, DeepSpeed's gradient_accumulation_steps, Nanotron's
    batch_accumulation_per_replica (launchers.md §7 item 3)."""

    @classmethod
    def of(cls, problem: Problem, layout: Layout) -> Job:
        """Resolve `layout` against `problem`'s cluster and derive the launch numbers."""
        n = problem.cluster.n_gpus
        lay = layout.resolved(n)
        per_node = min(problem.cluster.gpus_per_node, n)
        nodes = max(1, -(-n // per_node))
        m = problem.training.global_batch // max(1, lay.dp * lay.micro_batch)
        return cls(problem, lay, n, nodes, per_node, m)

    @property
    def layers_per_virtual_stage(self) -> int:
        """Transformer layers in one model chunk, L / (PP x VP) (0 when that does not divide)."""
        chunks = self.layout.pp * self.layout.vp
        layers = self.problem.model.n_layers
        return layers // chunks if layers % chunks == 0 else 0

    @property
    def data_group(self) -> int:
        """Size of the group ZeRO shards over in autoparallel's cost model: DP x CP."""
        return int(self.layout.dp) * self.layout.cp

    @property
    def header(self) -> list[str]:
        """Comment lines (without the comment marker) naming the problem and the layout."""
        p, lay = self.problem, self.layout
        nodes = f"{self.n_nodes} node{'s' if self.n_nodes > 1 else ''}"
        return [
            f"autoparallel export: {p.model.name} on {self.n_gpus} x {p.cluster.gpu.name} "
            f"({nodes} x {self.gpus_per_node} GPUs)",
            f"layout {lay.slug}; seq {p.training.seq_len}, global batch "
            f"{p.training.global_batch}, {self.micro_batches} micro-batches per step per replica",
        ]


def comments(lines: list[str], marker: str = "#", width: int = 99) -> list[str]:
    """Comment lines wrapped at `width` columns; wrapped parts are indented by two spaces."""
    out = []
    for line in lines:
        out += textwrap.wrap(line, width, initial_indent=f"{marker} ",
                             subsequent_indent=f"{marker}   ", break_on_hyphens=False,
                             break_long_words=False)
    return out


def common_reasons(job: Job) -> list[str]:
    """Reasons shared by every target: the layout breaks one of autoparallel's hard rules (the
    rules every launcher applies too), one reason per rule with the values involved."""
    from ..cost.model_arch import build_arch
    from ..evaluate import _layout_error
    from ..layouts import LayoutTable
    from ..rules import RULE_BY_NAME, check_rules

    rules = tuple(RULE_BY_NAME[name] for name in HARD_RULES)
    table = LayoutTable.from_layouts([job.layout], job.n_gpus, job.problem.model.n_layers)
    flags = int(check_rules(job.problem, build_arch(job.problem.model), table, rules)[0])
    return [
        _layout_error(job.problem, job.layout, int(rule.flag)).removeprefix("layout: ")
        for rule in rules if flags & int(rule.flag)
    ]


class Exporter(ABC):
    """One launcher target: a name, a file suffix, what it cannot express, and the file text."""

    name: ClassVar[str]
    """Target name used by `--target` and `render(target, ...)`."""
    suffix: str
    """File suffix of the rendered text (`.sh`, `.toml`, `.py`, `.json`, `.yaml`)."""
    summary: str
    """One line: what the rendered file is."""

    schedules: ClassVar[tuple[Schedule, ...]] = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
    """Pipeline schedules the launcher file can select."""
    uneven_splits: ClassVar[bool] = False
    """Whether the launcher file can give the first and last stage their own layer counts."""
    partial_recompute: ClassVar[bool] = False
    """Whether the launcher file can fully recompute only the first N layers of each model
    chunk (`Layout.recompute_layers`; Megatron `--recompute-method block`)."""

    named_recompute: ClassVar[bool] = False
    """Whether the launcher file can name the modules selective recompute re-runs and group full
    recompute uniformly (`Layout.recompute_modules`, `recompute_group`; Megatron
    `--recompute-modules`, `--recompute-method uniform --recompute-num-layers N`)."""
    activation_offload: ClassVar[bool] = False
    """Whether the launcher file can offload layers' activations (`Layout.offload_layers`)."""
    module_offload: ClassVar[bool] = False
    """Whether the launcher file can offload named modules' inputs (the job's
    `offload_modules`; Megatron `--fine-grained-activation-offloading --offload-modules`)."""
    optimizer_offload: ClassVar[bool] = False
    """Whether the launcher file can offload optimizer state (`Layout.optimizer_offload`);
    `offload_reasons` adds the target's own conditions."""

    ignores: ClassVar[tuple[str, ...]] = ("mb",)
    """Layout-table columns (`layouts.COLUMNS`) the target's own reasons (`pipeline_reasons`,
    `offload_reasons`, `limits`) do not read, so `exporters.launchable` decides rows that differ
    only in them together; the micro-batch enters only the batch and interleaving rules, which
    are hard rules (`HARD_RULES`). tests/test_export.py checks each target's declaration."""

    trains_hybrid: ClassVar[bool] = False
    """Whether the launcher can train a hybrid model (`ModelSpec.layers`: Mamba-2 / gated
    DeltaNet layers); the others refuse it with the reason."""

    def check(self, problem: Problem, layout: Layout, *, rules_passed: bool = False) -> list[str]:
        """Reasons this target cannot launch `layout` for `problem` (empty when it can);
        `rules_passed`: the caller has checked autoparallel's hard rules (`HARD_RULES`) on the
        layout already, so only the target's own reasons are looked for."""
        job = Job.of(problem, as_launched(problem, layout))
        reasons = [] if rules_passed else common_reasons(job)
        reasons += self.pipeline_reasons(job) + self.offload_reasons(job)
        if problem.model.layers is not None and not self.trains_hybrid:
            reasons.append(f"{self.name} cannot train a hybrid model: it builds transformer "
                           "blocks only (no Mamba-2 or gated DeltaNet layers); use --target "
                           "megatron (pretrain_mamba.py)")
        return reasons + [r for r in self.limits(job) if r not in reasons]

    def offload_reasons(self, job: Job) -> list[str]:
        """Named recompute modules, uniform recompute groups and offload, where this target
        cannot write them (the targets that can are named)."""
        lay, out = job.layout, []
        if lay.recompute_modules is not None and not self.named_recompute:
            mods = ",".join(str(getattr(m, "value", m)) for m in lay.recompute_modules)
            out.append(f"selective recompute of the modules {mods}: {self.name} cannot name "
                       "them (megatron and slurm write --recompute-modules)")
        if lay.recompute_group is not None and not self.named_recompute:
            out.append(f"full recompute in uniform groups of {lay.recompute_group} layers: "
                       f"{self.name} checkpoints each layer (megatron and slurm write "
                       "--recompute-method uniform --recompute-num-layers)")
        if lay.offload_layers and not self.activation_offload:
            out.append(f"activation offload of {lay.offload_layers} layers: {self.name} has no "
                       "layer activation offload here (megatron and slurm write "
                       "--cpu-offloading-num-layers)")
        mods = job.problem.training.offload_modules
        if mods != "none" and not self.module_offload:
            out.append(f"fine-grained activation offload of {mods.replace('+', ', ')}: "
                       f"{self.name} cannot offload modules' inputs (megatron and slurm write "
                       "--fine-grained-activation-offloading --offload-modules)")
        if lay.optimizer_offload and not self.optimizer_offload:
            out.append(f"optimizer offload ({lay.optimizer_offload:g} of the state): "
                       f"{self.name} cannot offload the optimizer state alone here (megatron "
                       "and slurm write --optimizer-cpu-offload, deepspeed offload_optimizer)")
        return out

    def pipeline_reasons(self, job: Job) -> list[str]:
        """The layout's schedule or uneven split, where this target cannot write them."""
        lay, out = job.layout, []
        sch = lay.pipeline_schedule
        if sch not in self.schedules:
            out.append(f"schedule `{sch.value}`: {self.name} can select only "
                       f"{', '.join(s.value for s in self.schedules)}")
        if lay.stage_layers and not self.uneven_splits:
            out.append(f"uneven pipeline split {lay.stage_layers}: {self.name} splits the layers "
                       "evenly here")
        if lay.recompute_layers is not None and not self.partial_recompute:
            out.append(f"full recompute of the first {lay.recompute_layers} layers of each model "
                       f"chunk: {self.name} recomputes every layer or none here (megatron and "
                       "slurm write --recompute-method block)")
        return out

    def render(self, problem: Problem, layout: Layout) -> str:
        """The launcher file for `layout`. Raises `ExportError` (with the reasons) when the target
        cannot express it."""
        reasons = self.check(problem, layout)
        if reasons:
            raise ExportError(f"{self.name} cannot launch {layout.resolved(problem.cluster.n_gpus).slug}: "
                              + "; ".join(reasons))
        return self.text(Job.of(problem, as_launched(problem, layout)))

    def companion(self, job: Job) -> str | None:
        """A note that travels with the file when the file format has no comments (what the
        model code or the launch must provide); None when everything is in the file."""
        return None

    @abstractmethod
    def limits(self, job: Job) -> list[str]:
        """Target-specific reasons (the hard rules are already checked)."""

    @abstractmethod
    def text(self, job: Job) -> str:
        """The file text; only called for a job that passed `check`."""


ROPE_DEFAULT_BASE = 10000.0
"""Rotary base written for a RoPE model whose spec gives none: RoFormer's value (Su et al. 2021,
arXiv 2104.09864 §3.2.2), also Megatron-LM's `--rotary-base` default (launchers.md §1)."""


@dataclass(frozen=True)
class Architecture:
    """What a launcher needs beyond the shapes to build the planned model.

    `ModelSpec` records the shapes and the MLP type; the rest follows the model family, as in
    every preset and Hugging Face config autoparallel reads: gated-SiLU (SwiGLU) models are the
    Llama / Mistral / Qwen / DeepSeek family (RMSNorm, rotary positions, no linear biases; Llama
    paper, Touvron et al. 2023, arXiv 2302.13971 §2.2), GeLU models the GPT-2/3 family (LayerNorm,
    learned absolute positions, biased linears; Radford et al. 2019, Brown et al. 2020 §2.1),
    unless the spec says otherwise (`ModelSpec.linear_bias`: gpt-oss is gated and biased).
    """

    norm: str
    """`RMSNorm` or `LayerNorm`."""
    rope_theta: float | None
    """Rotary base; None for learned absolute position embeddings."""
    rope_assumed: bool
    """True when the spec gave no `rope_theta` and `ROPE_DEFAULT_BASE` is used."""
    bias: bool
    """Whether the linear layers carry biases."""
    gated: bool
    """SwiGLU (gated SiLU) MLP; GeLU otherwise."""


def architecture(job: Job) -> Architecture:
    """The model definition facts every exporter writes (see `Architecture`)."""
    m = job.problem.model
    gated = m.activation == "swiglu"
    rope = m.rope_theta if m.rope_theta is not None else (ROPE_DEFAULT_BASE if gated else None)
    bias = m.linear_bias if m.linear_bias is not None else not gated  # ModelSpec.linear_bias
    return Architecture(norm="RMSNorm" if gated else "LayerNorm", rope_theta=rope,
                        rope_assumed=gated and m.rope_theta is None, bias=bias, gated=gated)


def dp_bucket_params(job: Job) -> int:
    """Parameters per data-parallel gradient bucket the time model assumes (Megatron DDP's
    default, max(4e7, 1e6 x DP x CP); `cost.time.DDP_BUCKET_PARAMS`, reference §0)."""
    from ..cost.time import DDP_BUCKET_PARAMS

    return int(max(DDP_BUCKET_PARAMS, 1e6 * job.data_group))


def as_launched(problem: Problem, layout: Layout) -> Layout:
    """`layout` as the launcher file writes it: the balanced uneven split filled in where pp x vp
    does not divide the layers and none is given (`splits.with_default_split`, the split
    `plan` and `estimate` take), a whole partial recompute written whole (`whole_recompute`)."""
    from ..splits import with_default_split

    return whole_recompute(problem, with_default_split(problem, layout)[0])


def whole_recompute(problem: Problem, layout: Layout) -> Layout:
    """`layout` with a partial full recompute that is in fact whole written as such: N at least
    the largest model chunk's layers is full recompute of every layer, N = 0 no recompute (the
    cost model prices both exactly alike), so every target can launch them."""
    n = layout.recompute_layers
    if n is None:
        return layout
    L = problem.model.n_layers
    per_stage = max(layout.stage_layers) if layout.stage_layers else -(-L // layout.pp)
    if n == 0:
        return layout.model_copy(update={"recompute": Recompute.NONE, "recompute_layers": None})
    if n >= -(-per_stage // layout.vp):
        return layout.model_copy(update={"recompute_layers": None})
    return layout


def recompute_of(job: Job) -> Recompute:
    """The layout's recompute choice as the enum."""
    return Recompute(job.layout.recompute)
