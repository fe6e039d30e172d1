"""`autoparallel presets` and `autoparallel schema`."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from ..output.files import strict_json
from . import command
from .render import fitted_table, make_console, stacked_table


class PresetKind(StrEnum):
    models = "models"
    gpus = "gpus"
    stacks = "stacks"
    networks = "networks"


@command("presets")
def presets_command(
    kind: Annotated[PresetKind, typer.Argument(help="Which presets.", metavar="models|gpus|stacks|networks")] = PresetKind.models,
) -> None:
    """List the built-in model, GPU, software-stack or network presets."""
    from ..cost.model_arch import build_arch
    from ..presets import (list_gpus, list_models, list_networks, list_stacks, load_gpu,
                           load_model, load_network, load_stack)

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
    elif kind == PresetKind.networks:
        headers = ["name", "tiers, inside out (GPUs per unit, GB/s per GPU where not the GPU's)",
                   "about"]
        rows = []
        for name in list_networks():
            net = load_network(name)
            rows.append([name, " > ".join(_tier_label(t) for t in net.tiers), net.description])
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
    if kind == PresetKind.networks:  # two lines per preset: its tiers, then what it is
        console.print(stacked_table(headers, rows, lines=[[1], [2]], bare=frozenset({1, 2})))
        return
    table, fits = fitted_table(headers, rows, console.width)
    if not fits:  # narrow terminal: each row's values as `header value` lines, nothing cut
        table = stacked_table(headers, rows, lines=[[i] for i in range(1, len(headers))])
    console.print(table)


def _tier_label(t) -> str:
    """`leaf 256 (NIC)`, `spine 2:1`, `nvlink (GPU)`: a tier as the presets table shows it."""
    size = f" {t.size}" if t.size is not None else ""
    bw = f" {t.gb_per_s:g}GB/s" if t.gb_per_s is not None else ""
    extra = "".join([f" {t.oversubscription:g}:1" if t.oversubscription != 1 else "",
                     " spread" if t.placement == "spread" else "",
                     f" {t.reduction}" if t.reduction not in (None, "none") else ""])
    return f"{t.name}{size}{bw}{extra}"


@command("schema")
def schema_command(
    what: Annotated[str, typer.Argument(help="An output (estimate, plan, capacity) or an input (model, gpu, network, profile, layout, stack, job).", metavar="WHAT")],
) -> None:
    """Print the JSON Schema of an input spec or of a JSON output."""
    from ..schema import schema_for

    typer.echo(strict_json(schema_for(what)))
