"""Stack presets and files that `extends` another stack preset (`presets._extended`): the base's
settings, overridden by what the file sets, tables merged key by key; bad bases refused."""

import pytest

from autoparallel.errors import SpecError
from autoparallel.presets import _extended, load_stack
from autoparallel.validation.calibrate import kernel_family


def test_a_stack_file_extends_a_preset(tmp_path):
    path = tmp_path / "my-mcore.toml"
    path.write_text('name = "my-mcore"\nextends = "megatron-core"\ngrad_dtype = "bf16"\n'
                    '[sources]\ngrad_dtype = "our launcher sets grad_reduce_in_fp32 = False"\n'
                    '[profile."h100"]\ngemm_efficiency = 0.5\n')
    base, mine = load_stack("megatron-core"), load_stack(str(path))
    assert (mine.name, mine.grad_dtype, base.grad_dtype) == ("my-mcore", "bf16", "fp32")
    # every other setting is the base's
    a, b = base.model_dump(), mine.model_dump()
    assert sorted(k for k in a if a[k] != b[k]) == ["grad_dtype", "name", "profile", "sources"]
    # tables merge key by key: the new source beside the base's, the h100 table replaced whole,
    # the other GPUs' tables kept
    assert mine.sources["grad_dtype"].startswith("our launcher")
    assert mine.sources["tp_comm_overlap"] == base.sources["tp_comm_overlap"]
    assert mine.profile["h100"] == {"gemm_efficiency": 0.5}
    assert {g: mine.profile[g] for g in mine.profile if g != "h100"} == {
        g: base.profile[g] for g in base.profile if g != "h100"}


def test_nemo_automodel_is_torchtitan_with_hybrid_layers():
    # AutoModel parallelises as TorchTitan does (FSDP2 / DTensor), builds Nemotron-3's Mamba
    # layers and keeps bf16 weights and moments; it declares only what differs and shares
    # TorchTitan's kernel family (one fit)
    auto, titan = load_stack("nemo-automodel"), load_stack("torchtitan")
    a, b = auto.model_dump(), titan.model_dump()
    assert sorted(k for k in a if a[k] != b[k]) == [
        "description", "frameworks", "hybrid_layers", "kernels", "name", "optimizer_dtype",
        "sources"]
    assert auto.hybrid_layers and not titan.hybrid_layers
    assert (auto.optimizer_dtype, titan.optimizer_dtype) == ("bf16", "fp32")
    assert kernel_family("nemo-automodel") == kernel_family("torchtitan") == "torchtitan"
    assert auto.profile == titan.profile


def test_bad_bases_are_refused_with_the_field_named(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\nextends = "torchtitn"\n')
    with pytest.raises(SpecError, match=r"`extends` = 'torchtitn' is not a stack preset\. "
                                        r"Did you mean 'torchtitan'"):
        load_stack(str(path))
    path.write_text('name = "s"\nextends = 3\n')
    with pytest.raises(SpecError, match=r"`extends` = 3 is not a stack preset.*Presets: "):
        load_stack(str(path))
    # a preset that would extend itself (or one of its own bases) is a circle
    with pytest.raises(SpecError, match=r"runs in a circle \(torchtitan -> torchtitan\)"):
        _extended({"name": "torchtitan", "extends": "torchtitan"}, "preset torchtitan",
                  ("torchtitan",))


def test_automodel_keeps_bf16_parameters_and_moments():
    # AutoModel loads the model in bf16 (torch_dtype "auto" -> bfloat16) and steps torch Adam on
    # it: bf16 parameters 2 + bf16 gradients 2 + bf16 moments 4 = 8 bytes per parameter, half of
    # TorchTitan's fp32-sharded 16 (4 + 4 + 8), each sharded over the 8 ZeRO-3 ranks
    from autoparallel import Layout, make_problem
    from autoparallel.cost.model_arch import build_arch
    from autoparallel.evaluate import evaluate
    from autoparallel.layouts import LayoutTable

    lay = Layout(dp=8, zero=3, micro_batch=1)  # 16 / (8 x 1) = 2 micro-batches: grads persist
    states = {}
    for stack in ("nemo-automodel", "torchtitan"):
        p = make_problem("llama3-8b", "h100", 8, 4096, 16, stack=stack)
        ev = evaluate(p, LayoutTable.from_layouts([lay], 8))
        states[stack] = sum(float(ev.memory[k][0]) for k in ("params", "grads", "optimizer"))
    n = build_arch(make_problem("llama3-8b", "h100", 8, 4096, 16).model).n_params
    assert states["nemo-automodel"] == pytest.approx(8.0 * n / 8, rel=0.01)
    assert states["torchtitan"] == pytest.approx(16.0 * n / 8, rel=0.01)


def test_automodel_gpt_oss_20b_row_reads_its_launch_config():
    # GT0736 (AutoModel's GPT-OSS 20B on 8 H100): the summary's table prints EP '-'; the config
    # it linked (examples/benchmark/configs/gptoss_20b_te_deepep.yaml @89e3a9fdd) says ep_size 8
    # and activation_checkpointing true (full recompute), both in the settings side table. The
    # row prints 64 heads over a hidden size of 2880, i.e. 45 wide, where gpt-oss's heads are 64
    # wide (config.json head_dim 64): the gpt-oss-20b preset of the same shape gives it, so the
    # Q projection is 2880 x 4096, not 2880 x 2880
    from autoparallel.data import PUBLISHED_RUNS
    from autoparallel.validation.runs import case_from_row, read_runs

    frame = read_runs(PUBLISHED_RUNS)
    row = {k: (None if v == "" else v)
           for k, v in frame[frame.row_id == "GT0736"].iloc[0].to_dict().items()}
    c = case_from_row(row)
    assert c.stack == "nemo-automodel"
    assert (c.layout.dp, c.layout.ep, c.layout.zero, c.layout.micro_batch) == (8, 8, 3, 2)
    assert c.layout.recompute.value == "full"
    assert c.model.head_dim == 64 and c.model.n_heads * c.model.head_dim == 4096
    assert "head_dim 64 from the preset of the same shape" in c.assumptions
    assert "layout from the recipe file (moe_settings.csv): ep 8 (printed none)" in c.assumptions
    # without the side table the row states no EP: skipped with that reason
    from autoparallel.validation.modelspec import RowSkip
    with pytest.raises(RowSkip, match="ep not stated"):
        case_from_row(dict(row, setting_ep=None))


def test_gpt_oss_rows_take_the_sliding_window_of_the_preset_of_their_shape():
    # The Megatron-Bridge tables print gpt-oss-120b's layers, widths, heads, KV heads, vocabulary
    # and experts but no attention window; gpt-oss runs a 128-token window on the alternate
    # half of its layers (HF openai/gpt-oss-120b config.json: sliding_window 128, layer_types
    # alternating sliding_attention / full_attention over 36 layers; Megatron-Bridge
    # gpt_oss_bridge.py sets window_size from it): the row takes it from the gpt-oss-120b
    # preset, whose shape and 128 experts it shares, and says so. A row of the same dense shape
    # but other experts would not match.
    from autoparallel.data import PUBLISHED_RUNS
    from autoparallel.validation.modelspec import _window_from_preset
    from autoparallel.validation.runs import case_from_row, read_runs

    frame = read_runs(PUBLISHED_RUNS)
    row = {k: (None if v == "" else v)
           for k, v in frame[frame.row_id == "GT0743"].iloc[0].to_dict().items()}
    c = case_from_row(row)
    assert (c.model.sliding_window, c.model.n_sliding_layers) == (128, 18)
    assert "sliding window 128 on 18 layers from the preset of the same shape" in c.assumptions
    assert _window_from_preset(dict(row, moe_experts=64)) is None
    # the window shortens the attention of 18 of the 36 layers: at 4,096 tokens a causal layer
    # attends to 2,048.5 keys per query on average, a 128-window layer to at most 128, so the
    # step is faster than the same row without the window
    from autoparallel.evaluate import evaluate
    from autoparallel.validation.runs import RULES

    wide = c.problem().model.model_copy(update={"sliding_window": None, "n_sliding_layers": None})
    ev = evaluate(c.problem(), c.table(), RULES)
    ev_wide = evaluate(c.problem().model_copy(update={"model": wide}), c.table(), RULES)
    assert float(ev.time["compute"][0]) < float(ev_wide.time["compute"][0])


def test_nemo_recipe_rows_take_their_tokenizer_padded_as_megatron_pads_it():
    # NeMo 24.07's performance table prints GPT-3 and Nemotron-3 rows without a vocabulary; the
    # notes name the recipe ("arch: NeMo GPTConfig20B"). NeMo's performance scripts tokenize
    # GPT-3 with nvidia/megatron-gpt2-345m (GPT-2 BPE: 50,257 tokens, OpenAI encoder.json) and
    # Nemotron with a NullTokenizer of 256,000; Megatron pads the vocabulary to a multiple of
    # 128 x TP. By hand: GPT3-20B at TP2 -> ceil(50257 / 256) = 197 -> 197 x 256 = 50,432;
    # GPT3-5B at TP1 -> ceil(50257 / 128) = 393 -> 50,304; Nemotron-8B at TP2: 256,000 is
    # 1,000 x 256, unpadded.
    from autoparallel.data import PUBLISHED_RUNS
    from autoparallel.validation.modelspec import RowSkip, model_from_row
    from autoparallel.validation.runs import read_runs

    frame = read_runs(PUBLISHED_RUNS).set_index("row_id")

    def row(rid):
        return {k: (None if v == "" else v) for k, v in frame.loc[rid].to_dict().items()}

    for rid, vocab in (("GT0539", 50432), ("GT0538", 50304), ("GT0545", 256000)):
        spec, assumptions = model_from_row(row(rid))
        assert spec.vocab_size == vocab, rid
        assert any(a.startswith(f"vocab {vocab} (") for a in assumptions), rid
    # a stated vocabulary wins; a row naming no recipe still lacks one
    spec, _ = model_from_row(dict(row("GT0539"), vocab=51200))
    assert spec.vocab_size == 51200
    with pytest.raises(RowSkip, match="vocab missing"):
        model_from_row(dict(row("GT0539"), notes="", derived_values=""))


def test_a_figure_its_source_marks_a_known_regression_is_not_scored():
    # Megatron-Bridge's 26.06.01 table footnotes its two GPT-OSS 120B rows: "Performance
    # regression in GPT-OSS 120B pre-training is a known issue" (cudnn-frontend #256). Their
    # layouts ran at 28,947 (GB200) and 33,166 (GB300) tokens/s/GPU in 26.06 against 18,304 and
    # 20,288 here: the rows say so and are skipped with that reason; the 26.06 rows are scored.
    from autoparallel.data import PUBLISHED_RUNS
    from autoparallel.validation.modelspec import RowSkip
    from autoparallel.validation.runs import case_from_row, read_runs

    frame = read_runs(PUBLISHED_RUNS).set_index("row_id", drop=False)

    def row(rid):
        return {k: (None if v == "" else v) for k, v in frame.loc[rid].to_dict().items()}

    for rid in ("GT0759", "GT0760"):
        with pytest.raises(RowSkip, match="known performance regression"):
            case_from_row(row(rid))
    assert case_from_row(row("GT0783")).row_id == "GT0783"
