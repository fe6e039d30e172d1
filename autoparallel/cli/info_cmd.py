"""`autoparallel presets` and `autoparallel schema`."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from ..output.files import strict_json
from ..presets import list_gpus, list_models, list_stacks, load_gpu, load_model, load_stack
from . import app
from .render import fitted_table, make_console, stacked_table


class PresetKind(StrEnum):
    models = "models"
    gpus = "gpus"
    stacks = "stacks"


@app.command("presets")
def presets_command(
    kind: Annotated[PresetKind, typer.Argument(help="models, gpus or stacks")] = PresetKind.models,
) -> None:
    """List the built-in model, GPU or software-stack presets."""
    from ..cost.arch import build_arch

    console = make_console()
    if kind == PresetKind.models:
        headers = ["name", "layers", "hidden", "heads/kv", "ffn", "vocab", "params B", "active B"]
        rows = []
        for name in list_models():
            m = load_model(name)
            a = build_arch(m)
            rows.append([name, str(m.n_layers), str(m.hidden_size), f"{m.n_heads}/{m.kv_heads}",
                          str(m.ffn_hidden_size), str(m.vocab_size), f"{a.n_params / 1e9:.1f}",
                          f"{a.n_params_active / 1e9:.1f}"])
    elif kind == PresetKind.stacks:
        headers = ["name", "attention", "TP overlap", "grads (reduce)", "precisions", "fitted on"]
        rows = []
        for name in list_stacks():
            st = load_stack(name)
            attn = ",".join(f"{g}:{k}" for g, k in st.attention.items())
            rows.append([name, attn, "on" if st.tp_comm_overlap else "off",
                         f"{st.grad_dtype} ({st.grad_reduce_dtype})", ",".join(st.precisions),
                         ",".join(sorted(st.profile)) or "-"])
    else:
        headers = ["name", "BF16 TFLOP/s", "FP8", "FP4", "HBM GiB", "HBM TB/s", "scale-up GB/s",
                   "domain", "NIC Gb/s"]
        rows = []
        for name in list_gpus():
            g = load_gpu(name)
            rows.append([name, f"{g.bf16_tflops:g}", f"{g.fp8_tflops:g}" if g.fp8_tflops else "-",
                         f"{g.fp4_tflops:g}" if g.fp4_tflops else "-", f"{g.hbm_gib:g}",
                         f"{g.hbm_tb_per_s:g}", f"{g.scaleup_gb_per_s:g}", str(g.scaleup_domain),
                         f"{g.nic_gbit_per_s:g}"])
    table, fits = fitted_table(headers, rows, console.width)
    if not fits:  # narrow terminal: each row's values as `header value` lines, nothing cut
        table = stacked_table(headers, rows, lines=[[i] for i in range(1, len(headers))])
    console.print(table)


@app.command("schema")
def schema_command(
    what: Annotated[str, typer.Argument(help="estimate | plan | capacity | model | gpu | profile | layout")],
) -> None:
    """Print the JSON Schema of an input spec or of a JSON output."""
    from ..schema import schema_for

    typer.echo(strict_json(schema_for(what)))
