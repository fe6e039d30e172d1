"""Specs and loaders: presets, files, Hugging Face configs, and readable errors."""

import json

import pytest

from autoparallel import SpecError, load_gpu, load_model, make_problem
from autoparallel.presets import list_gpus, list_models

REQUIRED_MODELS = {"gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b",
                   "deepseek-v3", "qwen3-30b-a3b"}
REQUIRED_GPUS = {"a100-40gb", "a100-80gb", "h100", "h200", "h800", "b200", "gb200", "mi300x"}


def test_required_presets_present_and_sourced():
    assert REQUIRED_MODELS <= set(list_models())
    assert REQUIRED_GPUS <= set(list_gpus())
    for name in REQUIRED_GPUS:
        g = load_gpu(name)
        for field in ("bf16_tflops", "hbm_gib", "hbm_tb_per_s", "scaleup_gb_per_s", "nic_gbit_per_s"):
            assert field in g.sources, f"{name}.{field} has no source"
    assert load_gpu("gb200").scaleup_domain == 72


def test_unknown_preset_suggests_close_names():
    with pytest.raises(SpecError) as exc:
        load_model("llama3-7b")
    assert "llama3-70b" in str(exc.value) and "llama3-8b" in str(exc.value)
    with pytest.raises(SpecError, match="h100"):
        load_gpu("h10")


def test_unknown_and_missing_keys(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text('name = "x"\nn_layers = 2\nhidden_size = 64\nn_heads = 4\nffn_hidden_size = 128\n'
                 'vocab_size = 100\nhiden = 3\n')
    with pytest.raises(SpecError) as exc:
        load_model(str(f))
    assert "`hiden`" in str(exc.value) and "unknown key" in str(exc.value)
    f.write_text('name = "x"\nn_layers = 2\nhidden_size = 64\nn_heads = 4\nffn_hidden_size = 128\n')
    with pytest.raises(SpecError, match="`vocab_size` is required"):
        load_model(str(f))


@pytest.mark.parametrize("key,value", [("n_layers", 0), ("hidden_size", -8), ("vocab_size", 0)])
def test_non_positive_sizes(tmp_path, key, value):
    data = dict(name="x", n_layers=2, hidden_size=64, n_heads=4, ffn_hidden_size=128, vocab_size=100)
    data[key] = value
    f = tmp_path / "m.json"
    f.write_text(json.dumps(data))
    with pytest.raises(SpecError) as exc:
        load_model(str(f))
    assert f"`{key}` = {value}" in str(exc.value) and "greater than 0" in str(exc.value)


def test_heads_not_multiple_of_kv_heads(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text('name="x"\nn_layers=2\nhidden_size=64\nn_heads=6\nn_kv_heads=4\n'
                 'ffn_hidden_size=128\nvocab_size=100\n')
    with pytest.raises(SpecError, match="multiple of `n_kv_heads`"):
        load_model(str(f))


def test_hf_config_llama_and_deepseek(tmp_path):
    llama = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
             "vocab_size": 128256, "tie_word_embeddings": False, "hidden_act": "silu",
             "rope_theta": 500000.0}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(llama))
    m = load_model(str(f))
    ref = load_model("llama3-8b")
    assert (m.n_layers, m.hidden_size, m.n_kv_heads, m.ffn_hidden_size, m.vocab_size) == \
        (ref.n_layers, ref.hidden_size, ref.n_kv_heads, ref.ffn_hidden_size, ref.vocab_size)
    ds = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
          "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_hidden_layers": 61,
          "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
          "num_experts_per_tok": 8, "first_k_dense_replace": 3, "vocab_size": 129280,
          "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
          "qk_rope_head_dim": 64, "v_head_dim": 128, "hidden_act": "silu"}
    f.write_text(json.dumps(ds))
    m = load_model(str(f))
    assert m.moe.n_experts == 256 and m.moe.n_dense_layers == 3 and m.mla.kv_lora_rank == 512
    mix = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
           "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000}
    f.write_text(json.dumps(mix))
    m = load_model(str(f))
    assert m.moe.n_experts == 8 and m.moe.expert_ffn_hidden_size == 14336


def test_cluster_gpus_not_multiple_of_node():
    with pytest.raises(SpecError, match="not a multiple of `gpus_per_node`"):
        make_problem("llama3-8b", "h100", 12, 4096, 64)
    make_problem("llama3-8b", "h100", 4, 4096, 64)  # part of one node is fine


def test_malformed_toml(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("name = \n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_model(str(f))
