"""Translate a Hugging Face `config.json` into `ModelSpec` keys.

Covered as they are published: Llama 2/3/4, Mistral, Mixtral, Qwen2/2.5/3, Qwen2-MoE, Qwen3-MoE,
DeepSeek-V2/V3, Gemma/Gemma-2, Phi-3, gpt-oss, ChatGLM2/3 (its own key names: `CHATGLM_KEYS`),
and the text model of multimodal configs (`text_config`). Facts per family come from the transformers configuration classes and the model
cards cited in `tests/data/hf/README.md`:

- gated MLP (three h x f matrices) by architecture, not by activation name: Gemma's
  `gelu_pytorch_tanh` is GeGLU; GPT-2/NeoX-style families use a plain two-matrix MLP;
- tied embeddings from `tie_word_embeddings`, else the family's default (Gemma ties, Llama
  does not; transformers' base default is tied);
- shared experts: DeepSeek `n_shared_experts` (routed width), Qwen2-MoE one shared expert of
  `shared_expert_intermediate_size`, Llama-4 one shared expert of `intermediate_size`;
- leading dense layers (DeepSeek `first_k_dense_replace`) and interleaved ones (Llama-4
  `interleave_moe_layer_step`, Qwen `decoder_sparse_step`: every step-th layer MoE) are placed
  as published; Qwen's `mlp_only_layers` count as leading layers;
- DeepSeek's multi-token-prediction modules (`num_nextn_predict_layers`) and group-limited
  routing (`n_group`, `topk_group`) are read;
- sliding-window attention (`sliding_window`, `layer_types`, Gemma-2 alternation) is modelled;
- YaRN `rope_scaling` (factor and DeepSeek's mscale terms) and gpt-oss's biased linears are read
  (`ModelSpec.yarn`, `ModelSpec.linear_bias`);
  fields that change cost but are not modelled raise an `InputWarning`.

Every size must be a positive integer; zero, negative, boolean or string values are errors
naming the field, never replaced by defaults.
"""

from __future__ import annotations

import math
import warnings

from ..errors import InputWarning, SpecError
from ..limits import MAX_SPEC_INT

GATED_FAMILIES = frozenset({
    "llama", "llama4", "llama4_text", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3",
    "qwen3_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "gemma", "gemma2", "gemma3", "gemma3_text", "phi3",
    "phimoe", "gpt_oss", "olmo", "olmo2", "olmoe", "granite", "granitemoe", "cohere", "internlm2",
    "glm", "glm4", "chatglm", "exaone", "starcoder2_gated", "minicpm", "hunyuan", "ernie4_5",
})
"""`model_type`s whose MLP is gated (SwiGLU/GeGLU: gate, up and down matrices)."""
PLAIN_FAMILIES = frozenset({
    "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2",
    "mpt", "codegen",
})
"""`model_type`s with a plain two-matrix MLP (up, activation, down)."""
NOT_DECODER_FAMILIES = frozenset({
    "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2",
    "t5", "mt5", "bart", "mbart", "pegasus", "whisper", "vit", "clip", "siglip",
})
"""`model_type`s that are encoders or encoder-decoders: bidirectional attention (or a second
stack) that the planner's causal decoder layers do not describe."""
HYBRID_KEYS = {"qwen3_next": "layer_types", "nemotron_h": "hybrid_override_pattern"}
"""Hybrid families and the key that says which layer is which (`hf_hybrid`): without it every
layer would be costed as attention."""
TIED_FAMILIES = frozenset({
    "gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "gpt_bigcode", "opt", "bloom", "falcon",
    "starcoder2", "mpt", "codegen",
})
"""Families whose config class ties input and output embeddings unless told otherwise."""
BIASED_GATED_FAMILIES = frozenset({"gpt_oss"})
"""Gated families whose linears carry biases: transformers' `GptOssAttention` (`attention_bias`)
and `GptOssExperts` (`gate_up_proj_bias`, `down_proj_bias`, always present)."""
UNTIED_FAMILIES = GATED_FAMILIES - TIED_FAMILIES | {"gpt_neox", "phi", "gptj"}
_ALTERNATING = frozenset({"gemma2"})
"""Families whose even-indexed layers use the sliding window (transformers' Gemma-2)."""
_MOE_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token")
_GELU = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate")


CHATGLM_KEYS = {"num_layers": "num_hidden_layers", "ffn_hidden_size": "intermediate_size",
                "padded_vocab_size": "vocab_size", "kv_channels": "head_dim"}
"""ChatGLM2/3's `ChatGLMConfig` names (THUDM configuration_chatglm.py) -> the transformers names;
its KV heads are `multi_query_group_num` where `multi_query_attention` is set, and its MLP is
SwiGLU (`dense_h_to_4h` to 2f, `swiglu`, `dense_4h_to_h`: `chatglm` is in `GATED_FAMILIES`)."""


def _chatglm_keys(cfg: dict) -> dict:
    """A ChatGLM config under the transformers names (others kept; a name both configs give is
    the transformers one)."""
    out = dict(cfg)
    for theirs, ours in CHATGLM_KEYS.items():
        if theirs in cfg and ours not in cfg:
            out[ours] = cfg[theirs]
    if cfg.get("multi_query_attention") and "num_key_value_heads" not in cfg:
        # ChatGLMConfig's default group count is 1 (configuration_chatglm.py)
        out["num_key_value_heads"] = cfg.get("multi_query_group_num", 1)
    return out


def is_hf_config(data: dict) -> bool:
    """True when the dict looks like a Hugging Face transformers config."""
    return any(k in data for k in ("num_hidden_layers", "model_type", "architectures", "text_config"))


class _Reader:
    """Typed access to the keys of one config, with errors that name the key and the file."""

    def __init__(self, cfg: dict, source: str, names: dict[str, str] | None = None):
        self.cfg, self.source = cfg, source
        self.names = names or {}  # the file's own name of a key read under another (ChatGLM)

    def fail(self, key: str, value, why: str, fix: str) -> SpecError:
        return SpecError(f"model ({self.source}): `{self.names.get(key, key)}` = {value!r} in the "
                         f"Hugging Face config: {why}; {fix}")

    def count(self, key: str, *, required: bool = False, zero_ok: bool = False,
              fix: str = "give the value of the published config") -> int | None:
        """A positive (or, with `zero_ok`, non-negative) integer; None when absent or null."""
        if key not in self.cfg or self.cfg[key] is None:
            if required:
                raise SpecError(f"model ({self.source}): the Hugging Face config lacks "
                                f"`{self.names.get(key, key)}`; {fix}")
            return None
        v = self.cfg[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(key, v, "must be an integer (not a string, boolean or fraction)", fix)
        if v < 0 or (v == 0 and not zero_ok):
            raise self.fail(key, v, f"must be {'0 or more' if zero_ok else 'a positive integer'}", fix)
        if v > MAX_SPEC_INT:
            raise self.fail(key, v, f"larger than {MAX_SPEC_INT:,} (2^31 - 1), the bound on every "
                            "count and width", fix)
        return v

    def text(self, key: str, fix: str = "give the value of the published config") -> str | None:
        """A string value (an activation or model type name); None when absent or null."""
        v = self.cfg.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self.fail(key, v, f"must be a string (a name such as \"silu\"), not "
                            f"{type(v).__name__}", fix)
        return v

    def first_count(self, keys: tuple[str, ...], **kw) -> int | None:
        present = [k for k in keys if self.cfg.get(k) is not None]
        return self.count(present[0], **kw) if present else None


def text_model_config(cfg: dict) -> tuple[dict, list[str]]:
    """The config of the language model: `text_config` of a multimodal config (with the outer
    name and embedding tie when the inner one lacks them), else the config itself. Also returns
    the names of the sub-models left out (e.g. `vision_config`)."""
    inner = cfg.get("text_config")
    if not isinstance(inner, dict):
        return cfg, []
    merged = dict(inner)
    for key in ("_name_or_path", "tie_word_embeddings"):
        if key in cfg and key not in merged:
            merged[key] = cfg[key]
    merged.setdefault("model_type", cfg.get("model_type"))
    left_out = [k for k, v in cfg.items() if k.endswith("_config") and k != "text_config"
                and isinstance(v, dict) and k != "quantization_config"]
    return merged, left_out


def _activation(cfg: dict, family: str, source: str) -> str:
    r = _Reader(cfg, source)
    act = (r.text("hidden_activation") or r.text("hidden_act") or "silu").lower()
    gelu = act in _GELU or act.startswith("gelu")
    if family in GATED_FAMILIES:
        return "geglu" if gelu else "swiglu"
    if family in PLAIN_FAMILIES:
        return "gelu"
    if act in {"silu", "swish", "swiglu"}:
        return "swiglu"
    warnings.warn(f"model ({source}): model_type {family!r} is not a known family; its "
                  f"`{act}` MLP is taken as plain (two matrices). Write a model TOML with "
                  "`activation = \"geglu\"` if it is gated", InputWarning, stacklevel=3)
    return "gelu"


def _tied(cfg: dict, family: str, source: str) -> bool:
    v = cfg.get("tie_word_embeddings")
    if isinstance(v, bool):
        return v
    if v is not None:  # "true", 1: the parameter count would follow the family's default
        raise _Reader(cfg, source).fail("tie_word_embeddings", v, "not a JSON boolean",
                                        "write true or false, unquoted")
    if family in UNTIED_FAMILIES:
        return False
    return True  # TIED_FAMILIES, and transformers' PretrainedConfig default


def _sliding_layers(r: _Reader, family: str, n_layers: int) -> tuple[int | None, int | None]:
    """(window, layers using it) or (None, None)."""
    cfg = r.cfg
    window = r.count("sliding_window")
    if window is None or cfg.get("use_sliding_window") is False:
        return None, None
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        n = sum(1 for t in types if t == "sliding_attention")
        return (window, n) if n else (None, None)
    if family in _ALTERNATING:
        return window, math.ceil(n_layers / 2)
    pattern = r.count("sliding_window_pattern")
    if pattern:  # Gemma-3: every pattern-th layer is global
        return window, n_layers - n_layers // pattern
    if cfg.get("use_sliding_window") is True:  # Qwen2: layers from max_window_layers on
        first = r.count("max_window_layers", zero_ok=True) or 0
        return window, max(n_layers - first, 0)
    return window, n_layers


def _moe(r: _Reader, family: str, n_layers: int, ffn: int) -> dict | None:
    cfg = r.cfg
    n_experts = r.first_count(_MOE_COUNT_KEYS, zero_ok=True)
    if not n_experts:
        return None
    top_k = r.first_count(_TOP_K_KEYS, fix="give `num_experts_per_tok` (experts per token)")
    if top_k is None:
        raise SpecError(f"model ({r.source}): the Hugging Face config has {n_experts} experts but "
                        "no `num_experts_per_tok`; give the experts each token is routed to")
    f_e = r.count("moe_intermediate_size") or r.count("intermediate_size", required=True)
    moe: dict = {"n_experts": n_experts, "top_k": top_k, "expert_ffn_hidden_size": f_e}
    shared_w = r.count("shared_expert_intermediate_size", zero_ok=True)
    if shared_w:  # Qwen2-MoE: one gated shared expert of this width
        moe |= {"n_shared_experts": 1, "shared_expert_ffn_hidden_size": shared_w}
    elif family in {"llama4", "llama4_text"}:  # Llama-4: one shared expert of `intermediate_size`
        moe |= {"n_shared_experts": 1}
    else:
        moe["n_shared_experts"] = r.count("n_shared_experts", zero_ok=True) or 0
    dense = r.count("first_k_dense_replace", zero_ok=True) or 0
    step = r.first_count(("decoder_sparse_step", "interleave_moe_layer_step", "moe_layer_freq"))
    if step and step > 1:  # a layer is MoE when (index + 1) % step == 0 (Llama-4, Qwen-MoE)
        moe["layer_step"] = step
    only_dense = cfg.get("mlp_only_layers") or []
    if isinstance(only_dense, list) and only_dense:
        extra = len(set(only_dense))
        warnings.warn(f"model ({r.source}): {extra} dense layers (`mlp_only_layers`) sit between "
                      "the MoE layers; they are modelled as leading layers (totals are exact, "
                      "the split into pipeline stages may differ)", InputWarning, stacklevel=3)
        dense += extra
    moe["n_dense_layers"] = min(n_layers, dense)
    groups, topk_groups = r.count("n_group"), r.count("topk_group")
    if groups and topk_groups and groups > 1 and topk_groups < groups:  # group-limited routing
        moe["n_groups"], moe["topk_groups"] = groups, topk_groups
    return moe


def _yarn(scaling) -> dict | None:
    """`YarnSpec` keys of a YaRN `rope_scaling` (its `rope_type`, or the older `type`, "yarn"):
    the factor and DeepSeek's two mscale terms where given; None for any other scaling."""
    if not isinstance(scaling, dict):
        return None
    if str(scaling.get("rope_type") or scaling.get("type") or "").lower() != "yarn":
        return None
    out = {k: scaling[k] for k in ("factor", "mscale", "mscale_all_dim")
           if isinstance(scaling.get(k), (int, float)) and not isinstance(scaling.get(k), bool)}
    return out if "factor" in out else None


def _warn_ignored(r: _Reader, left_out: list[str]) -> None:
    cfg, src = r.cfg, r.source
    ignored = []
    if r.count("attention_chunk_size"):
        ignored.append(f"chunked attention (`attention_chunk_size` = {cfg['attention_chunk_size']}): "
                       "costed as full causal attention, an upper bound")
    if left_out:
        ignored.append(f"the {', '.join(left_out)} sub-model(s): the text model is planned")
    for item in ignored:
        warnings.warn(f"model ({src}): not modelled: {item}", InputWarning, stacklevel=3)


def hf_config_to_model_dict(cfg: dict, default_name: str | None, source: str) -> dict:
    """Map Hugging Face keys onto `ModelSpec` keys (validation happens afterwards).

    `name` is the last part of `_name_or_path`, else `default_name`; when both are missing the
    key is left out and the loader names the model from `model_type` and its size.
    """
    cfg, left_out = text_model_config(cfg)
    names = None
    if str(cfg.get("model_type") or "").lower() == "chatglm":
        cfg = _chatglm_keys(cfg)
        names = {ours: theirs for theirs, ours in CHATGLM_KEYS.items()} \
            | {"num_key_value_heads": "multi_query_group_num"}
    r = _Reader(cfg, source, names)
    fix_missing = "is this the config.json of a decoder-only language model?"
    n_layers = r.count("num_hidden_layers", required=True, fix=fix_missing)
    hidden = r.count("hidden_size", required=True, fix=fix_missing)
    n_heads = r.count("num_attention_heads", required=True, fix=fix_missing)
    vocab = r.count("vocab_size", required=True, fix=fix_missing)
    kv = r.count("num_key_value_heads",
                 fix="remove the key for multi-head attention, or give the number of KV heads")
    family = (r.text("model_type") or "").lower()
    if family in NOT_DECODER_FAMILIES:
        raise r.fail("model_type", family, "an encoder or encoder-decoder model, whose "
                     "bidirectional layers the planner's causal decoder layers do not describe",
                     "give the config of a decoder-only language model")
    key = HYBRID_KEYS.get(family)
    if key is not None and cfg.get(key) is None:
        raise SpecError(f"model ({source}): model_type {family!r} without `{key}`: it says "
                        "which layers are attention and which are not, and without it every "
                        f"layer would be costed as attention; give `{key}` as the published "
                        "config has it")
    r.text("_name_or_path")
    ffn = r.count("intermediate_size_mlp") or r.count(
        "intermediate_size", fix="give the MLP width (`intermediate_size`)")
    if ffn is None:
        if family not in PLAIN_FAMILIES:
            raise SpecError(f"model ({source}): the Hugging Face config lacks `intermediate_size` "
                            "(the MLP width); add it from the published config")
        ffn = 4 * hidden  # GPT-2-style configs leave n_inner out: 4h by definition
    out: dict = {
        "n_layers": n_layers,
        "hidden_size": hidden,
        "n_heads": n_heads,
        "n_kv_heads": kv if kv is not None else n_heads,
        "ffn_hidden_size": ffn,
        "vocab_size": vocab,
        "activation": _activation(cfg, family, source),
        "tied_embeddings": _tied(cfg, family, source),
    }
    name = str(cfg.get("_name_or_path") or "").rstrip("/").split("/")[-1] or default_name
    if name:
        out["name"] = name
    head_dim = r.count("head_dim")
    if head_dim:
        out["head_dim"] = head_dim
    theta = cfg.get("rope_theta")
    if isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0:
        out["rope_theta"] = float(theta)  # exporters write it (Megatron --rotary-base)
    yarn = _yarn(cfg.get("rope_scaling"))
    if yarn:
        out["yarn"] = yarn
    if family in BIASED_GATED_FAMILIES:
        out["linear_bias"] = True
    window, n_window = _sliding_layers(r, family, n_layers)
    if window:
        out["sliding_window"], out["n_sliding_layers"] = window, n_window
    moe = _moe(r, family, n_layers, ffn)
    if moe:
        out["moe"] = moe
    mtp = r.count("num_nextn_predict_layers", zero_ok=True)
    if mtp:  # DeepSeek-V3's multi-token-prediction modules, on the last stage
        out["mtp_layers"] = mtp
    if r.count("kv_lora_rank"):
        fix = "DeepSeek-style latent attention needs every rank and head width"
        out["mla"] = {
            "q_lora_rank": r.count("q_lora_rank", zero_ok=True) or 0,
            "kv_lora_rank": r.count("kv_lora_rank"),
            "qk_nope_head_dim": r.count("qk_nope_head_dim", required=True, fix=fix),
            "qk_rope_head_dim": r.count("qk_rope_head_dim", required=True, fix=fix),
            "v_head_dim": r.count("v_head_dim", required=True, fix=fix),
        }
        out["head_dim"] = out["mla"]["v_head_dim"]
    from .hf_hybrid import hybrid_keys  # hybrid hook: Nemotron-H / Qwen3-Next patterns

    out |= hybrid_keys(r, family, out)
    if out.get("moe", 0) is None:
        out.pop("moe")
    _warn_ignored(r, left_out)
    return out


def size_name(family: str, total: float, active: float) -> str:
    """`<model_type>-<total>B` (plus `-A<active>B` for MoE), e.g. `llama-8.03B`."""
    name = f"{family or 'model'}-{total / 1e9:.3g}B"
    if active < 0.999 * total:
        name += f"-A{active / 1e9:.3g}B"
    return name
