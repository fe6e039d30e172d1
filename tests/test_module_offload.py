"""Fine-grained activation offload of MoE modules (`--offload-modules`, `cost.offload`) against
hand arithmetic (`tests/ledger_hand.py`): what leaves the GPU per MoE layer and micro-batch,
the one layer kept in transfer, the copies' exposed time, and the refusals.

The toy MoE (tests/test_ledger_terms.py `MOE`): 4 layers (1 dense, 3 MoE), h = 1024, 8 experts,
top-2, f_e = 1408, one shared expert, SwiGLU; on 8 H100 at dp 4, tp 2 with SP, ep 4, seq 4096,
micro-batch 1: expert TP = TP, so a rank holds X = k T x imbalance routed copies (the expert-TP
all-gather hands it its peer's copies, docs/moe.md). Per copy, Megatron-Core's `expert_fc1`
offloads the experts' FC1 input, h elements = 2h bytes in BF16 (whole: expert TP splits the
columns, not the input), and `moe_act` the activation's input, the FC1 output: gate and up, 2
f_e / t elements = 4 f_e / t bytes (Megatron-Core docs/source/api-guide/
fine_grained_activation_offloading.md: each module offloads its input)."""

from __future__ import annotations

import pytest

from autoparallel import Layout, estimate, make_problem
from autoparallel.errors import ExportError, SpecError
from autoparallel.exporters import render
from conftest import run_cli
from launcher_checks import megatron_script_layout
from ledger_hand import GiB, Hand, Lay
from test_ledger_terms import MOE, REL, spec

X = Lay(dp=4, tp=2, ep=4, sp=True, zero=1)
LAYOUT = Layout(dp=4, tp=2, ep=4, sp=True, zero=1, micro_batch=1)


def _problem(**job):
    return make_problem(spec(MOE), "h100", 8, seq_len=4096, global_batch=16, **job)


def _per_copy(modules: str) -> float:
    out = 0.0
    if "expert_fc1" in modules:
        out += 2 * MOE.h
    if "moe_act" in modules:
        out += 4 * MOE.fe / X.tp
    return out


@pytest.mark.parametrize("modules", ["moe_act", "expert_fc1", "expert_fc1+moe_act"])
def test_offloaded_inputs_leave_every_moe_layer_but_the_one_in_transfer(modules):
    base, off = _problem(), _problem(offload_modules=modules)
    copies = MOE.k * 4096 * base.profile.moe_dropless_imbalance
    moved = copies * _per_copy(modules)
    # pp 1, one micro-batch in flight: 3 MoE layers offload, one of them stays in transfer
    a, b = estimate(base, LAYOUT), estimate(off, LAYOUT)
    saved = (a["memory_gib"]["activations"] - b["memory_gib"]["activations"]) * GiB
    assert saved == pytest.approx(base.stack.activation_factor * (3 - 1) * moved, rel=REL)
    for item in ("params", "grads", "optimizer", "embedding_logits", "overhead"):
        assert b["memory_gib"][item] == a["memory_gib"][item]
    # the stored bytes by hand, less what left: the hand ledger's MoE layer (Korthikanti
    # generalised, docs/moe.md)
    H = Hand(base, MOE)
    assert H.layer_activations(X, moe=True) - moved > 0


@pytest.mark.parametrize("modules", ["moe_act", "expert_fc1+moe_act"])
def test_copies_hide_behind_each_moe_layers_forward_and_backward(modules):
    p = _problem(offload_modules=modules, tp_comm_overlap=False)
    rec = estimate(p, LAYOUT)
    H = Hand(p, MOE)
    copies = MOE.k * 4096 * p.profile.moe_dropless_imbalance
    link = 64e9 * p.profile.host_link_efficiency  # h100 preset: PCIe Gen5 x16, 64 GB/s a way
    assert p.cluster.gpu.host_link_gb_per_s == 64
    copy = p.stack.activation_factor * copies * _per_copy(modules) / link
    fwd, bwd = H.layer_forward(X, moe=True), H.layer_backward(X, moe=True)
    m = H.micro_batches(X)
    expected = m * 3 * (max(0.0, copy - fwd) + max(0.0, copy - bwd))
    assert rec["time_s"]["offload"] == pytest.approx(expected, rel=REL)
    # the copies take the link, not the kernels: compute is the run without offload's
    plain = estimate(_problem(tp_comm_overlap=False), LAYOUT)
    assert rec["time_s"]["compute"] == plain["time_s"]["compute"]
    assert rec["time_s"]["step"] - plain["time_s"]["step"] == pytest.approx(expected, rel=REL)


def test_this_toy_exposes_part_of_the_forward_copy():
    """The test above is not vacuous: both modules' copy outlasts the layer's forward here."""
    p = _problem(offload_modules="expert_fc1+moe_act", tp_comm_overlap=False)
    assert estimate(p, LAYOUT)["time_s"]["offload"] > 0


def test_layers_that_keep_nothing_offload_nothing():
    """Full recompute keeps each layer's input only; selective recompute of the whole `moe`
    module re-runs the experts: nothing of theirs to offload, the same memory and time."""
    for lay in (Layout(dp=4, tp=2, ep=4, sp=True, zero=1, recompute="full"),
                Layout(dp=4, tp=2, ep=4, sp=True, zero=1, recompute="selective",
                       recompute_modules=["moe"])):
        a = estimate(_problem(), lay)
        b = estimate(_problem(offload_modules="expert_fc1+moe_act"), lay)
        assert b["memory_gib"] == a["memory_gib"]
        assert b["time_s"]["offload"] == 0.0


def test_refused_where_it_cannot_run():
    with pytest.raises(SpecError, match="no MoE layers"):
        make_problem("llama3-8b", "h100", 8, 4096, 64, offload_modules="moe_act")
    with pytest.raises(SpecError, match="cannot offload moe_act"):
        make_problem("qwen3-30b-a3b", "h100", 8, 4096, 64, stack="torchtitan",
                     offload_modules="moe_act")
    with pytest.raises(SpecError, match="offload_modules"):
        make_problem("qwen3-30b-a3b", "h100", 8, 4096, 64, offload_modules="mlp")
    r = run_cli("estimate", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8",
                "--seq-len", "4096", "--global-batch", "64", "--offload-modules", "moe_act")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--offload-modules" in r.stderr and "no MoE layers" in r.stderr


def test_nemotron3_ultra_recipes_fit_as_they_ran():
    """Megatron-Bridge v0.6.0's Nemotron-3 Ultra recipes on 256 GB300 / GB200 (TP1 / TP2, EP64,
    moe_act recompute) shard with Megatron-FSDP and offload the experts' activation input
    (perf_recipes/nemotronh common.py, gb300/gb200 nemotronh.py): with both, as the runs'
    settings table says (moe_settings.csv), they fit, as they ran; mapped as before (ZeRO-1, no
    offload) they were predicted not to fit, and the offload alone frees the activation inputs
    of the MoE layers less one in transfer (by hand below)."""
    from autoparallel.data import PUBLISHED_RUNS
    from autoparallel.evaluate import evaluate
    from autoparallel.validation.runs import RULES, case_from_row, read_runs

    frame = read_runs(PUBLISHED_RUNS)
    for rid, tp in (("GT0755", 1), ("GT0756", 2)):
        row = frame[frame["row_id"] == rid].iloc[0].to_dict()
        row = {k: (None if v == "" else v) for k, v in row.items()}
        case = case_from_row(row)
        assert case.layout.zero == 3 and case.job["offload_modules"] == "moe_act"
        assert not any(a.startswith("ZeRO stage not stated") for a in case.assumptions)
        p = case.problem()
        ev = evaluate(p, case.table(), RULES)
        assert bool(ev.fits[0]), rid
        job = {k: v for k, v in case.job.items() if k != "offload_modules"}
        kept = case.__class__(**{**case.__dict__, "job": job})
        ev0 = evaluate(kept.problem(), kept.table(), RULES)
        # LatentMoE experts on the 2048-wide latent, squared ReLU (FC1 output f_e = 5120 wide,
        # 2 bytes), top-22, balanced routing; tp 2 with SP routes half the 8192 tokens per rank
        # and expert TP 1 keeps them: 22 x 8192 / tp copies of 2 x 5120 bytes per MoE layer
        moved = 22 * 8192 / tp * 2 * 5120
        before = kept.__class__(**{**kept.__dict__,
                                   "layout": kept.layout.model_copy(update={"zero": 1})})
        assert not bool(evaluate(before.problem(), before.table(), RULES).fits[0]), rid
        freed = float(ev0.memory["activations"][0] - ev.memory["activations"][0])
        # 48 MoE layers and the two MTP passes' MoE blocks (each an `E` layer on the only
        # stage; fine-grained offload supports MTP), less one layer in transfer
        assert freed == pytest.approx(p.stack.activation_factor * (48 + 2 - 1) * moved, rel=REL)


def test_megatron_writes_the_flags_and_the_other_targets_refuse():
    p = make_problem("qwen3-30b-a3b", "h100", 8, 4096, 64, offload_modules="expert_fc1+moe_act")
    lay = Layout(tp=1, ep=8, zero=1)
    text = render("megatron", p, lay)
    assert "--fine-grained-activation-offloading --offload-modules expert_fc1 moe_act" in text
    # Megatron-LM's parser (tests/launcher_checks.py mirror: store_true, nargs='*') reads them
    args = megatron_script_layout(text)["args"]
    assert args.fine_grained_activation_offloading and args.offload_modules == ["expert_fc1",
                                                                                "moe_act"]
    assert "--offload-modules" in render("slurm", p, lay)
    assert "--offload-modules" not in render("megatron", make_problem(
        "qwen3-30b-a3b", "h100", 8, 4096, 64), lay)
    with pytest.raises(ExportError, match="cannot be enabled with cpu_offloading"):
        render("megatron", p, Layout(tp=1, ep=8, zero=1, offload_layers=2))
    tt = make_problem("qwen3-30b-a3b", "h100", 8, 4096, 64, stack="megatron-bridge",
                      offload_modules="moe_act")
    with pytest.raises(ExportError, match="megatron and slurm write --fine-grained"):
        render("torchtitan", tt, lay)
