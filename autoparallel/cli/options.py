"""Option declarations shared by the commands (one definition, many commands)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Optional

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


def problem_from_options(model, gpu, gpus, gpus_per_node, seq_len, global_batch, profile=None,
                         grad_dtype="bf16", usable_fraction=0.9, attention="flash",
                         intra_gbps=None, inter_gbps=None, tp_comm_overlap=False):
    """Build a Problem, naming any missing flag in a SpecError."""
    missing = [flag for flag, v in (("--model", model), ("--gpu", gpu), ("--gpus", gpus),
                                    ("--seq-len", seq_len), ("--global-batch", global_batch)) if v is None]
    if missing:
        raise SpecError(f"missing {', '.join(missing)}: the problem needs a model, a GPU kind, a "
                        "GPU count, a sequence length and a global batch")
    return make_problem(
        model, gpu, gpus, seq_len, global_batch, gpus_per_node=gpus_per_node, profile=profile,
        grad_dtype=grad_dtype, usable_fraction=usable_fraction, attention=attention,
        tp_comm_overlap=tp_comm_overlap,
        intra_gb_per_s=intra_gbps, inter_gb_per_s=inter_gbps,
    )
