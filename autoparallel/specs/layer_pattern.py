"""Hybrid models: a model as a pattern of layer types, and the tables of the non-attention mixers.

The pattern uses Megatron-Core's hybrid notation (megatron/core/ssm/mamba_hybrid_layer_allocation.py
`Symbols`, 0.16.1; `--hybrid-override-pattern` / `--hybrid-layer-pattern`; the HF Nemotron-H
`hybrid_override_pattern`): one letter per layer, `M` a Mamba-2 mixer, `*` self-attention, `-` a
dense MLP, `E` a mixture-of-experts MLP; and `G` a gated DeltaNet (linear-attention) mixer, the
letter newer Megatron-Core releases give it (`Symbols.GDN`, megatron.core.models.hybrid). Each
letter is one pre-norm residual block of its own (a Nemotron-H "layer" is a mixer *or* an MLP).
A Qwen3-Next layer, a linear or full attention mixer followed by an MoE, is two letters (`GE`,
`*E`). A `|` may separate pipeline stages (Megatron's pipe symbol); it is not a layer.
"""

from __future__ import annotations

from pydantic import Field, PositiveInt

from ._base import Spec

MAMBA, ATTENTION, MLP, MOE, GDN = "M", "*", "-", "E", "G"
LETTERS = (MAMBA, ATTENTION, MLP, MOE, GDN)
LETTER_NAMES = {MAMBA: "Mamba-2", ATTENTION: "attention", MLP: "MLP", MOE: "MoE",
                GDN: "gated DeltaNet"}
PIPE = "|"


class MambaSpec(Spec):
    """Mamba-2 mixer (Dao & Gu 2024, arXiv 2405.21060; Megatron-Core `MambaMixer`; HF
    Nemotron-H `mamba_num_heads`, `mamba_head_dim`, `ssm_state_size`, `n_groups`,
    `conv_kernel`, `chunk_size`)."""

    n_heads: PositiveInt
    """SSM heads H (HF `mamba_num_heads`); d_inner = H x head_dim."""
    head_dim: PositiveInt = 64
    """Channels per head P (HF `mamba_head_dim`)."""
    state_size: PositiveInt = 128
    """State dimension N per head (HF `ssm_state_size`, Megatron `--mamba-state-dim`)."""
    n_groups: PositiveInt = 8
    """Groups G sharing B and C (HF `n_groups`, Megatron `--mamba-num-groups`)."""
    conv_kernel: PositiveInt = 4
    """Causal depthwise convolution width (HF `conv_kernel`, Megatron `d_conv`)."""
    chunk_size: PositiveInt = 128
    """SSD chunk length Q (HF `chunk_size`; Megatron-Core `MambaMixer(chunk_size=128)`)."""

    @property
    def d_inner(self) -> int:
        """Inner width H x P (Megatron-Core: `d_inner = nheads * headdim` when heads are given)."""
        return self.n_heads * self.head_dim


class GatedDeltaNetSpec(Spec):
    """Gated DeltaNet linear-attention mixer (Yang et al. 2024, arXiv 2412.06464; Megatron-Core
    `GatedDeltaNet`, 0.16.1; HF Qwen3-Next `linear_num_key_heads`, `linear_num_value_heads`,
    `linear_key_head_dim`, `linear_value_head_dim`, `linear_conv_kernel_dim`)."""

    n_key_heads: PositiveInt
    """Query/key heads (HF `linear_num_key_heads`)."""
    n_value_heads: PositiveInt
    """Value heads (HF `linear_num_value_heads`)."""
    key_head_dim: PositiveInt = 128
    """Query/key width per head (HF `linear_key_head_dim`)."""
    value_head_dim: PositiveInt = 128
    """Value width per head (HF `linear_value_head_dim`)."""
    conv_kernel: PositiveInt = 4
    """Causal depthwise convolution width (HF `linear_conv_kernel_dim`)."""
    chunk_size: PositiveInt = 64
    """Chunk length of the chunkwise delta rule (flash-linear-attention `chunk_gated_delta_rule`
    uses 64; the paper's Sec. 3.3 chunkwise form)."""

    @property
    def qk_dim(self) -> int:
        return self.n_key_heads * self.key_head_dim

    @property
    def v_dim(self) -> int:
        return self.n_value_heads * self.value_head_dim


class LayerPatternError(ValueError):
    """A malformed `layers` pattern (the message names the letter and what would work)."""


def parse_pattern(pattern: str) -> str:
    """The layer letters of a pattern, pipe symbols and whitespace removed; raises
    `LayerPatternError` naming the first unknown letter."""
    letters = "".join(ch for ch in pattern if ch != PIPE and not ch.isspace())
    for i, ch in enumerate(letters):
        if ch not in LETTERS:
            raise LayerPatternError(
                f"`layers` has {ch!r} at position {i}: each letter is one layer, one of "
                + ", ".join(f"{k!r} ({v})" for k, v in LETTER_NAMES.items()))
    if not letters:
        raise LayerPatternError("`layers` is empty: give one letter per layer, e.g. 'M-M*-'")
    return letters


def letter_counts(letters: str) -> dict[str, int]:
    """How many layers of each type a parsed pattern holds."""
    return {k: letters.count(k) for k in LETTERS}


def expand_repeats(pattern: str) -> str:
    """Spell out `(AB)xN` repeats (e.g. `(ME)x3*` -> `MEMEME*`), one level deep, so that long
    patterns such as Qwen3-Next's `(GEGEGE*E)x12` stay readable in a model file."""
    import re

    def rep(m):
        return m.group(1) * int(m.group(2))

    return re.sub(r"\(([^()]*)\)x(\d+)", rep, pattern)


LayersField = Field(default=None, min_length=1, max_length=1 << 20)
