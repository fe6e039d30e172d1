"""Model architecture specification (`ModelSpec`), with its MoE and MLA sub-tables."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import (Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt,
                      model_validator)

from ._base import Spec
from .layer_pattern import GatedDeltaNetSpec, LayerPatternError, MambaSpec, expand_repeats, parse_pattern


class MoESpec(Spec):
    """Mixture-of-experts part of a model: routed experts, top-k routing, shared experts."""

    n_experts: PositiveInt
    """Number of routed experts per MoE layer."""
    top_k: PositiveInt
    """Experts each token is routed to."""
    expert_ffn_hidden_size: PositiveInt
    """FFN hidden size of one routed expert (and of each shared expert unless
    `shared_expert_ffn_hidden_size` is given)."""
    n_shared_experts: NonNegativeInt = 0
    """Shared experts every token passes through (DeepSeek style)."""
    shared_expert_ffn_hidden_size: PositiveInt | None = None
    """FFN hidden size of each shared expert when it differs from a routed expert's (Qwen2-MoE:
    one shared expert of `shared_expert_intermediate_size`); defaults to `expert_ffn_hidden_size`."""
    n_dense_layers: NonNegativeInt = 0
    """Leading layers that keep a dense MLP of `ffn_hidden_size` (DeepSeek `first_k_dense_replace`)."""
    latent_size: PositiveInt | None = None
    """LatentMoE (Nemotron-3 Super; Megatron `--moe-latent-size`, HF `moe_latent_size`): the routed
    experts run in this width, between a h -> latent and a latent -> h projection; None: on h."""
    layer_step: PositiveInt = 1
    """Every `layer_step`-th layer after the leading dense ones is MoE, the others dense
    (Llama-4 `interleave_moe_layer_step` 2 for Maverick; Megatron `--moe-layer-freq`); 1 = all."""
    n_groups: PositiveInt | None = None
    """Group-limited routing: the experts form this many groups (DeepSeek-V3 `n_group` 8;
    Megatron `--moe-router-num-groups`); None = no groups."""
    topk_groups: PositiveInt | None = None
    """Group-limited routing: a token's experts come from this many groups (DeepSeek-V3
    `topk_group` 4; Megatron `--moe-router-group-topk`)."""

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.n_experts:
            raise ValueError(
                f"`top_k` ({self.top_k}) cannot exceed `n_experts` ({self.n_experts}): "
                "a token is routed to distinct experts"
            )
        if (self.n_groups is None) != (self.topk_groups is None):
            raise ValueError("group-limited routing needs both `n_groups` and `topk_groups` "
                             "(e.g. 8 and 4 for DeepSeek-V3), or neither")
        if self.n_groups is not None and (self.n_experts % self.n_groups
                                          or self.topk_groups > self.n_groups):
            raise ValueError(f"`n_groups` ({self.n_groups}) must divide `n_experts` "
                             f"({self.n_experts}) and be at least `topk_groups` ({self.topk_groups})")
        if self.shared_expert_ffn_hidden_size is not None and not self.n_shared_experts:
            raise ValueError(
                "`shared_expert_ffn_hidden_size` is given but `n_shared_experts` is 0; "
                "set `n_shared_experts` (e.g. 1) or drop the width"
            )
        return self

    @property
    def shared_ffn_total(self) -> int:
        """Summed FFN width of the shared experts (0 without shared experts)."""
        return self.n_shared_experts * (self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size)


class YarnSpec(Spec):
    """YaRN rotary scaling (HF `rope_scaling` with `rope_type` / `type` "yarn")."""

    factor: PositiveFloat
    """Context extension factor s (HF `factor`; gpt-oss 32, DeepSeek-V3 40, Kimi-K2 32)."""
    mscale: NonNegativeFloat | None = None
    """DeepSeek's `mscale` (None: not given; 0 makes its term 1)."""
    mscale_all_dim: NonNegativeFloat | None = None
    """DeepSeek's `mscale_all_dim` (None: not given; 0 makes its term 1)."""

    @property
    def concentration(self) -> float:
        """The factor Megatron-Core multiplies RoPE's cos and sin by
        (megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py
        `_yarn_get_concentration_factor`): 0.1 ln(s) + 1 unless both DeepSeek terms are given,
        then the ratio of 0.1 m ln(s) + 1 for m = `mscale` and m = `mscale_all_dim` (1 for
        DeepSeek-V3 and Kimi-K2, whose two terms are equal; 1.347 for gpt-oss)."""
        def term(m: float) -> float:
            return 1.0 if self.factor <= 1 else 0.1 * m * math.log(self.factor) + 1.0
        if self.mscale is None or self.mscale_all_dim is None:
            return term(1.0)
        return term(self.mscale) / term(self.mscale_all_dim)


class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank query and key/value projections."""

    q_lora_rank: NonNegativeInt = 0
    """Rank of the query compression (0: queries projected directly from the hidden state)."""
    kv_lora_rank: PositiveInt
    """Rank of the joint key/value compression."""
    qk_nope_head_dim: PositiveInt
    """Per-head query/key width without rotary embedding."""
    qk_rope_head_dim: PositiveInt
    """Per-head query/key width that carries the rotary embedding."""
    v_head_dim: PositiveInt
    """Per-head value width."""


class ModelSpec(Spec):
    """A decoder-only transformer. Sizes are counts (`n_*`) or widths (`*_size`)."""

    name: str = Field(min_length=1)
    """Name shown in outputs."""
    n_layers: PositiveInt
    """Transformer layers."""
    hidden_size: PositiveInt
    """Model width h."""
    n_heads: PositiveInt
    """Query heads a."""
    n_kv_heads: PositiveInt | None = None
    """Key/value heads g (grouped-query attention); defaults to `n_heads` (MHA)."""
    head_dim: PositiveInt | None = None
    """Per-head width; defaults to `hidden_size / n_heads` (Qwen3 sets it explicitly)."""
    ffn_hidden_size: PositiveInt
    """Dense MLP hidden size f (for MoE models: the width of the leading dense layers)."""
    vocab_size: PositiveInt
    """Vocabulary size V (padded as trained)."""
    activation: Literal["swiglu", "geglu", "gelu", "relu2"] = "swiglu"
    """MLP type: gated SwiGLU or GeGLU (three h x f matrices; Gemma's gated tanh-GeLU) or plain
    GeLU or squared ReLU (two; Nemotron-H `mlp_hidden_act = relu2`, Megatron `--squared-relu`).
    The cost model treats both gated kinds alike, and both two-matrix kinds alike."""
    dropout: bool = False
    """Whether dropout is applied (each dropout mask stores 1 byte per element)."""
    tied_embeddings: bool = False
    """Whether the output projection shares the input embedding matrix."""
    rope_theta: PositiveFloat | None = None
    """Rotary position embedding base (HF `rope_theta`; Llama 3: 500000). None: not given, and
    exporters write the launcher's default for a RoPE model (10000). It does not change cost."""
    yarn: YarnSpec | None = None
    """YaRN rotary scaling (gpt-oss, DeepSeek-V3, Kimi-K2); None: plain RoPE. Where its
    concentration is not 1 (gpt-oss), Transformer Engine's fused RoPE refuses it and
    Megatron-Core runs the unfused path (`cost.unfused_paths`)."""
    linear_bias: bool | None = None
    """Whether the linear layers carry biases (gpt-oss: the attention projections and every
    expert; Megatron `--add-bias-linear`). None: not stated; exporters then follow the family
    (biases for the GeLU GPT-2/3 family, none for SwiGLU models) and the cost model assumes
    none on the experts. Transformer Engine adds a dense linear's bias in its GEMM; the routed
    experts' second bias, only where this is true, is added expert by expert
    (`cost.unfused_paths`)."""
    sliding_window: PositiveInt | None = None
    """Attention window in tokens of the sliding-window layers (Mistral, Gemma-2, gpt-oss);
    None: every layer attends to the whole causal prefix."""
    n_sliding_layers: NonNegativeInt | None = None
    """How many layers use `sliding_window` (Gemma-2 and gpt-oss alternate: half of them);
    defaults to every layer when `sliding_window` is given."""
    n_params: PositiveFloat | None = None
    """Total parameter count; when given it replaces the architecture count and is spread evenly
    over the layers (the seed's ledger does this), and the model FLOPs per token are the seed's
    6N (2N forward, 4N backward), the output layer's logits GEMM included. Not allowed with
    `moe`."""
    attention_flops: bool | None = None
    """Whether the model FLOPs (the MFU numerator) add the causal attention term
    3 s^2 L n_h (d_qk + d_v) per sequence (Megatron's count, reference §2.1). Default: yes for an
    architecture count, no with `n_params` (the seed's 6N, which has no attention term). The
    time model runs the attention kernel either way."""
    moe: MoESpec | None = None
    """Mixture-of-experts table; absent for a dense model."""
    mla: MLASpec | None = None
    """Multi-head latent attention table; absent for standard (GQA/MHA) attention."""
    # --- hybrid models (`specs.layer_pattern`, `cost.layer_types`) ---
    layers: str | None = None
    """Hybrid models: the layer types in order, one letter per layer in Megatron's hybrid
    notation: `M` Mamba-2, `*` attention, `-` MLP, `E` MoE, `G` gated DeltaNet (`|` between
    pipeline stages is ignored; `(ME)x4` repeats). `n_layers` is the letter count. None: every
    layer is attention + MLP (or MoE), the transformer this model describes otherwise."""
    mamba: MambaSpec | None = None
    """Mamba-2 mixer table (required when `layers` has `M`)."""
    linear_attention: GatedDeltaNetSpec | None = None
    """Gated DeltaNet table (required when `layers` has `G`)."""
    mtp_layers: NonNegativeInt = 0
    """Multi-token-prediction modules (DeepSeek-V3 `num_nextn_predict_layers` 1; Megatron
    `--mtp-num-layers`): each one more transformer block of the model's last kind, a 2h -> h
    projection and one more pass through the shared output head, on the last pipeline stage."""

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data):
        if isinstance(data, dict) and data.get("n_kv_heads") is None and "n_heads" in data:
            data = {**data, "n_kv_heads": data["n_heads"]}
        if isinstance(data, dict) and isinstance(data.get("layers"), str):
            # hybrid: the pattern spelled out; n_layers defaults to its letter count
            data = {**data, "layers": expand_repeats(data["layers"])}
            if data.get("n_layers") is None:
                try:
                    data["n_layers"] = len(parse_pattern(data["layers"]))
                except LayerPatternError:
                    pass  # reported by `_check_layers`
        return data

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"`n_heads` ({self.n_heads}) must be a multiple of `n_kv_heads` "
                f"({self.n_kv_heads}): each KV head serves a whole group of query heads"
            )
        if self.head_dim is None and self.mla is None and self.hidden_size % self.n_heads:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) is not divisible by `n_heads` "
                f"({self.n_heads}); give `head_dim` explicitly"
            )
        if self.n_params is not None and self.moe is not None:
            raise ValueError(
                "`n_params` cannot be combined with a `moe` table: expert parameters are "
                "sharded differently from dense ones, so give the architecture instead"
            )
        if self.n_params is not None and self.n_params <= self.vocab_size * self.hidden_size:
            raise ValueError(
                f"`n_params` ({self.n_params:g}) must exceed the output layer's "
                f"vocab_size x hidden_size = {self.vocab_size * self.hidden_size:,} weights: the "
                "seed's 6N counts the logits GEMM within N; give the total parameter count"
            )
        if self.n_sliding_layers is not None and self.n_sliding_layers > self.n_layers:
            raise ValueError(
                f"`n_sliding_layers` ({self.n_sliding_layers}) exceeds `n_layers` ({self.n_layers})"
            )
        if self.layers is not None:
            self._check_layers()
        if self.moe is not None and self.moe.n_dense_layers > self.n_layers:
            raise ValueError(
                f"`moe.n_dense_layers` ({self.moe.n_dense_layers}) exceeds `n_layers` "
                f"({self.n_layers})"
            )
        return self

    def _check_layers(self) -> None:
        """A hybrid pattern: known letters, as many as `n_layers`, each type's table given."""
        letters = parse_pattern(self.layers)
        if len(letters) != self.n_layers:
            raise ValueError(f"`layers` has {len(letters)} layers but `n_layers` is "
                             f"{self.n_layers}; drop `n_layers` or make them agree")
        need = {"M": ("mamba", self.mamba), "G": ("linear_attention", self.linear_attention),
                "E": ("moe", self.moe)}
        for letter, (table, value) in need.items():
            if letter in letters and value is None:
                raise ValueError(f"`layers` has {letter!r} layers but no `[{table}]` table; "
                                 f"add it (`autoparallel schema model`)")
        if self.n_params is not None:
            raise ValueError("`n_params` cannot be combined with `layers`: a hybrid model's "
                             "layers differ, so its count comes from the architecture")
        if self.moe is not None and self.moe.n_dense_layers:
            raise ValueError("`moe.n_dense_layers` is not used with `layers`: write the dense "
                             "layers as `-` letters in the pattern")
        if self.mla is not None:
            raise ValueError("`mla` is not modelled in a hybrid `layers` pattern")

    @property
    def layer_letters(self) -> str | None:
        """The hybrid pattern's letters (None for a transformer without `layers`)."""
        return None if self.layers is None else parse_pattern(self.layers)

    @property
    def kv_heads(self) -> int:
        """Key/value heads (never None after validation)."""
        return int(self.n_kv_heads or self.n_heads)

    @property
    def gated_mlp(self) -> bool:
        """True for the three-matrix gated MLPs (SwiGLU, GeGLU)."""
        return self.activation not in ("gelu", "relu2")

    @property
    def sliding_layers(self) -> int:
        """Layers that attend within `sliding_window` (0 without a window)."""
        if self.sliding_window is None:
            return 0
        return self.n_layers if self.n_sliding_layers is None else int(self.n_sliding_layers)

    @property
    def head_width(self) -> int:
        """Per-head width used for queries, keys and values (standard attention)."""
        return int(self.head_dim or self.hidden_size // self.n_heads)
