"""Option declarations shared by the commands (one definition, many commands)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, fields, make_dataclass
from enum import StrEnum
from typing import Annotated, Optional, get_type_hints

import typer

from ..errors import SpecError
from ..problem import make_problem
from ..specs.job import JOB_FIELDS, JobSpec


class Fmt(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


Model = Annotated[Optional[str], typer.Option("--model", help="Preset name, model TOML/JSON, or Hugging Face config.json.", show_default=False)]
Gpu = Annotated[Optional[str], typer.Option("--gpu", help="GPU preset name or GPU TOML/JSON file.", show_default=False)]
Gpus = Annotated[Optional[int], typer.Option("--gpus", help="Number of GPUs.", show_default=False)]
GpusPerNode = Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node.")]
SeqLen = Annotated[Optional[int], typer.Option("--seq-len", help="Tokens per sequence.", show_default=False)]
GlobalBatch = Annotated[Optional[int], typer.Option("--global-batch", help="Sequences per optimizer step.", show_default=False)]
AxisOpt = Annotated[Optional[str], typer.Option(help="Comma-separated values to allow.", show_default=False)]


def _job_option(name: str):
    """The Typer annotation of one `JobSpec` field (flag, help and type from its declaration)."""
    field = JobSpec.model_fields[name]
    flag = field.json_schema_extra["cli"]
    default = field.default
    hint = f" [default: {default}]" if default is not None else ""
    help_text = (field.description or "").split("\n")[0] + hint
    kind = field.annotation
    if kind in (bool, Optional[bool]):
        typ = Optional[bool]
    elif kind in (float, Optional[float]) or "float" in str(kind).lower():
        typ = Optional[float]
    else:
        typ = Optional[str]
    return Annotated[typ, typer.Option(flag, help=help_text, show_default=False)]


TARGET_STACKS = {"megatron": "megatron-core", "slurm": "megatron-core", "torchtitan": "torchtitan",
                 "deepspeed": "deepspeed", "nanotron": "nanotron"}
"""The software stack each export target launches: `--target` implies it unless `--stack` is given."""


class _JobBase:
    """Behaviour of the generated option dataclasses that hold the job settings."""

    def job(self) -> dict:
        """The job settings that were given (JobSpec field -> value)."""
        return {k: getattr(self, k) for k in JOB_FIELDS if getattr(self, k) is not None}

    def for_target(self, target: str | None):
        """These options with the stack the launcher `target` runs when `--stack` was not given
        (`TARGET_STACKS`); a warning on stderr when `--stack` names another stack."""
        if target is None or target not in TARGET_STACKS:
            return self
        implied = TARGET_STACKS[target]
        if self.stack is None:
            return dataclasses.replace(self, stack=implied)
        if self.stack != implied:
            typer.echo(f"warning: --target {target} runs the {implied} stack but --stack is "
                       f"{self.stack}: the plan is costed for {self.stack}", err=True)
        return self



class _ProblemBase(_JobBase):
    """Behaviour of the generated `ProblemOptions` dataclass."""

    def given(self) -> list[str]:
        """Flags of the problem-defining options that were given."""
        return [flag for flag, v in self._defining() if v is not None]

    def _defining(self):
        return (("--model", self.model), ("--gpu", self.gpu), ("--gpus", self.gpus),
                ("--seq-len", self.seq_len), ("--global-batch", self.global_batch))

    def build(self):
        """The `Problem`, naming any missing flag in a SpecError."""
        missing = [flag for flag, v in self._defining() if v is None]
        if missing:
            raise SpecError(f"missing {', '.join(missing)}: the problem needs a model, a GPU kind, "
                            "a GPU count, a sequence length and a global batch")
        return make_problem(self.model, self.gpu, self.gpus, self.seq_len, self.global_batch,
                            gpus_per_node=self.gpus_per_node, **self.job())


ProblemOptions = make_dataclass(
    "ProblemOptions",
    [("model", Model, None), ("gpu", Gpu, None), ("gpus", Gpus, None),
     ("gpus_per_node", GpusPerNode, 8), ("seq_len", SeqLen, None),
     ("global_batch", GlobalBatch, None)]
    + [(name, _job_option(name), None) for name in JOB_FIELDS],
    bases=(_ProblemBase,), frozen=True,
)
ProblemOptions.__module__ = __name__




JobOptions = make_dataclass(
    "JobOptions", [(name, _job_option(name), None) for name in JOB_FIELDS],
    bases=(_JobBase,), frozen=True,
)
JobOptions.__module__ = __name__
JobOptions.__doc__ = """The job settings alone (one option per `JobSpec` field), for `sweep`."""
ProblemOptions.__doc__ = """The problem options of a command, as given on the command line: the
problem's numbers plus one option per `JobSpec` field (declared there once)."""


RecomputeNumLayers = Annotated[Optional[str], typer.Option(help="Block recompute to try besides every layer: full recompute of only the first N layers of each model chunk, e.g. 1,2,4, or auto (a quarter, half and three quarters of each chunk) (Megatron --recompute-method block --recompute-num-layers).", show_default=False)]
"""`--recompute-num-layers` of plan and sweep (declared once)."""


def block_recompute_fields(text: str | None) -> dict:
    """`--recompute-num-layers` of plan/sweep ('1,2,4' or 'auto') as search-space fields."""
    from ..search.space import parse_int_list

    if text is not None and text.strip().lower() == "auto":
        return {"recompute_layers_auto": True}
    try:
        return {"recompute_layers": parse_int_list(text, "--recompute-num-layers")}
    except SpecError:
        raise SpecError(f"`--recompute-num-layers` = {text!r}: expected comma-separated layer "
                        "counts per model chunk, e.g. 1,2,4, or auto") from None


@dataclass(frozen=True)
class SearchOptions:
    """Options that narrow the search space and switch rules (plan, tune)."""

    space: Annotated[Optional[str], typer.Option(help="Search-space TOML file.", show_default=False)] = None
    tp: AxisOpt = None
    pp: AxisOpt = None
    vp: AxisOpt = None
    cp: AxisOpt = None
    cp_comm: Annotated[Optional[str], typer.Option(help="Context-parallel forms to try with cp > 1, comma-separated: ring,a2a,allgather,a2a+ring (default: the ones the stack implements).", show_default=False)] = None
    cp_a2a: Annotated[Optional[str], typer.Option(help="All-to-all group sizes of the a2a+ring form to try, e.g. 2,4,8 (default: every divisor of cp).", show_default=False)] = None
    ep: AxisOpt = None
    zero: AxisOpt = None
    recompute: Annotated[Optional[str], typer.Option(help="Comma-separated: none,selective,full.", show_default=False)] = None
    sp: Annotated[Optional[str], typer.Option(help="on, off or both.", show_default=False)] = None
    micro_batch: AxisOpt = None
    schedule: Annotated[Optional[str], typer.Option(help="Comma-separated pipeline schedules: 1f1b,interleaved,zb-h1,zbv,dualpipe,dualpipev (default: all).", show_default=False)] = None
    stage_layers: Annotated[Optional[str], typer.Option(help="Pin layers per pipeline stage, e.g. 7,8x14,7 (implies pp).", show_default=False)] = None
    first_stage_layers: Annotated[Optional[int], typer.Option(help="Pin the first pipeline stage's layers.", show_default=False)] = None
    last_stage_layers: Annotated[Optional[int], typer.Option(help="Pin the last pipeline stage's layers.", show_default=False)] = None
    recompute_modules: Annotated[Optional[str], typer.Option(help="Modules selective recompute re-runs, comma-separated: core_attn,layernorm,mlp,moe_act,moe,shared_experts,mla_up_proj (Megatron --recompute-modules; default core_attn).", show_default=False)] = None
    recompute_group: Annotated[Optional[str], typer.Option(help="Uniform full-recompute groups to try, e.g. 1,2,4 (Megatron --recompute-method uniform --recompute-num-layers).", show_default=False)] = None
    recompute_num_layers: RecomputeNumLayers = None
    offload_layers: Annotated[Optional[str], typer.Option(help="Activation offload: layers per stage to try, e.g. 0,8,16 (Megatron-Core --cpu-offloading-num-layers; pp 1, no recompute).", show_default=False)] = None
    optimizer_offload: Annotated[Optional[str], typer.Option(help="Optimizer-state offload shares to try, e.g. 0,0.5,1 (Megatron --optimizer-offload-fraction, ZeRO-Offload).", show_default=False)] = None
    offload: Annotated[bool, typer.Option(help="Search offload too: activation offload of a quarter, half, three quarters and all but one of the layers, optimizer offload 0.5 and 1 (unless the two flags above narrow it).")] = False
    allow_tp_across_nodes: Annotated[bool, typer.Option(help="Let TP groups span nodes.")] = False
    ep_in_node: Annotated[bool, typer.Option(help="Require tp x ep inside one node.")] = False

    def search_space(self):
        """The search space from the file and/or flags (flags narrow the file)."""
        from ..search.space import SearchSpace, load_space, parse_int_list
        from ..specs.layout import Recompute

        space = load_space(self.space) if self.space else SearchSpace()
        rc = None
        if self.recompute is not None:
            names = [r.strip() for r in self.recompute.split(",") if r.strip()]
            if not names or any(r not in {x.value for x in Recompute} for r in names):
                raise SpecError(f"`--recompute` = {self.recompute!r}: choose from none, selective, full")
            rc = names
        sp_values = None
        if self.sp is not None:
            sp_values = {"on": [True], "off": [False], "both": [True, False]}.get(self.sp)
            if sp_values is None:
                raise SpecError(f"`--sp` = {self.sp!r}: choose on, off or both")
        ints = {a: parse_int_list(getattr(self, a), "--" + a.replace("_", "-"))
                for a in ("tp", "pp", "vp", "cp", "ep", "zero", "micro_batch")}
        return space.narrowed(recompute=rc, sp=sp_values, **ints, **self._pipeline(),
                              **self._extras())

    def _extras(self) -> dict:
        """Named recompute modules, uniform groups and offload, as search-space fields."""
        from ..search.space import parse_int_list
        from ..specs.layout import RecomputeModule

        from ..specs.layout import CpComm

        out: dict = {"recompute_group": parse_int_list(self.recompute_group, "--recompute-group"),
                     "offload_layers": parse_int_list(self.offload_layers, "--offload-layers"),
                     "cp_a2a": parse_int_list(self.cp_a2a, "--cp-a2a")}
        if self.cp_comm is not None:
            names = [x.strip() for x in self.cp_comm.split(",") if x.strip()]
            known = [f.value for f in CpComm]
            if not names or any(x not in known for x in names):
                raise SpecError(f"`--cp-comm` = {self.cp_comm!r}: choose from {', '.join(known)}")
            out["cp_comm"] = names
        out |= block_recompute_fields(self.recompute_num_layers)
        if self.recompute_modules is not None:
            names = [x.strip() for x in self.recompute_modules.split(",") if x.strip()]
            known = [m.value for m in RecomputeModule]
            if not names or any(x not in known for x in names):
                raise SpecError(f"`--recompute-modules` = {self.recompute_modules!r}: choose "
                                f"from {', '.join(known)}")
            out["recompute_modules"] = names
        if self.optimizer_offload is not None:
            try:
                out["optimizer_offload"] = [float(x) for x in self.optimizer_offload.split(",")
                                            if x.strip()]
            except ValueError:
                raise SpecError(f"`--optimizer-offload` = {self.optimizer_offload!r}: expected "
                                "comma-separated shares in [0, 1], e.g. 0,0.5,1") from None
        if self.offload:
            out.setdefault("optimizer_offload", [0.0, 0.5, 1.0])
            out["offload_auto"] = out["offload_layers"] is None
        return out

    def _pipeline(self) -> dict:
        """Schedule and stage-split pins, as search-space fields."""
        from ..specs.layout import Schedule, parse_stage_layers

        out: dict = {"first_stage_layers": self.first_stage_layers,
                     "last_stage_layers": self.last_stage_layers}
        if self.schedule is not None:
            names = [x.strip() for x in self.schedule.split(",") if x.strip()]
            known = {x.value for x in Schedule}
            if not names or any(x not in known for x in names):
                raise SpecError(f"`--schedule` = {self.schedule!r}: choose from {', '.join(known)}")
            out["schedule"] = names
        if self.stage_layers is not None:
            try:
                out["stage_layers"] = parse_stage_layers(self.stage_layers)
            except ValueError as exc:
                raise SpecError(f"`--stage-layers`: {exc}") from None
        return out

    def rules(self):
        """The active feasibility rules."""
        from ..rules import active_rules

        return active_rules(disabled=["tp_in_node"] if self.allow_tp_across_nodes else [],
                            enabled=["ep_in_node"] if self.ep_in_node else [])


def _params_of(cls) -> list[inspect.Parameter]:
    hints = get_type_hints(cls, include_extras=True)
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                              annotation=hints[f.name]) for f in fields(cls)]


def with_options(**groups):
    """Declare option groups once for many commands: `@with_options(problem=ProblemOptions)`
    gives the command a `problem: ProblemOptions` argument while Typer sees its fields as
    options in its place."""

    def decorate(command):
        sig = inspect.signature(command, eval_str=True)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values()
               if p.name not in groups]
        injected = {name: _params_of(cls) for name, cls in groups.items()}

        @functools.wraps(command)
        def wrapper(**kwargs):
            built = {name: groups[name](**{p.name: kwargs.pop(p.name) for p in params})
                     for name, params in injected.items()}
            return command(**built, **kwargs)

        params = [p for ps in injected.values() for p in ps] + own
        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return wrapper

    return decorate


with_problem_options = with_options(problem=ProblemOptions)
"""The problem options alone (estimate, export)."""
