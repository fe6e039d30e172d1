"""What the model's code keeps for its backward beyond the fused-kernel ledger.

The activation ledger (`cost.memory.layer_activation_bytes`, Korthikanti et al. 2022 generalised
in reference §3.4) counts the tensors a fused implementation saves: Megatron-Core with
Transformer Engine (fused LayerNorm+Linear saving its input and output, fused RoPE, the bias-SwiGLU
kernel saving only its input, a vocab-parallel cross-entropy that keeps one fp32 softmax and
overwrites it with the gradient). Other model code keeps more; each term below is read off the
code's forward, tensor by tensor (bytes per token, h hidden, q = query width a d_h, k = key width
g d_h, f = FFN width, V = vocab):

- **hf** (Hugging Face transformers `modeling_llama`-style code, what DeepSpeed / FSDP users train
  as `AutoModelForCausalLM`): `LlamaRMSNorm` upcasts its input to fp32 and multiplies it by the
  rsqrt (the fp32 copy, 4h, is saved) and multiplies the weight by the bf16 cast (saved, 2h):
  6h per norm against the fused 2h input, i.e. +4h per norm, two norms per layer.
  `apply_rotary_pos_emb` computes q cos + rotate_half(q) sin: the pre-RoPE q and the rotated copy
  are saved (2q + 2q), and likewise for k (2k + 2k). The MLP `down(act(gate(x)) * up(x))` keeps
  gate(x) (2f, for SiLU), act(gate(x)) and up(x) (2f + 2f, for the product) and the product
  (2f, for `down`): 8f against the fused kernel's 6f, +2f. The loss (transformers 4.3x
  `LlamaForCausalLM.forward`) upcasts the logits to fp32 (kept in the returned output, 4V), makes
  a shifted contiguous copy (4V) and `cross_entropy` saves the fp32 log-softmax (4V): 12 bytes
  per vocabulary entry against the fused 4.
- **nanotron** (huggingface/nanotron `models/llama.py`, v0.4-0.5): fused Triton RMSNorm and flash
  rotary (no extra), but the MLP is `down(act(gate_up[:f]) * gate_up[f:])` on a merged `gate_up`
  output: the merged 4f stays alive for both slices, plus act 2f and the product 2f: 8f, +2f;
  `sharded_cross_entropy` upcasts the TP-sharded logits to fp32 and keeps the softmax: bf16 logits
  2V + fp32 4V = 6 per vocabulary entry.
- **torchtitan** (pytorch/torchtitan `models/llama3`, eager): `apply_rotary_emb` multiplies complex
  fp32 views of q and k by the frequencies (the fp32 copies are saved: +4q + 4k); the MLP
  `w2(silu(w1(x)) * w3(x))` keeps 8f (+2f); `cross_entropy_loss` is
  `F.cross_entropy(pred.float())`: the bf16 prediction 2V and the fp32 log-softmax 4V (the fp32
  copy is freed), 6 per vocabulary entry. Its norm is `nn.RMSNorm` (one saved input, as fused).
  With `torch.compile` the pointwise chains are fused and recomputed (closer to `fused`).
- **paddlenlp** (PaddleNLP 2.5-2.6 `transformers/llama/modeling.py`, `gpt/modeling.py`): fused
  RMSNorm (`use_fused_rms_norm`), RoPE applied as q cos + rotate_half(q) sin (+4q + 4k, as hf),
  `down(silu(gate(x)) * up(x))` (+2f for gated MLPs); the pre-training criterion casts the fp16
  logits to fp32 (kept) and the cross-entropy keeps its fp32 softmax: 2V + 4V + 4V = 10 per entry.
- **atorch** (ATorch's `ds_3d_parallel` on a Hugging Face model, dlrover atorch/examples/llama2
  `ds_3d_llama2.py` @3a442b72, transformers 4.31 per atorch/requirements.txt): the pipeline is
  built from the `LlamaModel`'s own `LlamaDecoderLayer` modules (`utils/ds_pipe_utils.py`
  `PipeModuleFromRecordedMeta`), with only the linears swapped for column/row-parallel ones and
  the attention core for flash attention (`LlamaAttentionFA`): the layers keep what `hf` keeps.
  The loss is the tied embedding's `F.linear` (its fp16 logits stay referenced by the pipeline
  engine's output buffer until the backward, 2V) and `logits.float()` into ATorch's fork of
  Megatron's `_VocabParallelCrossEntropy`, which saves one fp32 softmax (4V; the fp32 copy is
  dropped when the loss returns): 6 per vocabulary entry.
- **chatglm** (ChatGLM2/3's remote code `modeling_chatglm.py`, as FlagPerf @1b5a030 ships it in
  `training/benchmarks/chatglm3_6b/deepspeed/chatglm3_6b_hf/`): `RMSNorm` computes
  `x.float()`, multiplies it by the fp32 rsqrt and the weight and casts back, so autograd keeps the
  fp32 input and the fp32 normalised tensor (4h + 4h) besides the output: +8h per norm against
  the fused 2h input. The multi-query attention `expand`s K and V from their groups to every
  query head and makes them contiguous before `scaled_dot_product_attention` (torch >= 2,
  `is_causal`), which saves the expanded copies: 2 bytes each of K and V at the query width in
  place of the group width, +4(q - k). Its rotary embedding (jit-scripted, half of each head)
  saves no pre-RoPE copy (0). The MLP `dense_4h_to_h(swiglu(dense_h_to_4h(x)))` keeps the merged
  4f output, the SiLU product's inputs and output: 8f, +2f. The loss upcasts the logits to fp32
  (kept in the output), makes a shifted contiguous copy and saves the fp32 log-softmax: 12 per
  entry, as hf. One GLMBlock of ChatGLM3-6B run on CPU through `saved_tensors_hooks` (bf16,
  s = 1024) saved 241,800 bytes per token; these terms give 240,640 (tests/test_memory.py).
- **fused**: none of the above (the ledger as is); vocab-parallel cross-entropy 4 per entry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import get_args

from ..specs.stack import ModelCodeName

MODEL_CODE_NAMES: tuple[str, ...] = get_args(ModelCodeName)


@dataclass(frozen=True)
class ModelCode:
    """Extra saved bytes per token of one layer, in units of the named width (module docstring)."""

    norm_extra_h: float
    """Extra bytes per token per norm, per unit of h (replicated across TP without SP)."""
    rope_extra: float
    """Extra bytes per token per unit of the query and key widths (pre-RoPE copies)."""
    glu_extra_f: float
    """Extra bytes per token per unit of f in a gated MLP."""
    loss_bytes_per_vocab: float
    """Bytes per token per vocabulary entry held at the loss (TP-sharded)."""
    kv_expand: float = 0.0
    """Extra bytes per token per unit of (query width - key width): K and V saved expanded to
    every query head (2 bytes each) in place of their groups (`chatglm`)."""


MODEL_CODES: dict[str, ModelCode] = {
    "fused": ModelCode(norm_extra_h=0.0, rope_extra=0.0, glu_extra_f=0.0, loss_bytes_per_vocab=4.0),
    "hf": ModelCode(norm_extra_h=4.0, rope_extra=4.0, glu_extra_f=2.0, loss_bytes_per_vocab=12.0),
    "nanotron": ModelCode(norm_extra_h=0.0, rope_extra=0.0, glu_extra_f=2.0, loss_bytes_per_vocab=6.0),
    "paddlenlp": ModelCode(norm_extra_h=0.0, rope_extra=4.0, glu_extra_f=2.0,
                           loss_bytes_per_vocab=10.0),
    "torchtitan": ModelCode(norm_extra_h=0.0, rope_extra=4.0, glu_extra_f=2.0,
                            loss_bytes_per_vocab=6.0),
}
"""Coefficients of each model code (module docstring: where every number comes from)."""
# ATorch 3D runs the hf layers as they are; only its loss differs (module docstring)
MODEL_CODES["atorch"] = replace(MODEL_CODES["hf"], loss_bytes_per_vocab=6.0)
# ChatGLM: the hf loss and gated MLP, its own norms, K/V expansion and rotary (module docstring)
MODEL_CODES["chatglm"] = replace(MODEL_CODES["hf"], norm_extra_h=8.0, rope_extra=0.0,
                                 kv_expand=4.0)


COMPILED_LOSS_BYTES = 2.0
"""Bytes per logit a compiled loss keeps: the bf16 logits (Inductor fuses the fp32 upcast into the
log-softmax kernel and keeps only the per-token log-sum-exp)."""


def model_code(name: str, compiled: bool = False) -> ModelCode:
    """The coefficients of a model-code name (`MODEL_CODE_NAMES`). `compiled` (torch.compile):
    Inductor fuses the pointwise chains (fp32 norms, RoPE, the gated activation) into single kernels
    and its min-cut partitioner recomputes them in the backward instead of saving their
    intermediates (torch/_functorch/partitioners.py `min_cut_rematerialization_partition`), so
    the extras vanish; the loss keeps `COMPILED_LOSS_BYTES` per logit."""
    code = MODEL_CODES[name]
    if not compiled:
        return code
    return ModelCode(norm_extra_h=0.0, rope_extra=0.0, glu_extra_f=0.0,
                     loss_bytes_per_vocab=min(code.loss_bytes_per_vocab, COMPILED_LOSS_BYTES),
                     kv_expand=code.kv_expand)  # SDPA still saves the expanded K and V
