"""Option declarations shared by the commands (one definition, many commands).

Each group is declared once and lands in its help panel (`cli.help`): the problem's numbers
(`ProblemOptions`, panel Problem), one option per `JobSpec` field (panel Job), one per `Layout`
field for the commands that take one layout (`LayoutOptions`, panel Layout), the axis filters of
a search (`SearchOptions`: Layout) and its rules (Search), and the output files and formats
(`FormatOpt`, `OutputOpt`, `PlotOpt`: Output). A field added to `JobSpec` or `Layout` becomes an
option of every command that takes the group, in the right panel, with no list to update.

Counts (`--gpus 16K`), global batches (`--global-batch 16M` tokens) and durations are read by
`autoparallel.values`, the one parser of each kind of value.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import typing
from dataclasses import dataclass, fields, make_dataclass
from enum import StrEnum
from typing import Annotated, Literal, Optional, get_type_hints

import typer

from ..errors import SpecError
from ..limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN
from ..specs.job import JOB_FIELDS, JobSpec, job_help
from ..values import parse_count, parse_count_list, parse_global_batch

PROBLEM, LAYOUT, SEARCH, JOB, OUTPUT = "Problem", "Layout", "Search", "Job", "Output"
"""Help panels every command shares (`cli.help.PANEL_ORDER`)."""


class Fmt(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _opt(flag: str | None, help: str, panel: str, metavar: str | None = None, **kw):
    decls = (flag,) if flag else ()
    return typer.Option(*decls, help=help, rich_help_panel=panel, metavar=metavar,
                        show_default=kw.pop("show_default", False), **kw)


Model = Annotated[Optional[str], _opt("--model", "Model: a preset name, a TOML/JSON file or a Hugging Face config.json.", PROBLEM, "NAME|FILE")]
Gpu = Annotated[Optional[str], _opt("--gpu", "GPU kind: a preset name or a TOML/JSON file.", PROBLEM, "NAME|FILE")]
Gpus = Annotated[Optional[str], _opt("--gpus", "Number of GPUs, e.g. 64 or 16K (= 16,384).", PROBLEM, "N")]
GpusPerNode = Annotated[Optional[int], _opt("--gpus-per-node", "GPUs per node [default: the GPU's node: 8; 4 on a GB200/GB300 NVL72 tray].", PROBLEM, "N")]
SeqLen = Annotated[Optional[str], _opt("--seq-len", "Tokens per sequence, e.g. 8192 or 8K.", PROBLEM, "N")]
GlobalBatch = Annotated[Optional[str], _opt("--global-batch", "Sequences per optimizer step (512), or tokens with a suffix (16M = 2^24 tokens).", PROBLEM, "N")]

FormatOpt = Annotated[Fmt, _opt("--format", "Output format.", OUTPUT, show_default=True)]
"""`--format table|json|csv` (a command that takes fewer says so when given another)."""
OutputOpt = Annotated[Optional[str], _opt("--output", "File to write (default: stdout).", OUTPUT, "FILE")]
PlotOpt = Annotated[Optional[str], _opt("--plot", "Write a plot (.png, .svg or .pdf).", OUTPUT, "FILE")]


def _choices(annotation) -> list[str]:
    """The values of a Literal/Enum annotation (inside Optional), else []."""
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is Literal:
            return [str(a) for a in typing.get_args(arg)]
        if isinstance(arg, type) and issubclass(arg, enum.Enum):
            return [str(m.value) for m in arg]
    return []


def _is(annotation, kind) -> bool:
    """`annotation` is `kind` or `kind | None`."""
    return annotation is kind or kind in typing.get_args(annotation)


def _job_option(name: str):
    """The Typer annotation of one `JobSpec` field (flag, help, values from its declaration)."""
    field = JobSpec.model_fields[name]
    extra = field.json_schema_extra or {}
    flag = extra["cli"]
    help_text = job_help(name)
    if field.default is not None:
        help_text += f" [default: {field.default}]"
    kind = field.annotation
    choices = _choices(kind)
    metavar = extra.get("metavar") or ("|".join(choices) if choices else None)
    if _is(kind, bool):
        typ = Optional[bool]
    elif _is(kind, float) or "float" in str(kind).lower():
        typ, metavar = Optional[float], metavar or "FLOAT"
    else:
        typ = Optional[str]
    return Annotated[typ, typer.Option(flag, help=help_text, rich_help_panel=JOB,
                                       metavar=None if typ is Optional[bool] else metavar,
                                       show_default=False)]


TARGET_STACKS = {"megatron": "megatron-core", "slurm": "megatron-core", "torchtitan": "torchtitan",
                 "deepspeed": "deepspeed", "nanotron": "nanotron",
                 "megatron-bridge": "megatron-bridge"}
"""The software stack each export target launches: `--target` implies it unless `--stack` is given
(one entry per `exporters.CLASSES` target)."""
TARGET_NAMES = ", ".join(TARGET_STACKS)
"""The export targets as help text lists them."""


class _JobBase:
    """Behaviour of the generated option dataclasses that hold the job settings."""

    def job(self) -> dict:
        """The job settings that were given (JobSpec field -> value)."""
        return {k: getattr(self, k) for k in JOB_FIELDS if getattr(self, k) is not None}

    def implied_stack(self, target: str | None) -> tuple[str | None, str | None]:
        """(stack the plan is costed for, note) when `target` is given: the launcher's own
        stack unless `--stack` was given; the note says what was chosen and why."""
        if target is None or target not in TARGET_STACKS:
            return self.stack, None
        implied = TARGET_STACKS[target]
        if self.stack is None and implied == JobSpec.model_fields["stack"].default:
            return implied, None
        if self.stack is None:
            return implied, (f"--target {target} runs the {implied} stack: the plan is costed "
                             f"for {implied} (give --stack to cost another)")
        if self.stack != implied:
            return self.stack, (f"--target {target} runs the {implied} stack but --stack is "
                                f"{self.stack}: the plan is costed for {self.stack}")
        return self.stack, None

    def for_target(self, target: str | None, *, quiet_implied: bool = True):
        """These options with the stack the launcher `target` runs when `--stack` was not given
        (`TARGET_STACKS`); a warning on stderr when `--stack` names another stack, and (unless
        `quiet_implied`) a note when the target chose the stack."""
        stack, note = self.implied_stack(target)
        if note and (self.stack is not None or not quiet_implied):
            typer.echo(f"{'warning' if self.stack is not None else 'note'}: {note}", err=True)
        return self if stack == self.stack else dataclasses.replace(self, stack=stack)


class _ProblemBase(_JobBase):
    """Behaviour of the generated `ProblemOptions` dataclass."""

    def given(self) -> list[str]:
        """Flags of the problem-defining options that were given."""
        return [flag for flag, v in self._defining() if v is not None]

    def _defining(self):
        return (("--model", self.model), ("--gpu", self.gpu), ("--gpus", self.gpus),
                ("--seq-len", self.seq_len), ("--global-batch", self.global_batch))

    def numbers(self) -> tuple[int, int, int]:
        """(GPUs, sequence length, global batch in sequences), read by `autoparallel.values`."""
        n = parse_count(self.gpus, "--gpus", high=MAX_GPUS, why="the bound on a job")
        seq = parse_count(self.seq_len, "--seq-len", high=MAX_SEQ_LEN)
        batch = parse_global_batch(self.global_batch, seq, high=MAX_GLOBAL_BATCH)
        return n, seq, batch

    def argv(self) -> list[str]:
        """The flags that were given, as a command line would repeat them (for the commands a
        command prints, e.g. plan's export line)."""
        from ..specs.job import job_words

        out: list[str] = []
        for flag, value in self._defining():
            if value is not None:
                out += [flag, str(value)]
        if self.gpus_per_node is not None:
            out += ["--gpus-per-node", str(self.gpus_per_node)]
        for name, value in self.job().items():
            out += job_words(name, value)
        return out

    def check(self) -> None:
        """Every given number readable, before any work (a missing flag is left to `build`)."""
        if None not in (self.gpus, self.seq_len, self.global_batch):
            self.numbers()

    def build(self):
        """The `Problem`, naming any missing flag in a SpecError."""
        from ..problem import make_problem

        missing = [flag for flag, v in self._defining() if v is None]
        if missing:
            raise SpecError(f"missing {', '.join(missing)}: the problem needs a model, a GPU kind, "
                            "a GPU count, a sequence length and a global batch")
        n, seq, batch = self.numbers()
        return make_problem(self.model, self.gpu, n, seq, batch,
                            gpus_per_node=self.gpus_per_node, **self.job())


ProblemOptions = make_dataclass(
    "ProblemOptions",
    [("model", Model, None), ("gpu", Gpu, None), ("gpus", Gpus, None),
     ("gpus_per_node", GpusPerNode, None), ("seq_len", SeqLen, None),
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


# --- one layout (estimate, export): one option per `Layout` field -----------------------------

LAYOUT_FLAGS = {"recompute_layers": "--recompute-num-layers"}
"""`Layout` fields whose flag is not the field's name (Megatron's name for the same knob)."""
LAYOUT_HELP = {
    "dp": "Data-parallel degree [default: the GPUs left by tp x pp x cp].",
    "tp": "Tensor-parallel degree.",
    "pp": "Pipeline-parallel degree.",
    "vp": "Virtual stages (model chunks) per pipeline rank.",
    "cp": "Context-parallel degree.",
    "cp_comm": "Context-parallel form with cp > 1 [default: ring].",
    "cp_a2a": "With --cp-comm a2a+ring: ranks of each all-to-all group, a divisor of cp.",
    "ep": "Expert-parallel degree (MoE).",
    "etp": "Expert tensor-parallel degree (Megatron --expert-tensor-parallel-size; etp x ep may "
           "exceed dp: parallel folding) [default: tp].",
    "zero": "ZeRO stage 0-3 (1 = distributed optimizer, 3 = FSDP).",
    "recompute": "Activation recomputation.",
    "sp": "Sequence parallelism [default: on when tp > 1].",
    "micro_batch": "Sequences per micro-batch.",
    "stage_layers": "Layers per pipeline stage, first to last, e.g. 7,8x14,7 [default: even].",
    "schedule": "Pipeline schedule [default: 1f1b; interleaved with vp > 1].",
    "recompute_layers": "With --recompute full: recompute only the first N layers of each chunk "
                        "[default: all].",
    "recompute_group": "With --recompute full: checkpoint groups of N layers.",
    "recompute_modules": "With --recompute selective: modules re-run, e.g. core_attn,mlp "
                         "[default: core_attn].",
    "offload_layers": "Activation offload of the first N layers of each stage.",
    "optimizer_offload": "Share of the optimizer state offloaded to the host, 0-1.",
}
"""One line per `Layout` field (its docstring has the details); a field without an entry here
uses its docstring's first sentence."""


def _first_sentence(text: str | None) -> str:
    text = " ".join((text or "").split())
    cut = text.find(". ")
    return text if cut < 0 else text[:cut + 1]


def layout_flag(name: str) -> str:
    """The CLI flag of a `Layout` field."""
    return LAYOUT_FLAGS.get(name, "--" + name.replace("_", "-"))


def _layout_option(name: str):
    from ..specs.layout import Layout

    field = Layout.model_fields[name]
    kind = field.annotation
    help_text = LAYOUT_HELP.get(name) or _first_sentence(field.description)
    default = field.default
    if default not in (None, 0, 0.0) and "[default" not in help_text:
        help_text += f" [default: {getattr(default, 'value', default)}]"
    choices = _choices(kind)
    if typing.get_origin(kind) is list or list in {typing.get_origin(a) for a in typing.get_args(kind)}:
        typ, metavar = Optional[str], "LIST"
    elif _is(kind, bool):
        flag = layout_flag(name)
        return Annotated[Optional[bool], typer.Option(f"{flag}/--no-{flag[2:]}", help=help_text,
                                                      rich_help_panel=LAYOUT, show_default=False)]
    elif choices:
        ints = all(c.lstrip("-").isdigit() for c in choices)
        typ, metavar = Optional[int] if ints else Optional[str], "|".join(choices)
    elif _is(kind, float):
        typ, metavar = Optional[float], "FLOAT"
    else:
        typ, metavar = Optional[int], "N"
    return Annotated[typ, typer.Option(layout_flag(name), help=help_text, rich_help_panel=LAYOUT,
                                       metavar=metavar, show_default=False)]


@functools.cache
def layout_options_class():
    """`LayoutOptions`: one option per `Layout` field (built on first use: it needs the spec)."""
    from ..specs.layout import Layout

    slug = Annotated[Optional[str], typer.Option(
        "--layout", help="The whole layout as a slug, as plan prints it, e.g. "
        "dp4-tp8-pp2-vp10-cp1-ep1-z1-rnone-sp-mb1 (instead of the flags below).",
        rich_help_panel=LAYOUT, metavar="SLUG", show_default=False)]
    cls = make_dataclass("LayoutOptions", [("slug", slug, None)]
                         + [(n, _layout_option(n), None) for n in Layout.model_fields],
                         bases=(_LayoutBase,), frozen=True)
    cls.__module__ = __name__
    cls.__doc__ = "The layout of `estimate` and `export`, one option per `Layout` field."
    return cls


class _LayoutBase:
    """Behaviour of `LayoutOptions`."""

    def given(self) -> dict:
        """The `Layout` fields that were given (field -> value as typed)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "slug" and getattr(self, f.name) is not None}

    def flags(self) -> list[str]:
        """The layout flags that were given (`--layout` included)."""
        return (["--layout"] if self.slug is not None else []) + [layout_flag(n) for n in self.given()]

    def layout(self):
        """The `Layout` of `--layout SLUG`, or of the given fields (the others at their
        defaults); a SpecError naming the flag when one is malformed."""
        from ..errors import format_validation_error
        from ..specs.layout import Layout, parse_stage_layers

        given = self.given()
        if self.slug is not None:
            if given:
                raise SpecError(f"give either --layout or layout flags, not both (got --layout "
                                f"and {', '.join(layout_flag(n) for n in given)})")
            return Layout.read_slug(self.slug, "--layout")
        try:
            if "stage_layers" in given:
                given["stage_layers"] = parse_stage_layers(given["stage_layers"])
            for name, value in list(given.items()):
                if isinstance(value, str) and name != "stage_layers" and _is_list(name):
                    given[name] = [x.strip() for x in value.split(",") if x.strip()]
            return Layout(**given)
        except ValueError as exc:
            raise SpecError(format_validation_error(exc, "layout")) from None


def _is_list(name: str) -> bool:
    from ..specs.layout import Layout

    kind = Layout.model_fields[name].annotation
    return typing.get_origin(kind) is list or any(typing.get_origin(a) is list
                                                  for a in typing.get_args(kind))


# --- a search: axis filters (Layout panel) and rules (Search panel) ---------------------------

def _axis(help_text: str, metavar: str = "LIST"):
    return Annotated[Optional[str], typer.Option(help=help_text, rich_help_panel=LAYOUT,
                                                 metavar=metavar, show_default=False)]


AxisOpt = _axis("Comma-separated values to try.")
"""An axis filter of plan, tune and sweep (panel Layout); give a field its own help with `_axis`."""

RecomputeNumLayers = _axis("Block recompute to try besides every layer: the first N layers of "
                           "each chunk, e.g. 1,2,4, or auto.", "LIST|auto")
"""`--recompute-num-layers` of plan and sweep (declared once)."""


def block_recompute_fields(text: str | None) -> dict:
    """`--recompute-num-layers` of plan/sweep ('1,2,4' or 'auto') as search-space fields."""
    if text is not None and text.strip().lower() == "auto":
        return {"recompute_layers_auto": True}
    try:
        return {"recompute_layers": parse_count_list(text, "--recompute-num-layers", low=0)}
    except SpecError:
        raise SpecError(f"`--recompute-num-layers` = {text!r}: expected comma-separated layer "
                        "counts per model chunk, e.g. 1,2,4, or auto") from None


def _flag(help_text: str, panel: str = SEARCH):
    return Annotated[bool, typer.Option(help=help_text, rich_help_panel=panel)]


@dataclass(frozen=True)
class SearchOptions:
    """Options that narrow the search space (panel Layout) and switch rules (panel Search)."""

    space: Annotated[Optional[str], typer.Option(help="Search-space TOML file (the flags below narrow it).", rich_help_panel=SEARCH, metavar="FILE", show_default=False)] = None
    tp: _axis("Tensor-parallel degrees to try, e.g. 2,4,8.") = None
    pp: _axis("Pipeline-parallel degrees to try.") = None
    vp: _axis("Virtual stages per pipeline rank to try.") = None
    cp: _axis("Context-parallel degrees to try.") = None
    cp_comm: _axis("Context-parallel forms to try with cp > 1: ring, a2a, allgather, a2a+ring "
                   "[default: the stack's].") = None
    cp_a2a: _axis("All-to-all group sizes of the a2a+ring form to try, e.g. 2,4,8 "
                  "[default: every divisor of cp].") = None
    ep: _axis("Expert-parallel degrees to try (MoE).") = None
    etp: _axis("Expert tensor-parallel degrees to try, e.g. 1,2,4 [default: 1 and tp; etp x ep "
               "may exceed dp: parallel folding].") = None
    zero: _axis("ZeRO stages to try, e.g. 1,3.") = None
    recompute: _axis("Recomputation to try: none, selective, full.") = None
    sp: _axis("Sequence parallelism: on, off or both.", "on|off|both") = None
    micro_batch: _axis("Micro-batch sizes to try.") = None
    schedule: _axis("Pipeline schedules to try: 1f1b, interleaved, zb-h1, zbv, dualpipe, "
                    "dualpipev [default: the stack's].") = None
    stage_layers: _axis("Pin the layers per pipeline stage, e.g. 7,8x14,7 (implies pp).") = None
    first_stage_layers: Annotated[Optional[int], typer.Option(help="Pin the first pipeline stage's layers.", rich_help_panel=LAYOUT, metavar="N", show_default=False)] = None
    last_stage_layers: Annotated[Optional[int], typer.Option(help="Pin the last pipeline stage's layers.", rich_help_panel=LAYOUT, metavar="N", show_default=False)] = None
    recompute_modules: _axis("Modules selective recompute re-runs, e.g. core_attn,mlp "
                             "[default: core_attn].") = None
    recompute_group: _axis("Uniform full-recompute groups to try, e.g. 1,2,4.") = None
    recompute_num_layers: RecomputeNumLayers = None
    offload_layers: _axis("Activation offload: layers per stage to try, e.g. 0,8,16.") = None
    optimizer_offload: _axis("Optimizer-state offload shares to try, e.g. 0,0.5,1.") = None
    offload: _flag("Search activation and optimizer offload too.", LAYOUT) = False
    allow_tp_across_nodes: _flag("Let TP groups span nodes.") = False
    ep_in_node: _flag("Require etp x ep inside one node.") = False

    def search_space(self):
        """The search space from the file and/or flags (flags narrow the file)."""
        from ..search.space import SearchSpace, load_space
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
        ints = {a: parse_count_list(getattr(self, a), "--" + a.replace("_", "-"),
                                    low=0 if a == "zero" else 1)
                for a in ("tp", "pp", "vp", "cp", "ep", "etp", "zero", "micro_batch")}
        return space.narrowed(recompute=rc, sp=sp_values, **ints, **self._pipeline(),
                              **self._extras())

    def _extras(self) -> dict:
        """Named recompute modules, uniform groups and offload, as search-space fields."""
        from ..specs.layout import CpComm, RecomputeModule

        out: dict = {"recompute_group": parse_count_list(self.recompute_group, "--recompute-group"),
                     "offload_layers": parse_count_list(self.offload_layers, "--offload-layers",
                                                        low=0),
                     "cp_a2a": parse_count_list(self.cp_a2a, "--cp-a2a")}
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
    options in its place. A group may be given as a function returning the class (built on
    first use)."""

    def decorate(command):
        classes = {name: cls if isinstance(cls, type) else cls() for name, cls in groups.items()}
        sig = inspect.signature(command, eval_str=True)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values()
               if p.name not in classes]
        injected = {name: _params_of(cls) for name, cls in classes.items()}

        @functools.wraps(command)
        def wrapper(**kwargs):
            built = {name: classes[name](**{p.name: kwargs.pop(p.name) for p in params})
                     for name, params in injected.items()}
            return command(**built, **kwargs)

        params = [p for ps in injected.values() for p in ps] + own
        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return wrapper

    return decorate


with_problem_options = with_options(problem=ProblemOptions)
"""The problem options alone."""
