"""Translate a Hugging Face `config.json` (Llama, Mistral, Mixtral, Qwen2/3, Qwen3-MoE,
DeepSeek-V3) into `ModelSpec` keys. Keys of other model features are ignored."""

from __future__ import annotations

from ..errors import SpecError

_MOE_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")


def is_hf_config(data: dict) -> bool:
    """True when the dict looks like a Hugging Face transformers config."""
    return "num_hidden_layers" in data or "model_type" in data or "architectures" in data


def hf_config_to_model_dict(cfg: dict, default_name: str, source: str) -> dict:
    """Map Hugging Face keys onto `ModelSpec` keys (validation happens afterwards)."""
    required = ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"]
    missing = [k for k in required if k not in cfg]
    if missing:
        raise SpecError(
            f"model ({source}): Hugging Face config lacks {', '.join(f'`{k}`' for k in missing)}"
        )
    act = str(cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))).lower()
    out: dict = {
        "name": str(cfg.get("_name_or_path") or default_name).split("/")[-1] or default_name,
        "n_layers": cfg["num_hidden_layers"],
        "hidden_size": cfg["hidden_size"],
        "n_heads": cfg["num_attention_heads"],
        "n_kv_heads": cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        "ffn_hidden_size": cfg.get("intermediate_size") or 4 * cfg["hidden_size"],
        "vocab_size": cfg["vocab_size"],
        "activation": "swiglu" if act in {"silu", "swish", "swiglu"} else "gelu",
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
    }
    if cfg.get("rope_theta"):
        out["rope_theta"] = float(cfg["rope_theta"])
    if cfg.get("head_dim"):
        out["head_dim"] = cfg["head_dim"]
    n_experts = next((cfg[k] for k in _MOE_COUNT_KEYS if cfg.get(k)), None)
    if n_experts:
        out["moe"] = {
            "n_experts": n_experts,
            "top_k": cfg.get("num_experts_per_tok", 2),
            "expert_ffn_hidden_size": cfg.get("moe_intermediate_size") or out["ffn_hidden_size"],
            "n_shared_experts": cfg.get("n_shared_experts") or 0,
            "n_dense_layers": cfg.get("first_k_dense_replace") or 0,
        }
    if cfg.get("kv_lora_rank"):
        out["mla"] = {
            "q_lora_rank": cfg.get("q_lora_rank") or 0,
            "kv_lora_rank": cfg["kv_lora_rank"],
            "qk_nope_head_dim": cfg.get("qk_nope_head_dim", 128),
            "qk_rope_head_dim": cfg.get("qk_rope_head_dim", 64),
            "v_head_dim": cfg.get("v_head_dim", 128),
        }
        out.setdefault("head_dim", cfg.get("v_head_dim", 128))
    return out
