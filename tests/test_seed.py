"""The seed chapter's ledger and numbers, reproduced through `estimate` (tolerance 0.1 GiB / its
printed precision). Source: shared/seed/000_92a0e44e5bd86f5c.txt, "ledger.py" and its output."""

import pytest

from autoparallel import Layout, ModelSpec, estimate, make_problem
from autoparallel.cost.scaling import six_nd, training_time_s

# (layout, model states GiB, activations GiB, fits) as printed by the seed
SEED_ROWS = [
    (Layout(dp=64, zero=0), 1052.0, 170.0, False),
    (Layout(dp=64, zero=3), 16.4, 170.0, False),
    (Layout(dp=64, zero=3, recompute="full"), 16.4, 10.0, True),
    (Layout(dp=2, tp=8, pp=4, zero=1, sp=True), 20.5, 21.2, True),
]


@pytest.mark.parametrize("layout,states,acts,fits", SEED_ROWS)
def test_seed_ledger(seed_problem, layout, states, acts, fits):
    r = estimate(seed_problem, layout)
    # the seed prints one decimal (f"{x:.1f}"); we match that printout exactly
    assert f"{r['memory_gib']['model_states']:.1f}" == f"{states:.1f}"
    assert f"{r['memory_gib']['activations']:.1f}" == f"{acts:.1f}"
    assert r["fits"] is fits


def test_seed_exercise_1():
    # 8B, 32 layers, hidden 4096, seq 4096, micro-batch 2, 8 x 80 GB, ZeRO-2: 27.9 + 34.0 GiB, fits
    model = ModelSpec(name="ex1", n_layers=32, hidden_size=4096, n_heads=32,
                      ffn_hidden_size=16384, vocab_size=128256, activation="gelu", dropout=True,
                      n_params=8e9)
    p = make_problem(model, "h100", 8, seq_len=4096, global_batch=64, grad_dtype="bf16")
    r = estimate(p, Layout(zero=2, micro_batch=2))
    assert f"{r['memory_gib']['model_states']:.1f}" == "27.9"
    assert f"{r['memory_gib']['activations']:.1f}" == "34.0"
    assert r["fits"]


def test_six_nd_and_time():
    # seed self-test 3: 6 x 70e9 x 1e12 ~ 4.2e23; seed ledger: 70.6e9 x 1e9 tokens on 64 H100
    # (989 TFLOP/s) at 40% MFU = 4.6 hours
    assert six_nd(70e9, 1e12) == pytest.approx(4.2e23, rel=1e-9)
    flops = six_nd(70.6e9, 1e9)
    assert flops == pytest.approx(4.236e20, rel=1e-9)
    assert training_time_s(flops, 64, 989e12, 0.40) / 3600 == pytest.approx(4.6, abs=0.05)
