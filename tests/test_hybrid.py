"""Hybrid models (`cost.layer_types`, `cost.mamba`, `cost.linear_attention`): expected numbers
derived by hand from the sources, not from the code under test."""

from __future__ import annotations

import pandas as pd
import pytest

from autoparallel.cost.model_arch import build_arch
from autoparallel.cost.linear_attention import delta_rule_bytes_per_token, delta_rule_flops_per_token
from autoparallel.cost.mamba import ssd_bytes_per_token, ssd_flops_per_token
from autoparallel.evaluate import estimate, evaluate
from autoparallel.layouts import LayoutTable
from autoparallel.presets import load_model
from autoparallel.problem import make_problem
from autoparallel.specs.layout import Layout
from autoparallel.specs.model import ModelSpec


def test_nemotron_h_8b_parameter_count():
    """Nemotron-H-8B-Base-8K: 8.1e9 published (arXiv 2504.03624 "8B"; the HF checkpoint holds
    8,100,852,736). By hand, h = 4096, 24 Mamba, 4 attention, 24 MLP layers:
    Mamba: in_proj 4096 x (2*8192 + 2*8*128 + 128) = 4096 x 18560; conv (8192 + 2048) x 4 + bias
    10240; A, D, dt 3 x 128; gated-norm 8192; out_proj 8192 x 4096; pre-norm 4096.
    Attention: QKV 4096 x (4096 + 2*1024), out 4096 x 4096, norm 4096.
    MLP (squared ReLU, two matrices): 2 x 4096 x 21504 + norm 4096.
    Embedding and untied output 2 x 131072 x 4096, final norm 4096."""
    h = 4096
    mamba = h * 18560 + 10240 * 4 + 10240 + 3 * 128 + 8192 + 8192 * h + h
    attn = h * (4096 + 2 * 1024) + 4096 * h + h
    mlp = 2 * h * 21504 + h
    total = 24 * mamba + 4 * attn + 24 * mlp + 2 * 131072 * h + h
    arch = build_arch(load_model("nemotron-h-8b"))
    assert arch.n_params == pytest.approx(total, rel=1e-12)
    assert arch.n_params == pytest.approx(8.1e9, rel=0.03)
    assert total == 8_100_852_736  # the HF checkpoint's count


def test_published_sizes_within_three_percent():
    """Nemotron-H-56B 56e9, Nemotron-3 Nano 31.6e9 total, 3.5e9 active (arXiv 2512.20848;
    the model card), Super 120e9 / 12e9 active, Qwen3-Next 80e9 / 3e9 active (HF cards)."""
    for name, total in (("nemotron-h-56b", 56e9), ("nemotron-3-nano", 31.6e9),
                        ("nemotron-3-super", 120e9), ("qwen3-next-80b-a3b", 80e9)):
        assert build_arch(load_model(name)).n_params == pytest.approx(total, rel=0.03), name
    nano = build_arch(load_model("nemotron-3-nano"))
    assert nano.n_params_active == pytest.approx(3.5e9, rel=0.03)  # "3.5B active" (model card)


def test_ssd_scan_flops_by_hand():
    """SSD chunked scan (arXiv 2405.21060 Sec. 6), Nemotron-3 Nano's mixer: Q = 128, N = 128,
    P = 64, H = 64, G = 8: C B^T 2*128*128*8 = 262,144; per head 2*128*64 = 16,384 (intra-chunk
    output) + 4*128*64 = 32,768 (states, state output) + 2*128*64/128 = 128 (recurrence):
    64 x 49,280 = 3,153,920; total 3,416,064 FLOPs per token."""
    m = load_model("nemotron-3-nano").mamba
    assert ssd_flops_per_token(m) == pytest.approx(262_144 + 64 * (16_384 + 32_768 + 128))


def test_ssd_scan_bytes_by_hand():
    """The SSD kernels' HBM bytes per token, Nemotron-3 Nano's mixer (D = 64 x 64 = 4096, N = Q =
    128, G = 8, H = 64), counted kernel by kernel from state-spaces/mamba ssd_combined.py (each
    tensor argument read once, each output written once; z goes to the gated norm, not the scan):
    forward: cumsum dt 2H + 8H; chunk_state x 2D, B 2GN, dt/dA 8H, fp32 states 4D; state_passing
    4D + 2D; bmm B, C 4GN, CB 4GQ; chunk_scan CB 4GQ, x 2D, C 2GN, dt/dA 8H, states 2D, out 2D
    = 6D + 12D + 8GN + 8GQ + 26H = 24,576 + 49,152 + 8,192 + 8,192 + 1,664 = 91,776.
    Backward: 22D + 34D + 38GN + 24GQ + 86H = 90,112 + 139,264 + 38,912 + 24,576 + 5,504 = 298,368.
    At H100's achievable bandwidth (0.85 x 3.35 TB/s) both passes take what the scan's FLOPs (3x
    the forward's 3,416,064) would at 7-8 % of the 989 TFLOP/s peak, as the H100 hybrid runs fit
    (8.2-8.6 % before the roofline, benchmarks/fit_scan_efficiency.py)."""
    m = load_model("nemotron-3-nano").mamba
    fwd, bwd = ssd_bytes_per_token(m)
    assert fwd == 91_776 and bwd == 298_368
    seconds = (fwd + bwd) / (0.85 * 3.35e12)
    assert 3 * 3_416_064 / (seconds * 989e12) == pytest.approx(0.076, abs=0.002)


def test_delta_rule_flops_by_hand():
    """Chunkwise gated delta rule (arXiv 2412.06464 Sec. 3.3), Qwen3-Next: C = 64, d_k = d_v =
    128, 32 value heads: 2*64*(3*128 + 2*128) = 81,920; 64^2/3 = 1,365.33; 6*128*128 = 98,304;
    per head 181,589.33, x 32."""
    g = load_model("qwen3-next-80b-a3b").linear_attention
    assert delta_rule_flops_per_token(g) == pytest.approx(32 * (81_920 + 4096 / 3 + 98_304))


def test_delta_rule_bytes_by_hand():
    """The chunked gated delta rule's HBM bytes per token, Qwen3-Next (32 value heads, d_k = d_v
    = 128, C = 64), counted kernel by kernel from flash-linear-attention's chunk.py: with
    K = V = 32 x 128 = 4,096, S = 32 x 128 x 128 / 64 = 8,192, A = 32 x 64 = 2,048, H = 32:
    forward 12K + 12V + 4S + 2A + 22H = 49,152 + 49,152 + 32,768 + 4,096 + 704 = 135,872;
    backward 42K + 30V + 8S + 4A + 40H = 172,032 + 122,880 + 65,536 + 8,192 + 1,280 = 369,920.
    Memory-bound as Mamba's scan: on H100 at 0.85 x 3.35 TB/s, the FLOPs' time at ~10 % of the
    989 TFLOP/s peak (3 x 32 x 181,589.33 FLOPs)."""
    g = load_model("qwen3-next-80b-a3b").linear_attention
    fwd, bwd = delta_rule_bytes_per_token(g)
    assert fwd == 135_872 and bwd == 369_920
    seconds = (fwd + bwd) / (0.85 * 3.35e12)
    assert 3 * 32 * (81_920 + 4096 / 3 + 98_304) / (seconds * 989e12) == pytest.approx(0.099, abs=0.002)


def test_scans_memory_bound_at_the_default_ceiling():
    """At the default compute ceiling (0.25) both mixers' scans are set by their bytes
    (the hand counts above): raising the ceiling to 0.5 changes no step time, and a ceiling far
    below the floor's equivalent (0.02 against 7-10 %) makes the step slower."""
    for name in ("nemotron-3-nano", "qwen3-next-80b-a3b"):
        model = load_model(name)
        steps = []
        for eff in (0.25, 0.5, 0.02):
            p = make_problem(model, "h100", 8, 4096, 64)
            p = make_problem(model, "h100", 8, 4096, 64,
                             profile=p.profile.model_copy(update={"scan_efficiency": eff}))
            t = LayoutTable.from_layouts([Layout(dp=8, ep=8, micro_batch=1)], 8, model.n_layers)
            steps.append(float(evaluate(p, t).time["step"][0]))
        assert steps[1] == pytest.approx(steps[0], rel=1e-12), name
        assert steps[2] > 1.02 * steps[0], name


def test_scan_note_says_which_limit_binds():
    """`estimate` says per mixer which limit sets the scan. Nemotron-3 Nano on H100, one
    micro-batch of 8,192 tokens, no TP: its kernels' bytes (91,776 + 298,368 per token, above)
    at 0.85 x 3.35 TB/s take 390,144 x 8,192 / 2.8475e12 = 1.12 ms, longer than its FLOPs at the
    0.25 ceiling; at a ceiling of 0.01 the FLOPs (3 x 3,416,064 per token) take longer."""
    from autoparallel.evaluate import estimate as estimate_record

    nano = load_model("nemotron-3-nano")
    p = make_problem(nano, "h100", 8, 8192, 64)
    rec = estimate_record(p, Layout(dp=8, ep=8, micro_batch=1))
    [note] = [n for n in rec["notes"] if n.startswith("Mamba-2 scan")]
    assert note.startswith("Mamba-2 scan: memory-bound, 1.12 ms per layer and micro-batch"), note
    low = p.profile.model_copy(update={"scan_efficiency": 0.01})
    p = make_problem(nano, "h100", 8, 8192, 64, profile=low)
    rec = estimate_record(p, Layout(dp=8, ep=8, micro_batch=1))
    [note] = [n for n in rec["notes"] if n.startswith("Mamba-2 scan")]
    ms = 3 * 3_416_064 * 8192 / (0.01 * p.cluster.gpu.bf16_tflops * 1e12) * 1e3
    assert note.startswith(f"Mamba-2 scan: {ms:.3g} ms per layer and micro-batch at the "
                           "scan_efficiency ceiling 0.01"), note
    assert "bytes alone: 1.12 ms" in note


def _estimate(model, gpus=8, job=None, **lay):
    problem = make_problem(model, "h100", gpus, 4096, 64, **(job or {}))
    layout = Layout(**({"dp": gpus} | lay))
    table = LayoutTable.from_layouts([layout], gpus, problem.model.n_layers)
    return problem, evaluate(problem, table)


@pytest.mark.parametrize("ceiling", [None, 0.01])
def test_mamba_layer_compute_by_hand(ceiling):
    """A model of 4 Mamba layers against one of 2: the difference is two layers' forward and
    backward per micro-batch, by hand from the GEMM roofline, the scan's roofline (its FLOPs at
    scan_efficiency or its kernels' bytes at HBM bandwidth, the longer) and the elementwise
    traffic. Without TP, SP or CP, one micro-batch of s = 4096 tokens:
    in_proj GEMM (4096 x 1024) @ (1024 x 2*2048 + 2*1*64 + 32), out_proj (4096 x 2048) @ (2048 x
    1024); backward 2x the GEMMs and the scan. At the default ceiling the scan is memory-bound;
    at a ceiling of 0.01 its FLOPs (forward, and backward at twice them) set it."""
    base = dict(hidden_size=1024, n_heads=8, ffn_hidden_size=4096, vocab_size=32000,
                activation="relu2", mamba={"n_heads": 32, "head_dim": 64, "state_size": 64,
                                           "n_groups": 1, "chunk_size": 128})
    two = ModelSpec(name="m2", layers="MM", **base)
    four = ModelSpec(name="m4", layers="MMMM", **base)
    job = None
    if ceiling is not None:
        ref = make_problem(two, "h100", 1, 4096, 64).profile
        job = {"profile": ref.model_copy(update={"scan_efficiency": ceiling})}
    p, r2 = _estimate(two, gpus=1, job=job, micro_batch=1)
    _, r4 = _estimate(four, gpus=1, job=job, micro_batch=1)
    prof, gpu = p.profile, p.cluster.gpu
    T, h, d_in, in_w = 4096.0, 1024.0, 2048.0, 2 * 2048 + 2 * 64 + 32
    peak, bw = gpu.bf16_tflops * 1e12, prof.hbm_efficiency * gpu.hbm_tb_per_s * 1e12

    def gemm(M, N, K):
        return max(2 * M * N * K / (prof.gemm_efficiency * peak),
                   2 * (M * K + K * N + M * N) / bw) + prof.gemm_overhead_us * 1e-6

    g = gemm(T, in_w, h) + gemm(T, h, d_in)
    Q, N, P, H, G = 128, 64, 64, 32, 1
    flops = T * (2 * Q * N * G + H * (2 * Q * P + 4 * N * P + 2 * N * P / Q))
    # the SSD kernels' bytes per token (D = 2048, D N / Q = 1024, G N = 64, G Q = 128, H = 32):
    # forward 6 D + 12 D N/Q + 8 G N + 8 G Q + 26 H = 26,944; backward 22 D + 34 D N/Q + 38 G N
    # + 24 G Q + 86 H = 88,128 (kernel tables in cost.mamba, counted from state-spaces/mamba)
    scan_f = max(flops / (prof.scan_efficiency * peak), T * 26_944 / bw)
    scan_b = max(2 * flops / (prof.scan_efficiency * peak), T * 88_128 / bw)
    # memory-bound at the default, FLOP-bound at a ceiling of 0.01
    assert (T * 26_944 / bw > flops / (prof.scan_efficiency * peak)) == (ceiling is None)
    assert (T * 88_128 / bw > 2 * flops / (prof.scan_efficiency * peak)) == (ceiling is None)
    stored = T * (4 * h + 2 * in_w + 4 * d_in)  # norm + in_proj inputs, zxbcdt, scan out, out_proj in
    elem = 2 * prof.elementwise_factor * stored / bw
    per_layer = 3 * g + scan_f + scan_b + 3 * elem  # forward + backward (2x)
    m = 64  # micro-batches per step
    got = float(r4.time["compute"][0] - r2.time["compute"][0])
    assert got == pytest.approx(2 * m * per_layer, rel=1e-9)


def test_pattern_of_attention_and_mlp_matches_the_transformer():
    """Llama-shaped layers written as a pattern of single blocks ('*-' per layer) cost what the
    transformer ledger gives the same model: same parameters, FLOPs, compute and, without TP
    overlap, step time; memory within 1 %. (With TP overlap each block's collectives hide behind
    that block's GEMMs alone, not the whole layer's, so the pattern exposes more.)"""
    base = dict(hidden_size=2048, n_heads=16, n_kv_heads=4, ffn_hidden_size=5632,
                vocab_size=32000, activation="swiglu", rope_theta=10000.0)
    dense = ModelSpec(name="d", n_layers=8, **base)
    hybrid = ModelSpec(name="h", layers="*-" * 8, **base)
    a, b = build_arch(dense), build_arch(hybrid)
    assert b.n_params == pytest.approx(a.n_params, rel=1e-12)
    assert b.model_flops_per_sequence(4096) == pytest.approx(a.model_flops_per_sequence(4096))
    for lay in (dict(tp=2, sp=True, micro_batch=1), dict(tp=1, pp=2, micro_batch=1), dict(tp=2, cp=2, sp=True, micro_batch=1)):
        gpus = 8
        dp = gpus // (lay.get("tp", 1) * lay.get("pp", 1) * lay.get("cp", 1))
        job = {"tp_comm_overlap": False}
        _, ra = _estimate(dense, gpus=gpus, job=job, **(lay | {"dp": dp}))
        _, rb = _estimate(hybrid, gpus=gpus, job=job, **(lay | {"dp": dp}))
        assert float(rb.time["compute"][0]) == pytest.approx(float(ra.time["compute"][0]), rel=1e-9)
        assert float(rb.time["step"][0]) == pytest.approx(float(ra.time["step"][0]), rel=1e-9)
        assert float(rb.memory["total"][0]) == pytest.approx(float(ra.memory["total"][0]), rel=1e-2)


def test_layer_type_rule_and_reasons():
    """Mamba heads and groups must divide by TP (Megatron-Core asserts nheads % tp and ngroups %
    tp); gated DeltaNet refuses CP; a non-Megatron stack refuses a hybrid."""
    nano = load_model("nemotron-3-nano")  # 8 Mamba groups
    p = make_problem(nano, "h100", 16, 4096, 64)
    rows = [Layout(dp=1, tp=16, micro_batch=1), Layout(dp=8, tp=2, micro_batch=1, sp=True), Layout(dp=8, cp=2, micro_batch=1)]
    r = evaluate(p, LayoutTable.from_layouts(rows, 16, nano.n_layers))
    flags = r.reject
    from autoparallel.rules import Reject
    assert flags[0] & Reject.LAYER_TYPE  # 8 groups over tp 16
    assert not flags[1] & Reject.LAYER_TYPE
    assert not flags[2] & Reject.LAYER_TYPE  # 64 heads / 1 over cp 2, 8 groups / cp 2
    qn = load_model("qwen3-next-80b-a3b")
    p = make_problem(qn, "h100", 16, 4096, 64)
    r = evaluate(p, LayoutTable.from_layouts([Layout(dp=8, cp=2, ep=8, micro_batch=1)], 16, qn.n_layers))
    assert r.reject[0] & Reject.LAYER_TYPE
    p = make_problem(nano, "h100", 8, 4096, 64, stack="torchtitan")
    r = evaluate(p, LayoutTable.from_layouts([Layout(dp=8, ep=8, micro_batch=1)], 8, nano.n_layers))
    assert r.reject[0] & Reject.LAYER_TYPE
    # what refuses it is the stack's `hybrid_layers`, not its name: the same stack declaring
    # the layers (a user's stack file) is accepted
    from autoparallel.presets import load_stack

    own = load_stack("torchtitan").model_copy(update={"name": "my-titan", "hybrid_layers": True})
    p = make_problem(nano, "h100", 8, 4096, 64, stack=own)
    r = evaluate(p, LayoutTable.from_layouts([Layout(dp=8, ep=8, micro_batch=1)], 8, nano.n_layers))
    assert not r.reject[0] & Reject.LAYER_TYPE
    # NeMo AutoModel (TorchTitan's parallelism, its own Mamba-2 mixers) declares them
    p = make_problem(nano, "h100", 8, 4096, 64, stack="nemo-automodel")
    r = evaluate(p, LayoutTable.from_layouts([Layout(dp=8, ep=8, micro_batch=1)], 8, nano.n_layers))
    assert not r.reject[0] & Reject.LAYER_TYPE


def test_stage_counts_follow_the_pattern():
    """pp = 2 on 'MMMM**--': the first stage holds 4 Mamba layers, the last 2 attention and 2
    MLP; with vp = 2 (chunks of 2) rank 0 holds chunks 0 and 2 ('MM', '**')."""
    from autoparallel.cost.stages import stages

    m = ModelSpec(name="p", layers="MMMM**--", hidden_size=512, n_heads=8, ffn_hidden_size=1024,
                  vocab_size=1000, activation="relu2",
                  mamba={"n_heads": 16, "head_dim": 64, "n_groups": 1})
    arch = build_arch(m)
    t = LayoutTable.from_layouts([Layout(dp=1, pp=2, micro_batch=1), Layout(dp=1, pp=2, vp=2, micro_batch=1)], 2, 8)
    st = stages(arch, t, 8)
    assert list(st["first"].counts["M"]) == [4, 2]
    assert list(st["first"].counts["*"]) == [0, 2]
    assert list(st["last"].counts["-"]) == [2, 2]
    assert list(st["last"].counts["M"]) == [0, 2]


def test_dense_predictions_unchanged():
    """Every dense shipped run predicts what it did before hybrid models existed (< 0.1 %;
    tests/data/dense_predictions_before_hybrid.csv, written by `autoparallel validate
    --output` on the merged model without them: the long-context branch's tip 23e7b55, whose
    refit moved 31 of these rows by up to 7.7 %; rebased at the attention-prior refit,
    `attention_prior`, which moved 282 dense rows by up to 19 %, step time only; and at the
    Megatron-family H100 refit with NeMo 24.07's six rows scored, which moved 29 rows by up to
    2.0 %, step time only; and at the TorchTitan HBM2e H100 refit without the float8 rowwise
    rows, which moved its 11 remaining rows by up to 10.8 %, step time only)."""
    from autoparallel.validation.runs import load_cases, read_runs

    before = pd.read_csv("tests/data/dense_predictions_before_hybrid.csv").set_index("row_id")
    frame = read_runs("autoparallel/data/published_runs.csv")
    frame = frame[frame.row_id.isin(before.index[:60])]
    cases, _ = load_cases(frame)
    assert len(cases) >= 50
    for c in cases:
        got = float(evaluate(c.problem(), c.table()).time["step"][0])
        assert got == pytest.approx(before.loc[c.row_id, "predicted_step_s"], rel=1e-3), c.row_id


NEMOTRON_H_8B = {  # nvidia/Nemotron-H-8B-Base-8K config.json, the keys the planner reads
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
    "_name_or_path": "nvidia/Nemotron-H-8B-Base-8K", "num_hidden_layers": 52,
    "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 21504, "vocab_size": 131072, "mlp_hidden_act": "relu2",
    "tie_word_embeddings": False, "hybrid_override_pattern":
    "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", "mamba_num_heads": 128,
    "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2,
    "chunk_size": 128,
}


def test_nemotron_h_hf_config_loads_and_plans(tmp_path):
    """The HF config as published loads (pattern, Mamba fields), counts 8,100,852,736
    parameters (the preset's, derived by hand above), and `plan` ranks layouts on 64 H100."""
    import json

    from autoparallel.presets import load_model as load
    path = tmp_path / "config.json"
    path.write_text(json.dumps(NEMOTRON_H_8B))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = load(str(path))
    assert m.layer_letters.count("M") == 24 and m.mamba.n_heads == 128
    assert build_arch(m).n_params == 8_100_852_736
    from autoparallel.api import plan
    res = plan(model=m, gpu="h100", gpus=64, seq_len=8192, global_batch=512, top=5)
    best = res.layout(1)
    assert best.tp in (1, 2, 4, 8) and 128 % best.tp == 0 and 8 % best.tp == 0


def test_mtp_on_a_pattern_matches_the_transformer_mtp():
    """An MoE transformer written as a pattern ('*E' per layer) with multi-token prediction costs
    what the transformer ledger gives it (its MTP terms are derived in tests/test_moe_time.py):
    each MTP module is one attention and one MoE layer on the last stage plus the projection
    and the extra output-head pass. Same model FLOPs, compute, step, EP time and memory, with
    and without a pipeline; and MTP costs something (the step with 2 modules is longer)."""
    base = dict(hidden_size=1024, n_heads=16, n_kv_heads=4, ffn_hidden_size=2816,
                vocab_size=32000, activation="swiglu",
                moe={"n_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 1408})
    steps = []
    for mtp in (0, 2):
        a = ModelSpec(name="t", n_layers=6, mtp_layers=mtp, **base)
        b = ModelSpec(name="h", layers="*E" * 6, mtp_layers=mtp, **base)
        assert build_arch(b).model_flops_per_sequence(4096) == pytest.approx(
            build_arch(a).model_flops_per_sequence(4096), rel=1e-12)
        for lay in (dict(ep=8, micro_batch=1, dp=8), dict(pp=2, ep=4, micro_batch=1, dp=4)):
            job = {"tp_comm_overlap": False}
            _, ra = _estimate(a, gpus=8, job=job, **lay)
            _, rb = _estimate(b, gpus=8, job=job, **lay)
            for k in ("compute", "step", "ep_comm"):
                assert float(rb.time[k][0]) == pytest.approx(float(ra.time[k][0]), rel=1e-9), k
            assert float(rb.memory["total"][0]) == pytest.approx(float(ra.memory["total"][0]),
                                                                 rel=1e-9)
        steps.append(float(rb.time["step"][0]))
    assert steps[1] > steps[0]


def test_nemotron_3_ultra_preset_matches_the_published_model():
    """Nemotron-3 Ultra 550B-A55B (published config via the miles launch script and the HF
    config's layers_block_type): 108 layers, 48 Mamba, 48 MoE, attention at 7, 14, 23, 32, 39,
    48, 57, 64, 73, 82, 89, 98; 550e9 parameters, 55e9 active (the name), within 3 %."""
    m = load_model("nemotron-3-ultra")
    letters = m.layer_letters
    assert len(letters) == 108 and letters.count("M") == 48 and letters.count("E") == 48
    assert [i for i, c in enumerate(letters) if c == "*"] == [7, 14, 23, 32, 39, 48, 57, 64,
                                                               73, 82, 89, 98]
    a = build_arch(m)
    assert a.n_params == pytest.approx(550e9, rel=0.03)
    assert a.n_params_active == pytest.approx(55e9, rel=0.03)


def test_pipeline_split_weighs_layers_by_type():
    """pp = 2 on '*' x 8 + '-' x 8 (h 1024, 8 heads of 128, ffn 4096 relu2, V 1000, s 1024).
    Forward FLOPs per token by hand: an attention layer 2 (h (q + 2 kv) + q h) + s n_h
    (d_qk + d_v) = 2 (1024 x 3072 + 1024 x 1024) + 1024 x 8 x 256 = 10,485,760; an MLP layer
    2 x 2 h f = 16,777,216; the output layer 2 h V = 2,048,000 on the last stage. The even
    split [8, 8] loads the last stage with 8 MLP layers + the head (136.3M); [9, 7] 100.7M /
    119.5M; [10, 6] 117.4M / 102.7M; [11, 5] 134.2M: [10, 6] is the lightest most loaded stage,
    and the ledger prices it faster than the even split."""
    from autoparallel.splits import balanced_splits, layer_weights, output_weight

    m = ModelSpec(name="w", layers="*" * 8 + "-" * 8, hidden_size=1024, n_heads=8, head_dim=128,
                  ffn_hidden_size=4096, vocab_size=1000, activation="relu2")
    arch = build_arch(m)
    w = layer_weights(arch, 1024)
    attn, mlp, head = 10_485_760.0, 16_777_216.0, 2_048_000.0
    mean = (8 * attn + 8 * mlp) / 16
    assert w[0] == pytest.approx(attn / mean) and w[-1] == pytest.approx(mlp / mean)
    assert output_weight(arch, 1024) == pytest.approx(head / mean)
    assert balanced_splits(16, 2, 1, output_weight(arch, 1024), k=1, weights=w) == [(10, 6)]
    p = make_problem(m, "h100", 2, 1024, 64, tp_comm_overlap=False)
    rows = [Layout(dp=1, pp=2, micro_batch=1), Layout(dp=1, pp=2, micro_batch=1, stage_layers=[10, 6])]
    r = evaluate(p, LayoutTable.from_layouts(rows, 2, 16))
    assert float(r.time["step"][1]) < float(r.time["step"][0])


def test_hybrid_pipeline_export_and_no_virtual_stages():
    """Megatron-Core 0.16.1's MambaStack takes an uneven split as the first and last stage's
    counts with the rest shared evenly (`--decoder-first/last-pipeline-num-layers`), and asserts
    no virtual pipeline stages: Nemotron-H-8B (52 layers) on pp 4 as [12, 14, 14, 12] exports
    with those two flags on pretrain_mamba.py; [12, 13, 15, 12] is refused (unequal middle
    stages); vp 2 breaks the layer_type rule."""
    from autoparallel.exporters import check, render
    from autoparallel.rules import Reject

    p = make_problem("nemotron-h-8b", "h100", 32, 8192, 256)
    lay = Layout(dp=8, pp=4, micro_batch=1, stage_layers=[12, 14, 14, 12])
    text = render("megatron", p, lay)
    assert "pretrain_mamba.py" in text
    assert "--decoder-first-pipeline-num-layers 12" in text
    assert "--decoder-last-pipeline-num-layers 12" in text
    assert any("middle pipeline stages" in r
               for r in check("megatron", p, lay.model_copy(update={"stage_layers": [12, 13, 15, 12]})))
    r = evaluate(p, LayoutTable.from_layouts([Layout(dp=8, pp=4, vp=2, micro_batch=1), lay], 32, 52))
    assert r.reject[0] & Reject.LAYER_TYPE and not r.reject[1] & Reject.LAYER_TYPE


def test_a_deep_hybrid_pipeline_says_its_middle_stage_is_rank_1():
    """The ledger's middle stage of a layer pattern is rank 1's layers (`_stage_counts`); with
    pp > 2 the record says so, since another middle rank can hold heavier layers. Transformers
    (equal middle ranks) and pp <= 2 (no middle rank) say nothing about stages."""
    p = make_problem("nemotron-h-8b", "h100", 64, seq_len=8192, global_batch=512)
    deep = estimate(p, Layout(tp=1, pp=4))
    stage = [n for n in deep["notes"] if not n.startswith("Mamba-2 scan")]
    assert len(stage) == 1 and "rank 1" in stage[0]
    # the other line is the scan's (test_scan_note_says_which_limit_binds)
    assert [n for n in estimate(p, Layout(tp=1, pp=2))["notes"]
            if not n.startswith("Mamba-2 scan")] == []
    dense = make_problem("llama3-8b", "h100", 64, seq_len=8192, global_batch=512)
    assert estimate(dense, Layout(tp=1, pp=4))["notes"] == []
