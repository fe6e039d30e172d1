"""Hugging Face configs as published: parameter counts against the authors' figures, family
rules (gated MLPs, tied embeddings, shared experts, nested text configs, sliding windows),
names, and clear errors for impossible values. Sources of the fixtures and figures:
tests/data/hf/README.md."""

import json
import warnings

import pytest

from autoparallel.cost.model_arch import build_arch
from autoparallel.errors import InputWarning, SpecError
from autoparallel.presets import load_model
from conftest import DATA, run_cli

HF = DATA / "hf"


def _load(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputWarning)
        return load_model(str(HF / f"{name}.json"))


def _counts(name: str) -> tuple[float, float, object]:
    arch = build_arch(_load(name))
    return arch.n_params, arch.n_params_active, arch


def _within(ours: float, published: float, tol: float) -> bool:
    return abs(ours / published - 1.0) <= tol


# (fixture, published total, published active or None for dense, source)
PUBLISHED = [
    ("llama-3.1-8b", 8.03e9, None, "Hub model page meta-llama/Llama-3.1-8B: 8.03B params"),
    ("llama-3.1-70b", 70.6e9, None, "Hub model page meta-llama/Llama-3.1-70B: 70.6B params"),
    ("llama-3.1-405b", 405e9, None, "Llama 3 paper, arXiv 2407.21783, Table 3: 405B"),
    ("qwen2.5-72b", 72.7e9, None, "Qwen2.5-72B model card: Number of Parameters 72.7B"),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, "Qwen3-30B-A3B model card: 30.5B in total, 3.3B activated"),
    ("qwen2-57b-a14b", 57e9, 14e9, "Qwen2 report, arXiv 2407.10671, Table 1: 57B, 14B activated"),
    ("mixtral-8x7b", 46.7e9, 12.9e9, "Mistral AI, 'Mixtral of experts' (2023-12-11): 46.7B, 12.9B per token"),
    ("deepseek-v3", 671e9, 37e9, "DeepSeek-V3 report, arXiv 2412.19437, abstract: 671B, 37B activated"),
    ("gemma-2-9b", 917_962_752 + 8_324_201_984, None, "Gemma 2 report, arXiv 2408.00118, Table 2"),
    ("gemma-2-27b", 1_180_237_824 + 26_047_480_320, None, "Gemma 2 report, arXiv 2408.00118, Table 2"),
    ("mistral-7b", 7.3e9, None, "Mistral AI, 'Mistral 7B' announcement (2023-09-27): 7.3B"),
    ("phi-3-mini-4k", 3.8e9, None, "Phi-3 report, arXiv 2404.14219: phi-3-mini, 3.8B"),
    ("qwen3-235b-a22b", 235e9, 22e9, "Qwen3-235B-A22B model card: 235B in total, 22B activated"),
    ("mixtral-8x22b", 141e9, 39e9, "Mistral AI, 'Cheaper, Better, Faster, Stronger' (2024-04-17): 141B, 39B active"),
    ("chatglm3-6b", 6.24e9, None, "Hub model page THUDM/chatglm3-6b: 6.24B params"),
]


@pytest.mark.parametrize("name,total,active,source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_parameter_count_matches_the_published_figure(name, total, active, source):
    ours_total, ours_active, _ = _counts(name)
    assert _within(ours_total, total, 0.01), f"{name}: {ours_total:.4g} vs {total:.4g} ({source})"
    if active is None:
        assert ours_active == ours_total
    else:
        assert _within(ours_active, active, 0.02), f"{name}: active {ours_active:.4g} vs {active:.4g} ({source})"


def test_gpt_oss_120b_counts_with_the_model_cards_active_convention():
    # gpt-oss model card (arXiv 2508.10925, Table 1): 116.83B total, 5.13B active; its active
    # count includes the unembedding but not the embedding table (a lookup, no FLOPs).
    total, active, arch = _counts("gpt-oss-120b")
    assert _within(total, 116.83e9, 0.01)
    assert _within(active - arch.p_embed, 5.13e9, 0.02)
    # the same table: gpt-oss-20b 20.91B total, 3.61B active
    total, active, arch = _counts("gpt-oss-20b")
    assert _within(total, 20.91e9, 0.01)
    assert _within(active - arch.p_embed, 3.61e9, 0.02)


def _vit_params(v: dict) -> float:
    """A ViT encoder's weights from its config: per layer q, k, v, o (h x h, with biases) and a
    two-matrix MLP (h x f, with biases); plus the patch embedding (3 p^2 h) and position table."""
    h, f, n = v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"]
    per_layer = 4 * (h * h + h) + 2 * h * f + f + h + 4 * h
    patches = (v["image_size"] // v["patch_size"]) ** 2 + 1
    return n * per_layer + v["num_channels"] * v["patch_size"] ** 2 * h + patches * h


def test_llama4_scout_reads_the_text_model_and_its_shared_expert():
    # Meta's Llama 4 model card: Scout 109B total (the multimodal checkpoint), 17B active.
    cfg = json.loads((HF / "llama-4-scout-17b-16e.json").read_text())
    v = cfg["vision_config"]
    # pixel-shuffle adapter (f*4 -> projector dims) and projector to the text width
    adapter = v["intermediate_size"] * v["projector_input_dim"] + v["projector_input_dim"] * v["projector_output_dim"]
    projector = v["vision_output_dim"] * cfg["text_config"]["hidden_size"]
    vision = _vit_params(v) + adapter + projector
    total, active, arch = _counts("llama-4-scout-17b-16e")
    assert 0.8e9 < vision < 1.0e9
    assert _within(total + vision, 109e9, 0.01)
    assert _within(active, 17e9, 0.02)
    m = _load("llama-4-scout-17b-16e")
    assert m.moe.n_shared_experts == 1 and m.moe.n_experts == 16 and m.moe.top_k == 1
    assert m.moe.expert_ffn_hidden_size == 8192 and m.ffn_hidden_size == 16384  # intermediate_size_mlp


def test_llama4_warns_about_what_is_not_modelled():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_model(str(HF / "llama-4-scout-17b-16e.json"))
    text = " ".join(str(w.message) for w in caught if issubclass(w.category, InputWarning))
    assert "attention_chunk_size" in text and "vision_config" in text


def test_gemma2_is_a_gated_geglu_with_tied_embeddings_and_alternating_windows():
    m = _load("gemma-2-9b")
    assert m.activation == "geglu" and m.tied_embeddings  # config has no tie key: family default
    assert m.sliding_window == 4096 and m.n_sliding_layers == 21  # even-indexed layers of 42
    arch = build_arch(m)
    # 3 matrices per MLP: 42 x 3 x 3584 x 14336; a plain GeLU would lose a third of them
    assert arch.p_mlp == 3 * 3584 * 14336
    assert arch.p_output == 0.0


def test_qwen2_moe_shared_expert_has_its_own_width():
    m = _load("qwen2-57b-a14b")
    assert m.moe.n_shared_experts == 1 and m.moe.shared_expert_ffn_hidden_size == 20480
    assert build_arch(m).p_shared == 3 * 3584 * 20480
    # without the shared expert the model would be 6.2B short: 28 x 3 x 3584 x 20480
    assert _counts("qwen2-57b-a14b")[0] - 28 * 3 * 3584 * 20480 < 0.9 * 57e9


def test_sliding_window_shrinks_attention_flops_only_beyond_the_window():
    arch = build_arch(_load("mistral-7b"))  # 4096-token window on every layer
    assert arch.attn_pair_fraction(4096) == 1.0
    # s = 16384, w = 4096: (2sw - w^2) / s^2 = 7/16 of the causal pairs
    assert arch.attn_pair_fraction(16384) == pytest.approx(7 / 16)
    gemma = build_arch(_load("gemma-2-9b"))  # half the layers windowed
    assert gemma.attn_pair_fraction(16384) == pytest.approx(0.5 + 0.5 * 7 / 16)
    qwen = build_arch(_load("qwen2.5-72b"))  # use_sliding_window false: no window
    assert qwen.attn_pair_fraction(131072) == 1.0


def test_names_come_from_the_config_not_from_config_json(tmp_path):
    cfg = json.loads((HF / "mixtral-8x7b.json").read_text())
    folder = tmp_path / "my-mixtral"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_model(str(folder / "config.json")).name == "mixtral-46.7B-A12.9B"
    (folder / "config.json").write_text(json.dumps({**cfg, "_name_or_path": "mistralai/Mixtral-8x7B-v0.1"}))
    assert load_model(str(folder / "config.json")).name == "Mixtral-8x7B-v0.1"
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "model_type"}))
    assert load_model(str(folder / "config.json")).name == "my-mixtral"
    assert _load("llama-3.1-8b").name == "llama-3.1-8b"  # a file named by the user keeps its name


@pytest.mark.parametrize("key,value,words", [
    ("num_key_value_heads", 0, "must be a positive integer"),
    ("intermediate_size", 0, "must be a positive integer"),
    ("hidden_size", -4096, "must be a positive integer"),
    ("num_hidden_layers", True, "must be an integer"),
    ("num_attention_heads", "32", "must be an integer"),
    ("vocab_size", 32000.5, "must be an integer"),
    # read as untied before (the family's default): 7.2 vs 7.5 B parameters, silently
    ("tie_word_embeddings", "true", "not a JSON boolean"),
    ("tie_word_embeddings", 1, "not a JSON boolean"),
    # an encoder planned as a causal decoder, silently
    ("model_type", "bert", "an encoder or encoder-decoder model"),
])
def test_invalid_values_are_errors_naming_the_field(tmp_path, key, value, words):
    cfg = json.loads((HF / "mistral-7b.json").read_text())
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**cfg, key: value}))
    with pytest.raises(SpecError) as exc:
        load_model(str(f))
    msg = str(exc.value)
    assert f"`{key}` = {value!r}" in msg and words in msg and "\n" not in msg


def test_a_hybrid_family_without_its_layer_key_is_an_error(tmp_path):
    # qwen3_next without `layer_types` was costed as attention on every layer
    cfg = json.loads((HF / "mistral-7b.json").read_text())
    for family, key in (("qwen3_next", "layer_types"), ("nemotron_h", "hybrid_override_pattern")):
        f = tmp_path / "config.json"
        f.write_text(json.dumps({**cfg, "model_type": family}))
        with pytest.raises(SpecError) as exc:
            load_model(str(f))
        assert f"model_type {family!r} without `{key}`" in str(exc.value)


def test_moe_without_top_k_is_an_error(tmp_path):
    cfg = json.loads((HF / "mixtral-8x7b.json").read_text())
    del cfg["num_experts_per_tok"]
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="num_experts_per_tok"):
        load_model(str(f))


def test_plan_header_and_json_carry_the_parameter_counts():
    model = HF / "qwen3-30b-a3b.json"
    args = ["--model", model, "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "64", "--top", "2", "--keep", "0"]
    r = run_cli("plan", *args)
    assert r.returncode == 0, r.stderr
    assert "qwen3-30b-a3b (30.5B params, 3.35B active)" in r.stdout
    r = run_cli("plan", *args, "--format", "json")
    data = json.loads(r.stdout)
    total, active, _ = _counts("qwen3-30b-a3b")
    assert data["model_params"] == {"total": round(total), "active": round(active)}
    assert data["ranked"][0]["model_params"] == data["model_params"]


def test_cli_prints_model_warnings_as_one_line():
    r = run_cli("estimate", "--model", HF / "llama-4-scout-17b-16e.json", "--gpu", "h100",
                "--gpus", "8", "--seq-len", "4096", "--global-batch", "64", "--ep", "8",
                "--format", "json")
    warn_lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn_lines) == 2  # chunked attention; the vision sub-model
    assert any("attention_chunk_size" in w for w in warn_lines)
    assert "Traceback" not in r.stderr and "InputWarning" not in r.stderr
    # DeepSeek-V3's multi-token prediction is modelled now: no warning left for it
    r = run_cli("estimate", "--model", HF / "deepseek-v3.json", "--gpu", "h100", "--gpus", "8",
                "--seq-len", "4096", "--global-batch", "64", "--ep", "8", "--format", "json")
    assert r.returncode == 0 and not [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]


def test_deepseek_v3_reads_mtp_dense_leaders_and_group_limited_routing():
    """config.json: num_nextn_predict_layers 1, first_k_dense_replace 3, n_group 8 with
    topk_group 4 (each token's experts from 4 of 8 groups)."""
    m = _load("deepseek-v3")
    assert m.mtp_layers == 1 and m.moe.n_dense_layers == 3
    assert (m.moe.n_groups, m.moe.topk_groups) == (8, 4)
    arch = build_arch(m)
    # the published 671B leave the MTP module out; its block is one more MoE layer plus the
    # 2h -> h projection and two norms: 11.27e9 + 0.34e9 ... = about 11.6e9
    assert arch.mtp_block_params == pytest.approx(
        arch.moe_layer_params + 2 * 7168 * 7168 + 2 * 7168, rel=1e-12)


def test_kimi_k2_is_deepseek_v3_shaped_without_group_limit_or_mtp():
    """Kimi K2 report (arXiv 2507.20534): 1.04T total, 32B activated; the config gives 384
    experts, 64 MLA heads, one leading dense layer, n_group 1, no MTP. Our count, 1.026T, is
    1.3 % below the rounded headline; the activated 32B leaves out the embedding table (a
    lookup), as gpt-oss's card does."""
    total, active, arch = _counts("kimi-k2-base")
    m = _load("kimi-k2-base")
    assert m.activation == "swiglu" and m.mtp_layers == 0 and m.moe.n_groups is None
    assert m.moe.n_experts == 384 and m.moe.n_dense_layers == 1
    assert _within(total, 1.04e12, 0.02)
    assert _within(active - arch.p_embed, 32e9, 0.01)


def test_llama4_maverick_interleaves_dense_and_moe_layers():
    """interleave_moe_layer_step 2: layers 1, 3, ..., 47 are MoE (24 of 48), the others dense
    of intermediate_size_mlp 16384. Meta's card: 400B total with the vision encoder, 17B
    active."""
    m = _load("llama-4-maverick-17b-128e")
    assert m.moe.layer_step == 2 and m.moe.n_dense_layers == 0
    total, active, arch = _counts("llama-4-maverick-17b-128e")
    assert (arch.n_dense_layers, arch.n_moe_layers) == (24, 24)
    assert _within(total, 400e9, 0.01) and _within(active, 17e9, 0.02)


@pytest.mark.parametrize("preset,fixture", [
    ("deepseek-v3", "deepseek-v3"), ("qwen3-235b-a22b", "qwen3-235b-a22b"),
    ("qwen3-30b-a3b", "qwen3-30b-a3b"), ("mixtral-8x22b", "mixtral-8x22b"),
    ("llama4-maverick", "llama-4-maverick-17b-128e"), ("llama4-scout", "llama-4-scout-17b-16e"),
    ("gpt-oss-120b", "gpt-oss-120b"), ("gpt-oss-20b", "gpt-oss-20b"), ("kimi-k2", "kimi-k2-base"),
])
def test_moe_presets_agree_with_their_published_configs(preset, fixture):
    """Each MoE preset is the published config.json, field for field where the cost model reads
    them: the same layer kinds, parameter counts, MTP modules, routing groups, YaRN
    concentration and expert biases (gpt-oss: 1.347 and biased; the others 1 and none)."""
    a, b = build_arch(load_model(preset)), build_arch(_load(fixture))
    for field in ("n_params", "n_params_active", "n_dense_layers", "n_moe_layers", "n_mtp",
                  "n_groups", "topk_groups", "window", "n_window_layers", "rope_concentration",
                  "expert_bias"):
        assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-12), field


def test_a_snapshot_folder_an_empty_name_and_a_capitalised_preset(tmp_path):
    # a downloaded snapshot is a folder holding config.json ("Is a directory" before); an empty
    # --model read the current folder; model presets took only their exact spelling
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text((HF / "llama-3.1-8b.json").read_text())
    assert load_model(str(folder)) == load_model(str(folder / "config.json"))
    with pytest.raises(SpecError, match="is a folder; give a .toml/.json file"):
        load_model(str(tmp_path))
    with pytest.raises(SpecError, match="`model` is empty"):
        load_model("")
    assert load_model("Llama3-8B") == load_model("llama3-8b")


def test_chatglm_reads_its_own_key_names():
    """ChatGLM2/3 configs name their sizes their own way (`num_layers`, `ffn_hidden_size`,
    `padded_vocab_size`, `kv_channels`, `multi_query_group_num`): ChatGLM3-6B is 28 layers of
    4096 with 32 heads of 128 over 2 KV groups, a SwiGLU MLP of 13,696 and an untied 65,024
    vocabulary (the fixture's values); a config without `multi_query_attention` has full heads."""
    m = _load("chatglm3-6b")
    assert (m.n_layers, m.hidden_size, m.n_heads, m.n_kv_heads, m.ffn_hidden_size,
            m.vocab_size, m.head_dim) == (28, 4096, 32, 2, 13696, 65024, 128)
    assert m.activation == "swiglu" and m.tied_embeddings is False
    data = json.loads((HF / "chatglm3-6b.json").read_text())
    data["multi_query_attention"] = False
    from autoparallel.presets.hf import hf_config_to_model_dict
    assert hf_config_to_model_dict(data, None, "test")["n_kv_heads"] == 32


def test_a_bad_chatglm_size_is_named_as_the_file_names_it(tmp_path):
    data = json.loads((HF / "chatglm3-6b.json").read_text())
    data["num_layers"] = "28"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    r = run_cli("estimate", "--model", str(path), "--gpu", "h100", "--gpus", "8", "--seq-len",
                "4096", "--global-batch", "8")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "`num_layers` = '28'" in r.stderr and "must be an integer" in r.stderr
