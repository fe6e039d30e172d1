"""Hybrid keys of Hugging Face configs (`presets.hf.hf_config_to_model_dict` calls `hybrid_keys`).

- Nemotron-H / Nemotron-3 (`model_type` `nemotron_h`; HF `NemotronHConfig`):
  `hybrid_override_pattern` (letters `M`, `*`, `-`, `E`, Megatron's), `mamba_num_heads`,
  `mamba_head_dim`, `ssm_state_size`, `n_groups`, `conv_kernel`, `chunk_size` (`expand` is
  implied: d_inner = heads x head dim), `mlp_hidden_act = relu2`, MoE `n_routed_experts`,
  `num_experts_per_tok`, `moe_intermediate_size`, `moe_shared_expert_intermediate_size`,
  `moe_latent_size`.
- Qwen3-Next (`qwen3_next`): `layer_types` (`linear_attention` / `full_attention`), each layer a
  mixer and an MoE (two letters), `linear_num_key_heads`, `linear_num_value_heads`,
  `linear_key_head_dim`, `linear_value_head_dim`, `linear_conv_kernel_dim`.
"""

from __future__ import annotations

from ..errors import SpecError


def hybrid_keys(r, family: str, out: dict) -> dict:
    """The `ModelSpec` keys of a hybrid config (empty for any other)."""
    cfg = r.cfg
    if cfg.get("hybrid_override_pattern") is not None:
        pattern = r.text("hybrid_override_pattern")
        mamba = {"n_heads": r.count("mamba_num_heads", required=True,
                                    fix="Nemotron-H configs give the Mamba head count")}
        for key, name in (("mamba_head_dim", "head_dim"), ("ssm_state_size", "state_size"),
                          ("n_groups", "n_groups"), ("conv_kernel", "conv_kernel"),
                          ("chunk_size", "chunk_size")):
            v = r.count(key)
            if v:
                mamba[name] = v
        hy = {"layers": pattern, "mamba": mamba, "n_layers": len(pattern)}
        if (r.text("mlp_hidden_act") or "").lower() == "relu2":
            hy["activation"] = "relu2"
        if "E" in pattern:
            n_e = r.count("n_routed_experts", required=True, fix="an `E` layer needs its experts")
            moe = {"n_experts": n_e,
                   "top_k": r.count("num_experts_per_tok", required=True, fix="give top-k"),
                   "expert_ffn_hidden_size": r.count("moe_intermediate_size", required=True,
                                                     fix="give the expert FFN width")}
            shared = r.count("moe_shared_expert_intermediate_size")
            if shared:
                moe |= {"n_shared_experts": 1, "shared_expert_ffn_hidden_size": shared}
            latent = r.count("moe_latent_size")
            if latent:
                moe["latent_size"] = latent
            hy["moe"] = moe
        else:
            hy["moe"] = None
        return hy
    if cfg.get("layer_types") is not None and family == "qwen3_next":
        types = cfg["layer_types"]
        letters = {"linear_attention": "G", "full_attention": "*"}
        bad = [t for t in types if t not in letters]
        if bad or not isinstance(types, list):
            raise SpecError(f"model ({r.source}): `layer_types` has {bad[:1] or types!r}: "
                            "each entry must be 'linear_attention' or 'full_attention'")
        ffn = "E" if out.get("moe") else "-"
        pattern = "".join(letters[t] + ffn for t in types)
        la = {"n_key_heads": r.count("linear_num_key_heads", required=True, fix="give it"),
              "n_value_heads": r.count("linear_num_value_heads", required=True, fix="give it")}
        for key, name in (("linear_key_head_dim", "key_head_dim"),
                          ("linear_value_head_dim", "value_head_dim"),
                          ("linear_conv_kernel_dim", "conv_kernel")):
            v = r.count(key)
            if v:
                la[name] = v
        hy = {"layers": pattern, "linear_attention": la, "n_layers": len(pattern)}
        if out.get("moe"):
            hy["moe"] = {**out["moe"], "n_dense_layers": 0}
        return hy
    return {}
