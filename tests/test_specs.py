"""Specs and loaders: presets, files, Hugging Face configs, and readable errors."""

import json

import pytest

from autoparallel import SpecError, load_gpu, load_model, make_problem
from autoparallel.presets import list_gpus, list_models

REQUIRED_MODELS = {"gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b",
                   "deepseek-v3", "qwen3-30b-a3b"}
REQUIRED_GPUS = {"a100-40gb", "a100-80gb", "h100", "h100-96gb", "h200", "h800", "b200", "b300",
                 "gb200", "gb300", "mi300x"}


def test_required_presets_present_and_sourced():
    assert REQUIRED_MODELS <= set(list_models())
    assert REQUIRED_GPUS <= set(list_gpus())
    for name in REQUIRED_GPUS:
        g = load_gpu(name)
        for field in ("bf16_tflops", "hbm_gib", "hbm_tb_per_s", "scaleup_gb_per_s", "nic_gbit_per_s"):
            assert field in g.sources, f"{name}.{field} has no source"
    assert load_gpu("gb200").scaleup_domain == 72


def test_blackwell_ultra_presets_against_their_sources():
    """Numbers derived here from the vendors' rack and node figures, not read off the presets:
    GB300 NVL72 (72 GPUs) 1,080 PFLOPS dense FP4, 720 sparse FP8, 360 sparse BF16, 20 TB /
    576 TB/s HBM; DGX B300 (8 GPUs) 144 sparse FP4 (dense = 3/4 sparse on Blackwell Ultra),
    72 sparse FP8, 36 sparse BF16; 288 GB HBM3e per GPU; NVLink 5 1.8 TB/s bidirectional."""
    gb300, b300, gb200, b200 = (load_gpu(n) for n in ("gb300", "b300", "gb200", "b200"))
    assert gb300.fp4_tflops == pytest.approx(1_080_000 / 72)
    assert gb300.fp8_tflops == pytest.approx(720_000 / 72 / 2)
    assert gb300.bf16_tflops == pytest.approx(360_000 / 72 / 2)
    assert gb300.hbm_tb_per_s == pytest.approx(576 / 72)
    assert b300.fp4_tflops == pytest.approx(144_000 * 3 / 4 / 8)
    assert b300.fp8_tflops == pytest.approx(72_000 / 8 / 2)
    assert b300.bf16_tflops == pytest.approx(36_000 / 8 / 2)
    for g in (gb300, b300):
        assert g.hbm_gib == pytest.approx(288e9 / 2**30, abs=0.5)
        assert g.scaleup_gb_per_s == 1800 / 2 and g.block_scaling and g.generation == "blackwell"
        assert g.nic_gbit_per_s == 800  # one ConnectX-8 per GPU
    # Blackwell Ultra: 1.5x the FP4 of Blackwell, the same FP8 and BF16 peaks
    assert gb300.fp4_tflops == 1.5 * gb200.fp4_tflops
    assert (gb300.fp8_tflops, gb300.bf16_tflops) == (gb200.fp8_tflops, gb200.bf16_tflops)
    assert (b300.fp8_tflops, b300.bf16_tflops) == (b200.fp8_tflops, b200.bf16_tflops)
    assert (gb300.scaleup_domain, b300.scaleup_domain) == (72, 8)
    assert (gb300.tdp_w, b300.tdp_w) == (1400, 1100)
    # the 500 W HBM2e H100: peak between the NVL (835) and SXM (989) parts, 6 HBM2e stacks
    h96 = load_gpu("h100-96gb")
    assert 835 < h96.bf16_tflops < 989 and h96.fp8_tflops == 2 * h96.bf16_tflops
    assert (h96.hbm_gib, h96.tdp_w) == (95, 500)
    assert h96.hbm_tb_per_s == pytest.approx(2.0 * 6 / 5)


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


def test_a_node_that_does_not_split_into_domains_and_a_gpu_too_small_for_anything():
    # scaleup_domain 3 on 8-GPU nodes was accepted (TP groups of 3 on an 8-GPU board); a GPU of
    # 0.001 GiB said "needs 18.4 GiB of its -1.1 usable ... try more GPUs"
    from autoparallel.search.plan import plan

    odd = load_gpu("h100").model_copy(update={"scaleup_domain": 3, "name": "odd"})
    with pytest.raises(SpecError, match="a node of 8 GPUs does not split into whole scale-up "
                                        "domains of 3"):
        make_problem("llama3-8b", odd, 8, 4096, 64)
    assert make_problem("llama3-8b", odd, 3, 4096, 64, gpus_per_node=3).cluster.nvlink_domain == 3
    tiny = load_gpu("h100").model_copy(update={"hbm_gib": 0.001, "name": "tiny"})
    res = plan(make_problem("llama3-8b", tiny, 8, 4096, 64), top=1)
    assert res.n_fit == 0
    said = res.nothing_fits_message()
    assert "less than the CUDA context and NCCL buffers alone" in said
    assert "try more GPUs" not in said
