"""Option declarations shared by the commands (one definition, many commands)."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Annotated, Optional, get_type_hints

import typer

from ..errors import SpecError
from ..problem import make_problem


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
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", help="Efficiency profile TOML (e.g. from `autoparallel calibrate`).", show_default=False)]
GradDtype = Annotated[str, typer.Option("--grad-dtype", help="bf16 (16 bytes/param) or fp32 (Megatron, 18 bytes/param).")]
Usable = Annotated[float, typer.Option("--usable-fraction", help="Share of GPU memory the plan may use.")]
Attention = Annotated[str, typer.Option("--attention", help="flash (FlashAttention-2 class), cudnn (Transformer Engine cuDNN / FA3), or eager (scores stored).")]
TpOverlap = Annotated[bool, typer.Option("--tp-comm-overlap/--no-tp-comm-overlap", help="TP collectives overlapped with GEMMs (Megatron --tp-comm-overlap, TorchTitan async TP).")]
IntraBw = Annotated[Optional[float], typer.Option("--intra-gbps", help="Override scale-up bandwidth per GPU, GB/s.", show_default=False)]
InterBw = Annotated[Optional[float], typer.Option("--inter-gbps", help="Override network bandwidth per GPU, GB/s.", show_default=False)]


@dataclass(frozen=True)
class ProblemOptions:
    """The problem options of a command, as given on the command line."""

    model: Model = None
    gpu: Gpu = None
    gpus: Gpus = None
    gpus_per_node: GpusPerNode = 8
    seq_len: SeqLen = None
    global_batch: GlobalBatch = None
    profile: ProfileOpt = None
    grad_dtype: GradDtype = "bf16"
    usable_fraction: Usable = 0.9
    attention: Attention = "flash"
    tp_comm_overlap: TpOverlap = False
    intra_gbps: IntraBw = None
    inter_gbps: InterBw = None

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
        return make_problem(
            self.model, self.gpu, self.gpus, self.seq_len, self.global_batch,
            gpus_per_node=self.gpus_per_node, profile=self.profile, grad_dtype=self.grad_dtype,
            usable_fraction=self.usable_fraction, attention=self.attention,
            tp_comm_overlap=self.tp_comm_overlap, intra_gb_per_s=self.intra_gbps,
            inter_gb_per_s=self.inter_gbps,
        )


_HINTS = get_type_hints(ProblemOptions, include_extras=True)
_PROBLEM_PARAMS = [
    inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                      annotation=_HINTS[f.name])
    for f in fields(ProblemOptions)
]


def with_problem_options(command):
    """Declare every problem option once for many commands: the decorated command takes a
    `problem: ProblemOptions` parameter, and Typer sees the options in its place."""
    sig = inspect.signature(command, eval_str=True)
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values()
           if p.name != "problem"]
    names = {p.name for p in _PROBLEM_PARAMS}

    @functools.wraps(command)
    def wrapper(**kwargs):
        opts = ProblemOptions(**{k: kwargs.pop(k) for k in names})
        return command(problem=opts, **kwargs)

    params = _PROBLEM_PARAMS + own
    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return wrapper
