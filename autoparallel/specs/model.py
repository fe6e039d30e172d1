"""Model architecture specification (`ModelSpec`), with its MoE and MLA sub-tables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from ._base import Spec


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
    activation: Literal["swiglu", "geglu", "gelu"] = "swiglu"
    """MLP type: gated SwiGLU or GeGLU (three h x f matrices; Gemma's gated tanh-GeLU) or plain
    GeLU (two). The cost model treats both gated kinds alike."""
    dropout: bool = False
    """Whether dropout is applied (each dropout mask stores 1 byte per element)."""
    tied_embeddings: bool = False
    """Whether the output projection shares the input embedding matrix."""
    rope_theta: PositiveFloat | None = None
    """Rotary position embedding base (HF `rope_theta`; Llama 3: 500000). None: not given, and
    exporters write the launcher's default for a RoPE model (10000). It does not change cost."""
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
    mtp_layers: NonNegativeInt = 0
    """Multi-token-prediction modules (DeepSeek-V3 `num_nextn_predict_layers` 1; Megatron
    `--mtp-num-layers`): each one more transformer block of the model's last kind, a 2h -> h
    projection and one more pass through the shared output head, on the last pipeline stage."""

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data):
        if isinstance(data, dict) and data.get("n_kv_heads") is None and "n_heads" in data:
            data = {**data, "n_kv_heads": data["n_heads"]}
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
        if self.moe is not None and self.moe.n_dense_layers > self.n_layers:
            raise ValueError(
                f"`moe.n_dense_layers` ({self.moe.n_dense_layers}) exceeds `n_layers` "
                f"({self.n_layers})"
            )
        return self

    @property
    def kv_heads(self) -> int:
        """Key/value heads (never None after validation)."""
        return int(self.n_kv_heads or self.n_heads)

    @property
    def gated_mlp(self) -> bool:
        """True for the three-matrix gated MLPs (SwiGLU, GeGLU)."""
        return self.activation != "gelu"

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
