"""Scalar numbers derived once from a `ModelSpec`: parameter counts per layer kind, activation
bytes per token, FLOPs per token. Every cost function reads these instead of the spec.

Parameter counts follow Megatron-LM's theoretical-memory estimator (reference §1.1): no biases,
RMSNorm (h weights per norm), SwiGLU = three h x f matrices, GeLU = two.
Activation bytes follow the generalised Korthikanti accounting of reference §3.4.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..specs.model import ModelSpec


@dataclass(frozen=True)
class Arch:
    """Per-layer and per-token quantities of one model (all floats, SI units: bytes, FLOPs)."""

    n_layers: int
    n_dense_layers: int
    n_moe_layers: int
    moe_layer_step: int
    """Every this-th layer after the leading dense ones is MoE (1: all of them)."""
    n_lead_dense: int
    """Leading dense layers (DeepSeek `first_k_dense_replace`), before any MoE layer."""
    n_mtp: int
    """Multi-token-prediction modules (each a block of the last kind plus an output pass)."""
    hidden: int
    vocab: int
    n_heads: int
    n_kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    mlp_up: int
    """Columns of the first MLP GEMM per unit of f: 2 for SwiGLU (fused gate/up), 1 for GeLU."""
    act_coef: int
    """c_f of reference §3.4: activation bytes per token per unit of f (6 SwiGLU, 4 GeLU)."""
    dropout: int
    """delta of reference §3.4: 1 when dropout masks are stored."""
    ffn: int
    n_experts: int
    top_k: int
    expert_ffn: int
    n_shared: int
    shared_ffn: int
    n_groups: int
    """Expert groups of group-limited routing (0: none)."""
    topk_groups: int
    """Groups a token's experts come from (0: no limit)."""
    """Summed FFN width of the shared experts of one MoE layer."""
    window: int
    """Sliding attention window in tokens (0: none)."""
    n_window_layers: int
    """Layers that attend within `window`."""
    # --- parameters (counts) ---
    p_attn_q: float
    """Attention weights sharded over every TP rank (Q and output projections, MLA up-projections)."""
    p_attn_kv: float
    """K and V projection weights: sharded over min(tp, n_kv_heads) (KV heads replicate beyond)."""
    p_attn_rep: float
    """Attention weights replicated across TP (MLA down-projections to the latents)."""
    p_attn_out: float
    """Output-projection weights (part of `p_attn_q`); fixes the shape of that GEMM."""
    p_mlp: float
    """Dense MLP weights (TP-sharded)."""
    p_norm: float
    """Norm weights per layer (replicated across TP)."""
    p_routed: float
    """All routed experts of one MoE layer (sharded over EP and expert-TP)."""
    p_shared: float
    """Shared experts of one MoE layer (TP-sharded)."""
    p_router: float
    """Router of one MoE layer (replicated)."""
    p_embed: float
    p_output: float
    p_final_norm: float
    uniform: bool
    """True when `n_params` was given: all parameters spread evenly over layers (the seed's rule)."""
    gemm_share: float
    """Share of each layer's weights that its GEMMs multiply through in the time model: 1 for an
    architecture count; with `n_params`, (N - hV) / N, because the given N also holds the output
    layer, whose logits GEMM (h x V) is timed on its own on the last stage: the layers' GEMMs and
    the logits GEMM together are then the seed's N weights per token (6N FLOPs), not N + hV."""
    tied: bool
    """Whether the output layer shares the input embedding's weights (`p_embed` > 0: not with
    `n_params`, whose embeddings are spread over the layers)."""
    attention_flops: bool
    """Whether the model FLOPs add the causal attention term (`ModelSpec.attention_flops`)."""
    # --- activations: bytes per token per layer ---
    act_attn_rep: float
    """Attention-block bytes per token stored whole on every TP rank without SP (LN in, QKV in, mask)."""
    act_attn_qo: float
    """Attention-block bytes per token sharded over TP (Q, output-projection input)."""
    act_attn_kv: float
    """K and V bytes per token, sharded over min(tp, n_kv_heads)."""
    act_mlp_rep: float
    act_mlp_shard: float
    act_moe_rep: float
    act_moe_shard: float
    """Shared experts' bytes per token, TP-sharded (the routed copies: `cost.moe_memory`)."""
    # --- hybrid models (`cost.layer_types`) ---
    blocks: float = 2.0
    """Residual blocks per layer: 2 for a transformer layer (attention, MLP), 1 for a hybrid
    model's single-block layer. Sets the TP collective pairs of the s b h activation per layer
    and the linear-layer inputs a low-precision stack saves quantised (QKV and FC1 inputs)."""
    rope_concentration: float = 1.0
    """YaRN concentration factor on RoPE's cos and sin (`YarnSpec.concentration`; 1: none)."""
    expert_bias: bool = False
    """Whether the routed experts' linears carry biases (`ModelSpec.linear_bias` true, MoE)."""
    hybrid: object | None = None
    """`cost.layer_types.HybridArch` for a model given as a pattern of layer types; None for a
    transformer (every figure below then comes from the fields above, unchanged)."""

    # ------------------------------------------------------------------ parameters
    @property
    def attn_params(self) -> float:
        return self.p_attn_q + self.p_attn_kv + self.p_attn_rep

    @property
    def dense_layer_params(self) -> float:
        return self.attn_params + self.p_mlp + self.p_norm

    @property
    def moe_layer_params(self) -> float:
        return self.attn_params + self.p_routed + self.p_shared + self.p_router + self.p_norm

    @property
    def n_params(self) -> float:
        """Total parameters."""
        if self.hybrid is not None:  # hybrid hook: summed over the layer types
            return self.hybrid.n_params
        return (
            self.n_dense_layers * self.dense_layer_params
            + self.n_moe_layers * self.moe_layer_params
            + self.p_embed
            + self.p_output
            + self.p_final_norm
        )

    @property
    def n_params_active(self) -> float:
        """Parameters touched by one token (top-k routed experts only)."""
        if self.hybrid is not None:  # hybrid hook
            return self.hybrid.n_params_active
        if not self.n_moe_layers:
            return self.n_params
        inactive = self.n_moe_layers * self.p_routed * (1 - self.top_k / self.n_experts)
        return self.n_params - inactive

    def param_counts(self) -> dict[str, int]:
        """`{"total": ..., "active": ...}` parameter counts, as the JSON outputs carry them (the
        main model: a model card's count leaves the multi-token-prediction modules out)."""
        return {"total": round(self.n_params), "active": round(self.n_params_active)}

    @property
    def mtp_block_params(self) -> float:
        """Parameters of one multi-token-prediction module besides the shared embedding and
        output head: a block of the last layer kind, the 2h -> h projection and two norms
        (DeepSeek-V3 report §2.2: M_k, RMSNorms, transformer block T_k)."""
        block = self.moe_layer_params if self.n_moe_layers else self.dense_layer_params
        return block + 2.0 * self.hidden * self.hidden + 2.0 * self.hidden

    def _mtp_gemm_params_per_token(self) -> float:
        if not self.n_mtp:
            return 0.0
        attn = self.attn_params
        if self.n_moe_layers:
            block = attn + self.top_k * self.p_routed / self.n_experts + self.p_shared
        else:
            block = attn + self.p_mlp
        return self.n_mtp * (block + 2.0 * self.hidden * self.hidden + self.hidden * self.vocab)

    # ------------------------------------------------------------------ FLOPs
    @property
    def attn_score_width(self) -> float:
        """n_heads * (d_qk + d_v): causal core-attention forward FLOPs are b * s^2 * this."""
        return self.n_heads * (self.qk_head_dim + self.v_head_dim)

    def attn_pair_fraction(self, seq_len: int) -> float:
        """Share of the causal score pairs (s^2 / 2 per layer) actually computed, averaged over
        layers. A window w < s keeps s*w - w^2/2 of them per layer (each query sees at most w
        keys; the first w queries see their whole prefix), i.e. the fraction (2sw - w^2) / s^2."""
        s = float(seq_len)
        if not self.window or self.window >= s or not self.n_window_layers:
            return 1.0
        w = float(self.window)
        windowed = (2.0 * s * w - w * w) / (s * s)
        return 1.0 - self.n_window_layers / self.n_layers * (1.0 - windowed)

    def gemm_params_per_token(self) -> float:
        """Weights a token multiplies through in the transformer layers (active experts only,
        router excluded as in Megatron's count; reference §2.1; times `gemm_share`). Forward
        FLOPs per token = 2x this, plus 2hV for the logits."""
        if self.hybrid is not None:  # hybrid hook
            return self.hybrid.gemm_params_per_token
        attn = self.attn_params
        dense = self.n_dense_layers * (attn + self.p_mlp)
        per_expert = self.p_routed / self.n_experts if self.n_experts else 0.0
        moe = self.n_moe_layers * (attn + self.top_k * per_expert + self.p_shared)
        return (dense + moe) * self.gemm_share

    def model_flops_per_sequence(self, seq_len: int) -> float:
        """Training FLOPs (forward + backward = 3x forward) for one sequence, Megatron's causal
        convention (reference §2.1): 6 * tokens * (GEMM weights + logits) + 3 * s^2 * L * n_h(d_qk+d_v),
        the attention term scaled by `attn_pair_fraction` for sliding-window layers; with
        multi-token prediction each module adds its block, projection and logits (Megatron-LM
        `num_floating_point_operations` counts `mtp_num_layers`). With `n_params` the GEMM part
        is the seed's 6 N per token exactly (`gemm_share`), and the attention term is added only
        where the model says so (`attention_flops`)."""
        if self.hybrid is not None:  # hybrid hook: attention and scans by layer type
            return self.hybrid.model_flops_per_sequence(seq_len)
        s = float(seq_len)
        gemm = 6.0 * s * (self.gemm_params_per_token() + self.hidden * self.vocab
                          + self._mtp_gemm_params_per_token())
        if not self.attention_flops:
            return gemm
        layers = self.n_layers + self.n_mtp  # Megatron counts the MTP blocks (mtp_num_layers)
        attn = 3.0 * s * s * layers * self.attn_score_width * self.attn_pair_fraction(seq_len)
        return gemm + attn


def transformer_arch(model: ModelSpec) -> Arch:
    """Derive the `Arch` numbers of a transformer (every layer attention + MLP or MoE; a model
    given as a pattern of layer types goes through `cost.model_arch.build_arch`)."""
    h, L = model.hidden_size, model.n_layers
    a, g = model.n_heads, model.kv_heads
    swiglu = model.gated_mlp  # SwiGLU and GeGLU have the same shapes
    mu = 3 if swiglu else 2  # matrices per MLP (reference §1.1, gamma = 3/2 for SwiGLU)
    c_f = 6 if swiglu else 4  # activation bytes per f (reference §3.4)
    delta = 1 if model.dropout else 0

    if model.mla is not None:
        m = model.mla
        d_qk, d_v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
        # MLA parameter count (DeepSeek-V3 report Sec. 2.1.1; Megatron estimator's MLA branch):
        # q: h->q_lora->a*d_qk (or h->a*d_qk); kv: h->(kv_lora + rope) then kv_lora->a*(nope+v); out a*d_v->h.
        q_down = h * m.q_lora_rank if m.q_lora_rank else 0.0
        q_up = (m.q_lora_rank or h) * a * d_qk
        kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim)
        kv_up = m.kv_lora_rank * a * (m.qk_nope_head_dim + d_v)
        p_q, p_kv, p_rep = q_up + a * d_v * h, kv_up, q_down + kv_down
        p_out = a * d_v * h
        latents = 2.0 * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
        q_w, o_w, k_w, v_w = a * d_qk, a * d_v, a * d_qk, a * d_v
        kv_heads = a
    else:
        d_qk = d_v = model.head_width
        q_w = o_w = a * d_qk
        k_w = v_w = g * d_qk
        p_q, p_kv, p_rep = 2.0 * h * q_w, 2.0 * h * k_w, 0.0  # QKV + output projection
        p_out = h * o_w
        latents = 0.0
        kv_heads = g

    moe = model.moe
    lead = L if moe is None else moe.n_dense_layers
    step = 1 if moe is None else moe.layer_step
    n_moe = (L - lead) // step  # layers lead + step - 1, lead + 2 step - 1, ... are MoE
    n_dense = L - n_moe
    E = moe.n_experts if moe else 0
    k = moe.top_k if moe else 0
    f_e = moe.expert_ffn_hidden_size if moe else 0
    n_sh = moe.n_shared_experts if moe else 0
    f_sh = moe.shared_ffn_total if moe else 0  # summed width of the shared experts

    # Activation bytes per token (reference §3.4, 2-byte activations, 1-byte masks):
    # attention: LN input 2h + QKV input 2h + mask delta*h [replicated without SP];
    #            Q 2q + output-projection input 2q [sharded]; K, V 2k + 2v [sharded over KV heads].
    act_attn_rep = (4 + delta) * h + latents
    act_attn_qo = 2.0 * q_w + 2.0 * o_w
    act_attn_kv = 2.0 * k_w + 2.0 * v_w
    # dense MLP: LN input 2h + FC1 input 2h + mask delta*h [replicated]; c_f * f [sharded].
    act_mlp_rep = (4 + delta) * h
    act_mlp_shard = c_f * model.ffn_hidden_size
    # MoE MLP (reference §3.5, derived): LN input 2h + router input 2h + mask + fp32 router
    # probabilities 4E [replicated]; shared experts c_f f_e each [sharded]. The routed copies
    # (permuted expert input 2h + c_f f_e + combine input 2h each) are held per rank, by the
    # expert grid (`cost.moe_memory.routed_activation_bytes`).
    act_moe_rep = (4 + delta) * h + 4.0 * E
    act_moe_shard = c_f * f_sh

    p_mlp = mu * h * model.ffn_hidden_size
    p_norm = 2.0 * h
    p_embed = float(model.vocab_size * h)
    p_output = 0.0 if model.tied_embeddings else p_embed
    p_final_norm = float(h)
    uniform = model.n_params is not None
    gemm_share = 1.0
    if uniform:
        # The seed's rule: the given total is spread evenly over the layers, all TP-sharded.
        per_layer = float(model.n_params) / L
        share = per_layer / (p_q + p_kv + p_rep + p_mlp)
        p_q, p_kv, p_rep, p_mlp = p_q * share, p_kv * share, p_rep * share, p_mlp * share
        p_out = p_out * share
        p_norm = p_embed = p_output = p_final_norm = 0.0
        # N holds the output layer too: its h x V weights are the logits GEMM, timed on the last
        # stage, so the layers multiply through the other N - hV (ModelSpec forbids N <= hV)
        gemm_share = 1.0 - h * model.vocab_size / float(model.n_params)
    attention_flops = (not uniform) if model.attention_flops is None else model.attention_flops

    return Arch(
        n_layers=L,
        n_dense_layers=n_dense,
        n_moe_layers=n_moe,
        moe_layer_step=step,
        n_lead_dense=lead,
        n_mtp=model.mtp_layers,
        hidden=h,
        vocab=model.vocab_size,
        n_heads=a,
        n_kv_heads=kv_heads,
        qk_head_dim=d_qk,
        v_head_dim=d_v,
        mlp_up=2 if swiglu else 1,
        act_coef=c_f,
        dropout=delta,
        ffn=model.ffn_hidden_size,
        n_experts=E,
        top_k=k,
        expert_ffn=f_e,
        n_shared=n_sh,
        shared_ffn=f_sh,
        n_groups=(moe.n_groups or 0) if moe else 0,
        topk_groups=(moe.topk_groups or 0) if moe else 0,
        window=model.sliding_window or 0,
        n_window_layers=model.sliding_layers,
        p_attn_q=float(p_q),
        p_attn_kv=float(p_kv),
        p_attn_rep=float(p_rep),
        p_attn_out=float(p_out),
        p_mlp=float(p_mlp),
        p_norm=p_norm,
        p_routed=float(E * mu * h * f_e),
        p_shared=float(mu * h * f_sh),
        p_router=float(h * E),
        p_embed=p_embed,
        p_output=p_output,
        p_final_norm=p_final_norm,
        uniform=uniform,
        gemm_share=gemm_share,
        tied=bool(model.tied_embeddings and not uniform),
        attention_flops=attention_flops,
        rope_concentration=model.yarn.concentration if model.yarn is not None else 1.0,
        expert_bias=bool(moe is not None and model.linear_bias),
        act_attn_rep=float(act_attn_rep),
        act_attn_qo=float(act_attn_qo),
        act_attn_kv=float(act_attn_kv),
        act_mlp_rep=float(act_mlp_rep),
        act_mlp_shard=float(act_mlp_shard),
        act_moe_rep=float(act_moe_rep),
        act_moe_shard=float(act_moe_shard),
    )
