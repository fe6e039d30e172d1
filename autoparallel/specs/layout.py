"""One parallel layout (`Layout`) and its slug form `dp8-tp4-pp2-vp1-cp1-ep1-z1-rnone-sp-mb1`.

Expert layers fold onto the same ranks as attention (Megatron-Core MoE Parallel Folding, arXiv
2504.14960): attention runs TP x CP x DP (x PP), the experts ETP x EP x EDP (x PP) with
ETP x EP x EDP = TP x CP x DP, so EP may exceed DP. An expert-TP degree other than TP shows
as `-etpN` after the ep part (`...-ep64-etp1-z1-...`); without it ETP = TP (Megatron's default).

An uneven pipeline split shows in the pp part, `pp16[7,8x14,7]` (layers per pipeline stage, first
to last, `8x14` = fourteen stages of 8), the context-parallel form in the cp part when cp > 1,
`cp8:ring`, `cp8:a2a`, `cp8:allgather`, `cp8:a2a2+ring4` (`CpComm`), and a schedule other
than the default (1F1B, or interleaved 1F1B when vp > 1) as a last part, e.g. `-szbh1`,
`-sdualpipe`."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from ._base import Spec


class Recompute(StrEnum):
    """Activation recomputation: the strings are Megatron's `--recompute-granularity` values."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class RecomputeModule(StrEnum):
    """A submodule that selective recompute re-runs (Megatron-Core `--recompute-modules`, the
    names of `TransformerConfig.recompute_modules` for transformer layers; its default is
    `core_attn` alone). Activation bytes each one frees: `cost.memory.module_saved_bytes`."""

    CORE_ATTN = "core_attn"
    """Core attention: frees what it stores inside (the eager scores)."""
    LAYERNORM = "layernorm"
    """input_layernorm and pre_mlp_layernorm outputs (the QKV and FC1 inputs)."""
    MLP = "mlp"
    """The dense MLP: frees its FC1 output and FC2 input."""
    MOE_ACT = "moe_act"
    """The MoE experts' activation function: frees the expert FC2 inputs."""
    MOE = "moe"
    """The whole MoE layer: frees its router probabilities, routed and shared experts' tensors."""
    SHARED_EXPERTS = "shared_experts"
    """The MoE layer's shared experts."""
    MLA_UP_PROJ = "mla_up_proj"
    """MLA up-projections and RoPE: frees the Q, K and V they produce (MLA models only)."""


MODULE_BITS = {m: 1 << i for i, m in enumerate(RecomputeModule)}
"""Bit of each module in the layout table's `rm` column (0 = Megatron's default, core_attn)."""


def modules_mask(modules) -> int:
    """`rm` bitmask of a module list (None = 0, the default)."""
    return 0 if modules is None else sum(MODULE_BITS[RecomputeModule(m)] for m in set(modules))


def mask_modules(mask: int) -> list[RecomputeModule] | None:
    """Module list of an `rm` bitmask, in declaration order (0 = None, the default)."""
    return [m for m, bit in MODULE_BITS.items() if mask & bit] or None


RECOMPUTE_CODES = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}
"""Integer codes used in the vectorised layout table."""
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}


class Schedule(StrEnum):
    """Pipeline schedule (cost-model reference §3.3, §4)."""

    ONE_F_ONE_B = "1f1b"
    """PipeDream-flush 1F1B (Narayanan et al. 2021), one model chunk per rank."""
    INTERLEAVED = "interleaved"
    """Interleaved 1F1B, vp > 1 model chunks per rank (Narayanan et al. 2021)."""
    ZB_H1 = "zb-h1"
    """Zero-bubble ZB-H1: backward split into input- and weight-gradient passes, weight passes
    fill the drain (Qi et al. 2023, arXiv 2401.10241); one chunk per rank."""
    ZBV = "zbv"
    """Zero-bubble V schedule: two chunks per rank in a V (Qi et al. 2024, arXiv 2405.15362)."""
    DUALPIPE = "dualpipe"
    """DualPipe: micro-batches enter from both ends; each rank holds stages i and p-1-i (2x
    parameters) (DeepSeek-V3 report, arXiv 2412.19437, Table 2)."""
    DUALPIPEV = "dualpipev"
    """DualPipeV: DualPipe folded into a V, two chunks per rank, one parameter copy."""


class CpComm(StrEnum):
    """How context parallelism exchanges what attention needs across the CP ranks (Megatron-Core
    `--cp-comm-type p2p|a2a|allgather|a2a+p2p`; costs in `cost.context`)."""

    RING = "ring"
    """Ring attention: K, V chunks passed around the CP ring, each hop hidden behind one block
    of attention (Liu et al. 2023, arXiv 2310.01889; Megatron-Core `p2p`, TE
    `AttnFuncWithCPAndKVP2P`)."""
    A2A = "a2a"
    """DeepSpeed-Ulysses: all-to-alls trade the sequence split for a head split before attention
    and back after it (Jacobs et al. 2023, arXiv 2309.14509; Megatron-Core `a2a`)."""
    ALLGATHER = "allgather"
    """All-gather K and V, then attend the local queries (Llama 3 report, arXiv 2407.21783,
    Sec. 3.3.2; Megatron-Core `allgather`)."""
    A2A_RING = "a2a+ring"
    """Hierarchical: all-to-all over groups of `cp_a2a` ranks (heads), ring across the
    cp / cp_a2a groups (sequence) (Megatron-Core `a2a+p2p`, TE: LongVILA / USP)."""


CP_COMM_CODES = {form: i for i, form in enumerate(CpComm)}
"""Integer codes used in the vectorised layout table (0 ring, 1 a2a, 2 allgather, 3 a2a+ring)."""
CP_COMM_NAMES = {v: k for k, v in CP_COMM_CODES.items()}


SCHEDULE_CODES = {sch: i for i, sch in enumerate(Schedule)}
"""Integer codes used in the vectorised layout table (0 1f1b, 1 interleaved, 2 zb-h1, 3 zbv,
4 dualpipe, 5 dualpipev)."""
SCHEDULE_NAMES = {v: k for k, v in SCHEDULE_CODES.items()}
V_SCHEDULES = (Schedule.ZBV, Schedule.DUALPIPEV)
"""Schedules that place exactly two model chunks per rank in a V (vp = 2)."""


def default_schedule(vp: int) -> Schedule:
    """The schedule a layout without one runs: 1F1B, or interleaved 1F1B when vp > 1."""
    return Schedule.INTERLEAVED if vp > 1 else Schedule.ONE_F_ONE_B


def stage_layers_slug(stage_layers) -> str:
    """`[7,8x14,7]`: layers per stage with runs of equal middle stages compressed."""
    parts, i = [], 0
    while i < len(stage_layers):
        j = i
        while j + 1 < len(stage_layers) and stage_layers[j + 1] == stage_layers[i]:
            j += 1
        run = j - i + 1
        parts.append(f"{stage_layers[i]}x{run}" if run > 1 else str(stage_layers[i]))
        i = j + 1
    return "[" + ",".join(parts) + "]"


def parse_stage_layers(text: str) -> list[int]:
    """`7,8x14,7` (or with brackets) -> [7, 8, ..., 8, 7]; ValueError when malformed."""
    out: list[int] = []
    for part in text.strip().strip("[]").split(","):
        m = re.fullmatch(r"\s*(\d+)(?:x(\d+))?\s*", part)
        if not m:
            raise ValueError(f"stage layers {text!r}: expected e.g. 7,8x14,7 or 7,8,8,7")
        out += [int(m[1])] * int(m[2] or 1)
    return out


class Layout(Spec):
    """Degrees of each parallel axis plus memory-saving choices. Degree 1 means the axis is off.

    `dp` may be left out: it is derived from the GPU count (`n_gpus / (tp*pp*cp)`).
    Expert layers fold onto the attention grid (MoE Parallel Folding, arXiv 2504.14960): their
    ETP x EP x EDP ranks are the attention's TP x CP x DP ranks of a pipeline stage, so EP and
    ETP do not enter that product and `edp` = tp x cp x dp / (etp x ep) is derived; with the
    default ETP = TP, EP is carved out of DP x CP (Megatron's convention before folding).
    """

    dp: PositiveInt | None = None
    """Data-parallel degree (derived when omitted)."""
    tp: PositiveInt = 1
    """Tensor-parallel degree."""
    pp: PositiveInt = 1
    """Pipeline-parallel degree."""
    vp: PositiveInt = 1
    """Virtual pipeline stages (model chunks) per pipeline rank; >1 means interleaved 1F1B."""
    cp: PositiveInt = 1
    """Context-parallel degree (the sequence split over cp ranks)."""
    cp_comm: CpComm | None = None
    """With cp > 1: how the CP ranks exchange what attention needs (`CpComm`); None = ring
    (Megatron-Core's default `--cp-comm-type p2p`)."""
    cp_a2a: PositiveInt | None = None
    """With cp_comm = a2a+ring: ranks of each all-to-all group (Megatron-Core
    `--hierarchical-context-parallel-sizes cp_a2a cp/cp_a2a`), a divisor of cp between 1 and cp;
    the ring runs across cp / cp_a2a groups."""
    ep: PositiveInt = 1
    """Expert-parallel degree (MoE only): etp x ep divides tp x cp x dp (parallel folding)."""
    etp: PositiveInt | None = None
    """Expert tensor-parallel degree (MoE only; Megatron `--expert-tensor-parallel-size`);
    None = tp, Megatron's default."""
    zero: Literal[0, 1, 2, 3] = 1
    """ZeRO stage over the data-parallel group: 1 = distributed optimizer, 3 = FSDP full shard."""
    recompute: Recompute = Recompute.NONE
    """Activation recomputation."""
    sp: bool | None = None
    """Sequence parallelism with TP; defaults to on when tp > 1 (off, and meaningless, at tp = 1)."""
    micro_batch: PositiveInt = 1
    """Sequences per micro-batch."""
    stage_layers: list[PositiveInt] | None = None
    """Transformer layers per pipeline stage, first to last (pp values; first and last may
    differ, the middle stages are equal, as Megatron-Core's `--decoder-first/last-pipeline-
    num-layers`); None = the even split n_layers / pp."""
    schedule: Schedule | None = None
    """Pipeline schedule; None = 1F1B, or interleaved 1F1B when vp > 1."""
    recompute_layers: NonNegativeInt | None = None
    """With `recompute = full`: fully recompute only the first N transformer layers of each
    model chunk, keeping every other layer's activations (Megatron `--recompute-method block
    --recompute-num-layers N`); None = every layer (Megatron's full recompute), 0 = none."""
    recompute_group: PositiveInt | None = None
    """With `recompute = full` of every layer: checkpoint groups of N consecutive layers, keeping
    one layer input per group and re-running a whole group in its backward (Megatron
    `--recompute-method uniform --recompute-num-layers N`); None = 1, one layer per group."""
    recompute_modules: list[RecomputeModule] | None = None
    """With `recompute = selective`: the submodules re-run in backward (Megatron
    `--recompute-modules`); None = Megatron's default, core_attn alone."""
    offload_layers: NonNegativeInt = 0
    """Activation offload: the saved activations of the first N transformer layers of each
    pipeline stage go to host memory in the forward and come back before their backward
    (Megatron-Core `--cpu-offloading-num-layers N`); 0 = off."""
    optimizer_offload: float = Field(0.0, ge=0.0, le=1.0)
    """Share of the fp32 optimizer state (master weights and moments) kept in host memory and
    stepped by the CPU (Megatron `--optimizer-cpu-offload --optimizer-offload-fraction F`,
    DeepSpeed ZeRO-Offload); in steps of 0.01; 0 = off."""

    @model_validator(mode="after")
    def _check(self) -> Layout:
        if self.etp is not None and self.etp == self.tp:
            object.__setattr__(self, "etp", None)  # Megatron's default: the canonical form
        if self.vp > 1 and self.pp == 1:
            raise ValueError(
                f"`vp` ({self.vp}) > 1 needs pipeline parallelism: interleaving splits each "
                "pipeline rank's layers into chunks; set pp > 1 or vp = 1"
            )
        self._check_cp_form()
        if self.stage_layers is not None:
            sl = self.stage_layers
            if len(sl) != self.pp:
                raise ValueError(f"`stage_layers` {sl} has {len(sl)} stages but pp = {self.pp}; "
                                 "give one layer count per pipeline stage")
            if len(set(sl[1:-1])) > 1:
                raise ValueError(f"`stage_layers` {sl}: the middle stages must hold equal layer "
                                 "counts (only the first and last may differ)")
            if len(set(sl)) == 1:
                object.__setattr__(self, "stage_layers", None)  # even: the default
        if self.recompute_layers is not None and Recompute(self.recompute) != Recompute.FULL:
            raise ValueError(
                f"`recompute_layers` ({self.recompute_layers}) counts fully recomputed layers per "
                f"model chunk and needs recompute = full (got {Recompute(self.recompute).value}); "
                "set recompute = full or drop recompute_layers")
        rc = Recompute(self.recompute)
        if self.recompute_group is not None:
            if rc != Recompute.FULL or self.recompute_layers is not None:
                raise ValueError(
                    f"`recompute_group` ({self.recompute_group}) groups fully recomputed layers "
                    "(Megatron --recompute-method uniform) and needs recompute = full without "
                    "`recompute_layers` (the block method); drop one of them")
            if self.recompute_group == 1:
                object.__setattr__(self, "recompute_group", None)  # one layer per group: default
        if self.recompute_modules is not None:
            if rc != Recompute.SELECTIVE:
                raise ValueError(
                    f"`recompute_modules` needs recompute = selective (got {rc.value}); set "
                    "recompute = selective or drop recompute_modules")
            if not self.recompute_modules:
                raise ValueError("`recompute_modules` is empty: name at least one module, e.g. "
                                 "core_attn, or leave it out for the default (core_attn)")
            mods = mask_modules(modules_mask(self.recompute_modules))
            object.__setattr__(self, "recompute_modules",
                               None if mods == [RecomputeModule.CORE_ATTN] else mods)
        if round(self.optimizer_offload * 100) != round(self.optimizer_offload * 100, 6):
            raise ValueError(f"`optimizer_offload` ({self.optimizer_offload}) is a share in steps "
                             "of 0.01, e.g. 0.5")
        if self.schedule is not None:
            sch = Schedule(self.schedule)
            if sch == Schedule.INTERLEAVED and self.vp == 1:
                raise ValueError("schedule `interleaved` needs vp > 1 model chunks per rank")
            if sch in V_SCHEDULES and self.vp != 2:
                raise ValueError(f"schedule `{sch.value}` places two chunks per rank in a V: "
                                 f"set vp = 2 (got {self.vp})")
            if sch in (Schedule.ONE_F_ONE_B, Schedule.ZB_H1, Schedule.DUALPIPE) and self.vp != 1:
                raise ValueError(f"schedule `{sch.value}` runs one model chunk per rank: set "
                                 f"vp = 1 (got {self.vp}) or use interleaved/zbv/dualpipev")
            if sch != Schedule.ONE_F_ONE_B and self.pp == 1:
                raise ValueError(f"schedule `{sch.value}` needs pipeline parallelism (pp > 1)")
        return self

    def _check_cp_form(self) -> None:
        """cp_comm / cp_a2a agree with cp; the canonical form drops what cp = 1 or ring makes
        meaningless."""
        form = CpComm(self.cp_comm) if self.cp_comm is not None else CpComm.RING
        if self.cp == 1:
            if self.cp_a2a is not None and self.cp_a2a > 1:
                raise ValueError(f"`cp_a2a` ({self.cp_a2a}) splits the context-parallel group, "
                                 "but cp = 1; set cp > 1 or drop cp_a2a")
            object.__setattr__(self, "cp_comm", None)
            object.__setattr__(self, "cp_a2a", None)
            return
        if form == CpComm.A2A_RING:
            u = self.cp_a2a
            if u is None or not 1 < u < self.cp or self.cp % u:
                splits = [d for d in range(2, self.cp) if self.cp % d == 0]
                hint = (f"e.g. {', '.join(str(d) for d in splits[:4])}" if splits else
                        f"cp = {self.cp} has no such divisor: use ring or a2a")
                raise ValueError(
                    f"cp_comm a2a+ring needs `cp_a2a`, the all-to-all group size: a divisor of "
                    f"cp = {self.cp} between 1 and cp (got {u}); {hint}")
        elif self.cp_a2a is not None:
            raise ValueError(f"`cp_a2a` ({self.cp_a2a}) is the all-to-all group of the "
                             f"hierarchical form and needs cp_comm = a2a+ring (got {form.value})")
        object.__setattr__(self, "cp_comm", None if form == CpComm.RING else form)

    @property
    def cp_form(self) -> CpComm:
        """The context-parallel form this layout runs (ring when none is set)."""
        return CpComm(self.cp_comm) if self.cp_comm is not None else CpComm.RING

    @property
    def pipeline_schedule(self) -> Schedule:
        """The schedule this layout runs (the default when none is set)."""
        return Schedule(self.schedule) if self.schedule is not None else default_schedule(self.vp)

    def resolved(self, n_gpus: int) -> Layout:
        """The same layout with `dp` derived from the GPU count and `sp` made explicit."""
        dp = self.dp
        if dp is None:
            dp = max(1, n_gpus // (self.tp * self.pp * self.cp))
        sp = bool(self.sp if self.sp is not None else self.tp > 1) and self.tp > 1
        return self.model_copy(update={"dp": dp, "sp": sp})

    @property
    def expert_tp(self) -> int:
        """The expert tensor-parallel degree (`etp`, or tp when it is not set)."""
        return int(self.etp if self.etp is not None else self.tp)

    @property
    def edp(self) -> int:
        """Expert data-parallel degree, tp x cp x dp / (etp x ep) (dp must be set; the integer
        part when the experts rule is broken)."""
        return int(self.dp or 0) * self.tp * self.cp // (self.expert_tp * self.ep)

    @property
    def n_gpus(self) -> int:
        """GPUs this layout occupies (dp must be set)."""
        return int(self.dp or 0) * self.tp * self.pp * self.cp

    @property
    def slug(self) -> str:
        """Compact form, parseable by `Layout.from_slug`."""
        sp = "-sp" if self.sp else ""
        split = stage_layers_slug(self.stage_layers) if self.stage_layers else ""
        sch = self.pipeline_schedule
        sched = "" if sch == default_schedule(self.vp) else "-s" + sch.value.replace("-", "")
        rn = "" if self.recompute_layers is None else str(self.recompute_layers)
        if self.recompute_group is not None:
            rn = f"g{self.recompute_group}"
        if self.recompute_modules is not None:
            rn = "".join("+" + RecomputeModule(m).value for m in self.recompute_modules)
        off = f"-ao{self.offload_layers}" if self.offload_layers else ""
        if self.optimizer_offload:
            off += f"-oo{round(self.optimizer_offload * 100)}"
        cpf = ""
        if self.cp > 1:
            form = self.cp_form
            cpf = (f":a2a{self.cp_a2a}+ring{self.cp // self.cp_a2a}"
                   if form == CpComm.A2A_RING else f":{form.value}")
        etp = "" if self.etp is None else f"-etp{self.etp}"
        return (
            f"dp{self.dp}-tp{self.tp}-pp{self.pp}{split}-vp{self.vp}-cp{self.cp}{cpf}-ep{self.ep}"
            f"{etp}"
            f"-z{self.zero}-r{self.recompute.value}{rn}{sp}-mb{self.micro_batch}{sched}{off}"
        )

    @classmethod
    def read_slug(cls, text: str, field: str = "layout") -> Layout:
        """`from_slug` for a slug a user gave as `field` (`layout`, `--layout`, `--versus`): a
        SpecError that names the field, the part not understood and a slug that works."""
        from pydantic import ValidationError

        from ..errors import SpecError, format_validation_error

        try:
            return cls.from_slug(text)
        except ValidationError as exc:  # a part read, its value out of range: `tp` = 0: ...
            detail = format_validation_error(exc, "layout")
        except ValueError as exc:  # a part not understood (the message names it)
            detail = str(exc)
        raise SpecError(f"`{field}` = {text!r}: {detail}")

    @classmethod
    def from_slug(cls, slug: str) -> Layout:
        """Parse `dp8-tp4-pp2-vp1-cp1-ep1-z1-rnone-sp-mb1` (or `...-pp16[7,8x14,7]-...-szbh1`,
        `cp8:a2a` / `cp8:allgather` / `cp8:a2a2+ring4` for the context-parallel form (`cp8`
        and `cp8:ring`: ring), `-ep64-etp1` for an expert-TP degree other than tp,
        `-rfull2` for full recompute of the first 2 layers of each chunk, `-rfullg4` for uniform
        groups of 4, `-rselective+core_attn+mlp` for named modules, `-ao2` for activation offload
        of 2 layers per stage, `-oo50` for half the optimizer state offloaded);
        omitted axes take defaults."""
        fields: dict = {"sp": False}
        schedules = {sch.value.replace("-", ""): sch.value for sch in Schedule}
        seen: dict[str, str] = {}
        for part in slug.strip().split("-"):
            axis = re.match(r"(etp|dp|tp|pp|vp|cp|ep|mb|z|r|s(?!p)|ao|oo|sp)", part)
            name = axis[1] if axis else part
            if name in seen:  # `dp4-tp2-tp4` took the last tp, silently
                raise ValueError(f"layout slug gives {name!r} twice ({seen[name]!r} and "
                                 f"{part!r}); give each axis once")
            seen[name] = part
            if cpm := re.fullmatch(r"cp(\d+):([a-z0-9+]+)", part):  # cp with its form
                fields["cp"] = int(cpm[1])
                fields |= _cp_form_fields(cpm[2], int(cpm[1]))
                continue
            m = re.fullmatch(r"(dp|tp|pp|vp|cp|ep|etp|z|mb)(\d+)(\[[\dx,]+\])?", part)
            if m and (m[3] is None or m[1] == "pp"):
                key = {"z": "zero", "mb": "micro_batch"}.get(m[1], m[1])
                fields[key] = int(m[2])
                if m[3]:
                    fields["stage_layers"] = parse_stage_layers(m[3])
            elif part.startswith("s") and part[1:] in schedules:
                fields["schedule"] = schedules[part[1:]]
            elif part == "sp":
                fields["sp"] = True
            elif part.startswith("r") and part[1:] in {r.value for r in Recompute}:
                fields["recompute"] = part[1:]
            elif re.fullmatch(r"rfull\d+", part):  # full recompute of the first N layers
                fields["recompute"], fields["recompute_layers"] = "full", int(part[5:])
            elif re.fullmatch(r"rfullg\d+", part):  # uniform groups of N layers
                fields["recompute"], fields["recompute_group"] = "full", int(part[6:])
            elif m := re.fullmatch(r"rselective((?:\+[a-z_]+)+)", part):  # named modules
                fields["recompute"] = "selective"
                fields["recompute_modules"] = m[1].split("+")[1:]
            elif re.fullmatch(r"ao\d+", part):  # activation offload of N layers per stage
                fields["offload_layers"] = int(part[2:])
            elif re.fullmatch(r"oo\d+", part):  # optimizer offload, percent
                fields["optimizer_offload"] = int(part[2:]) / 100.0
            else:
                raise ValueError(
                    f"layout slug part {part!r} not understood; expected e.g. "
                    "'dp8-tp4-pp2-vp1-cp1-ep1-z1-rnone-sp-mb1'"
                )
        return cls(**fields)


def _cp_form_fields(text: str, cp: int) -> dict:
    """`ring`, `a2a`, `allgather` or `a2aU+ringR` (U x R = cp), the part after `cpN:` ->
    Layout fields; ValueError otherwise."""
    if text in {f.value for f in CpComm if f != CpComm.A2A_RING}:
        return {"cp_comm": text}
    m = re.fullmatch(r"a2a(\d+)\+ring(\d+)", text)
    if not m:
        raise ValueError(f"context-parallel form {text!r} not understood; expected cpN:ring, "
                         "cpN:a2a, cpN:allgather or cpN:a2aU+ringR, e.g. cp8:a2a2+ring4")
    u, r = int(m[1]), int(m[2])
    if u * r != cp:
        raise ValueError(f"context-parallel form {text!r}: a2a {u} x ring {r} = {u * r}, not "
                         f"cp = {cp}")
    return {"cp_comm": CpComm.A2A_RING.value, "cp_a2a": u}
