"""What a stack cannot run on a hybrid model's layer types (the `layer_type` rule, as data).

- Tensor parallelism splits a Mamba-2 mixer's heads and groups (Megatron-Core `MambaMixer`:
  `nheads % tp_size == 0`, `ngroups % tp_size == 0`, asserted) and a gated DeltaNet's key and
  value heads (`GatedDeltaNet`: `num_value_heads // tp_size`).
- Context parallelism on Mamba-2 (`MambaContextParallel`): heads / t divisible by c, and groups
  / t divisible by c or c by groups / t. Gated DeltaNet has no CP in Megatron-Core 0.16.1.
- Only a stack whose preset says `hybrid_layers` builds hybrid models: the Megatron stacks
  (Megatron-Core `MambaModel` / hybrid stack); TorchTitan, DeepSpeed, Nanotron and the FSDP /
  HF-model stacks do not.
- No virtual pipeline stages: `MambaStack._select_layers_for_pipeline_parallel` asserts
  `virtual_pipeline_model_parallel_size is None` ("The Mamba hybrid model does not currently
  support virtual/interleaved pipeline parallelism", Megatron-Core 0.16.1 ssm/mamba_block.py).
- Not modelled on hybrid models: activation offload, block or uniform full-recompute groups
  (refused rather than costed wrongly). Named recompute modules apply to the attention, MLP and
  MoE layers as in a transformer; no module recomputes a mixer layer.
"""

from __future__ import annotations

import numpy as np

from ..layouts import LayoutTable
from ..specs.problem import Problem
from .arch import Arch

WHY = ("a hybrid model's layer types need tp dividing the Mamba / DeltaNet heads and groups, "
       "a Mamba-compatible cp (none with gated DeltaNet), a stack with hybrid layers (the "
       "Megatron stacks), vp = 1, and no "
       "offload or recompute groups")


def layer_type_violations(p: Problem, a: Arch, t: LayoutTable) -> np.ndarray:
    """Rows a stack cannot run on this model's layer types (all False for a transformer)."""
    bad = np.zeros(len(t), dtype=bool)
    hy = a.hybrid
    if hy is None:
        return bad
    tp, cp = t["tp"].astype(np.int64), t["cp"].astype(np.int64)
    for mx in hy.mixers.values():
        for u in mx.tp_units:
            bad |= (u % tp) != 0
        if not mx.cp_supported:
            bad |= cp > 1
            continue
        for u in mx.cp_units:
            bad |= ((u // tp) % cp) != 0
        groups = np.maximum(mx.tp_units[-1] // tp, 1)
        bad |= (cp > 1) & ((groups % cp) != 0) & ((cp % groups) != 0)
    if not p.stack.hybrid_layers:
        bad |= True
    bad |= (t["ao"] > 0) | (t["rn"] != -1) | (t["vp"] > 1)
    return bad


def layer_type_message(p: Problem, lay, hybrid_stacks: list[str]) -> str:
    """The readable reason for one layout (the `estimate` error line): each violated part;
    `hybrid_stacks`: the stack presets that declare `hybrid_layers`, named when the stack
    does not."""
    m = p.model
    tp, cp = lay.tp, lay.cp
    parts = []
    if not p.stack.hybrid_layers:
        parts.append(f"stack `{p.stack.name}` cannot train a hybrid model (only "
                     f"{', '.join(hybrid_stacks)} build Mamba / hybrid layers)")
    mb = m.mamba
    if mb is not None and "M" in (m.layer_letters or ""):
        g = max(mb.n_groups // tp, 1)
        if mb.n_heads % tp or mb.n_groups % tp:
            parts.append(f"Mamba-2: tp ({tp}) must divide its {mb.n_heads} heads and "
                         f"{mb.n_groups} groups")
        elif cp > 1 and ((mb.n_heads // tp) % cp or (g % cp and cp % g)):
            parts.append(f"Mamba-2 context parallelism: cp ({cp}) must divide the "
                         f"{mb.n_heads // tp} heads per TP rank and divide or be a multiple of "
                         f"the {g} groups per TP rank")
    la = m.linear_attention
    if la is not None and "G" in (m.layer_letters or ""):
        if la.n_key_heads % tp or la.n_value_heads % tp:
            parts.append(f"gated DeltaNet: tp ({tp}) must divide its {la.n_key_heads} key and "
                         f"{la.n_value_heads} value heads")
        if cp > 1:
            parts.append("gated DeltaNet has no context parallelism in Megatron-Core: use cp 1")
    if lay.vp > 1:
        parts.append(f"vp = {lay.vp}: Megatron-Core's Mamba stack has no virtual pipeline "
                     "stages (use vp 1)")
    if lay.offload_layers or lay.recompute_layers or lay.recompute_group:
        parts.append("activation offload and block / uniform recompute groups are not "
                     "modelled on hybrid models")
    return "layer types: " + ("; ".join(parts) or WHY)
