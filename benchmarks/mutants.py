"""Planted bugs: does a small deliberate bug in any single term of the cost model or the capacity
arithmetic make a test fail?

Each mutant below replaces one exact piece of source (found exactly once in its file) by a
plausible mistake: a hop count off by one, a bus factor dropped, a byte count halved, an
in-flight count wrong, ZeRO sharding that forgets CP, an energy constant changed, ... The
repository (package and tests) is copied once when the run starts; for every mutant that copy is
copied again to a temporary folder, the one change is applied there, and the relevant fast test
subset runs there against it (PYTHONPATH puts it ahead of the installed package and
PYTHONSAFEPATH keeps `python -m` from adding another; subprocess CLI runs inherit both). A
mutant is *killed* when a test fails, *survives* when every test passes. The goal is 0
survivors. (Changes that cannot alter any result are not listed: inside one node NCCL's ring and
tree latencies coincide, so a ring-step count is only observable across nodes, where the
collective model is being rebuilt.)

    python benchmarks/mutants.py            # every mutant, prints each outcome and the survivors
    python benchmarks/mutants.py -j 2       # two at a time
    python benchmarks/mutants.py --only cp-hops,pp-p2p-count
    python benchmarks/mutants.py --list
    python benchmarks/mutants.py --root /tmp/old-checkout   # another tree's tests

Exit status 1 when a mutant survives or no longer applies (its source text changed: update the
table). `tests/test_mutants.py` checks that every mutant still applies, without running them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autoparallel"

COST = ("tests/test_ledger_terms.py", "tests/test_seed.py", "tests/test_time.py",
        "tests/test_memory.py", "tests/test_offload.py", "tests/test_pipeline.py")
"""The cost model's fast tests (about 25 s together on an idle core)."""
COMM = ("tests/test_comm.py", "tests/test_network.py")
"""The collective and network-tier tests (nccl-tests bus bandwidths, tier derivations)."""
CAPACITY = ("tests/test_capacity.py::test_parsers",
            "tests/test_capacity.py::test_default_mtbf_is_the_llama3_rate_and_young_daly_interval",
            "tests/test_capacity.py::test_one_row_by_hand_on_a_small_job")
"""The capacity arithmetic's fast tests (one 8-GPU plan)."""
HYBRID = ("tests/test_hybrid.py",)
"""The hybrid layer types' tests (hand-derived counts, FLOPs and ledgers)."""
MOE = ("tests/test_ledger_terms.py", "tests/test_moe_time.py", "tests/test_moe_memory.py",
       "tests/test_moe_layers.py", "tests/test_time.py", "tests/test_memory.py",
       "tests/test_module_offload.py")
"""The MoE terms' tests (docs/moe.md): hand ledger, each term's derivation, whole layers."""
EXPORT = ("tests/test_export.py", "tests/test_export_megatron_bridge.py")
"""The exporters' read-back and refusal tests."""


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    """Path inside the package."""
    old: str
    new: str
    why: str
    tests: tuple[str, ...] = COST


M = Mutant
MUTANTS: tuple[Mutant, ...] = (
    # ---- arch.py: counts and per-token activation bytes
    M("mlp-matrices", "cost/arch.py", "mu = 3 if swiglu else 2", "mu = 2 if swiglu else 2",
      "SwiGLU counted with two matrices"),
    M("norm-params", "cost/arch.py", "p_norm = 2.0 * h", "p_norm = 1.0 * h", "one norm per layer"),
    M("act-coef-swiglu", "cost/arch.py", "c_f = 6 if swiglu else 4", "c_f = 4 if swiglu else 4",
      "SwiGLU activation bytes as GeLU's"),
    M("act-attn-rep", "cost/arch.py", "act_attn_rep = (4 + delta) * h + latents",
      "act_attn_rep = (2 + delta) * h + latents", "attention LN or QKV input dropped"),
    M("act-attn-qo", "cost/arch.py", "act_attn_qo = 2.0 * q_w + 2.0 * o_w",
      "act_attn_qo = 2.0 * q_w", "output-projection input dropped"),
    M("act-attn-kv", "cost/arch.py", "act_attn_kv = 2.0 * k_w + 2.0 * v_w",
      "act_attn_kv = 2.0 * k_w", "V dropped from the stored K, V (and the CP hop)"),
    M("act-mlp-rep", "cost/arch.py", "act_mlp_rep = (4 + delta) * h",
      "act_mlp_rep = (2 + delta) * h", "MLP LN or FC1 input dropped"),
    M("act-moe-router", "cost/arch.py", "act_moe_rep = (4 + delta) * h + 4.0 * E",
      "act_moe_rep = (4 + delta) * h + 2.0 * E", "router probabilities in bf16"),
    M("act-moe-shared", "cost/arch.py", "act_moe_shard = c_f * f_sh",
      "act_moe_shard = 2.0 * f_sh", "shared experts' activation bytes as one tensor"),
    M("n-params-share", "cost/arch.py",
      "gemm_share = 1.0 - h * model.vocab_size / float(model.n_params)", "gemm_share = 1.0",
      "n_params model times the vocabulary twice (issue 27 item 3)"),
    M("flops-6", "cost/arch.py",
      "gemm = 6.0 * s * (self.gemm_params_per_token() + self.hidden * self.vocab\n",
      "gemm = 6.0 * s * (self.gemm_params_per_token()\n", "model FLOPs without the logits"),
    M("flops-attn", "cost/arch.py",
      "attn = 3.0 * s * s * layers * self.attn_score_width",
      "attn = 6.0 * s * s * layers * self.attn_score_width", "non-causal attention FLOPs"),
    M("flops-attn-default", "cost/arch.py",
      "attention_flops = (not uniform) if model.attention_flops is None",
      "attention_flops = True if model.attention_flops is None",
      "the seed's 6N gets an attention term nobody asked for"),
    # ---- compute.py: the roofline
    M("gemm-bytes", "cost/compute.py", "bytes_moved = 2.0 * (M * K + K * N + M * N) * count",
      "bytes_moved = 2.0 * (M * K + K * N) * count", "GEMM output not written"),
    M("gemm-fixed", "cost/compute.py",
      "return np.where(flops > 0, np.maximum(t_math, t_mem) + prof.gemm_overhead_us * US, 0.0)",
      "return np.where(flops > 0, np.maximum(t_math, t_mem), 0.0)", "no fixed cost per GEMM"),
    M("gemm-flops", "cost/compute.py",
      "    flops = 2.0 * M * N * K * count\n    bytes_moved",
      "    flops = M * N * K * count\n    bytes_moved", "a GEMM as MNK FLOPs"),
    # ---- time.py: compute, recompute
    M("attn-bwd", "cost/compute.py", "ATTN_BWD = 2.5", "ATTN_BWD = 2.0",
      "flash backward without the recomputed scores"),
    M("gemm-bwd", "cost/time.py", "bwd = 2.0 * gemm + attn_b + 2.0 * elem",
      "bwd = 1.0 * gemm + attn_b + 2.0 * elem", "backward GEMMs = forward"),
    M("elementwise", "cost/time.py",
      "return memory_bound_time(problem, 2.0 * problem.profile.elementwise_factor * stored)",
      "return memory_bound_time(problem, problem.profile.elementwise_factor * stored)",
      "elementwise kernels write but never re-read"),
    M("attn-cp-split", "cost/time.py", "arch.attn_score_width * window / (tp * cp)",
      "arch.attn_score_width * window / tp", "CP does not split the attention"),
    M("tokens-cp", "cost/time.py",
      "T = b * s / cp  # tokens through each GEMM", "T = b * s  # tokens through each GEMM",
      "CP does not split the GEMMs' tokens"),
    M("ce-bytes", "cost/time.py", "ce_bytes = 2.0 * (2.0 + 4.0) * T * V / tp",
      "ce_bytes = (2.0 + 4.0) * T * V / tp", "cross-entropy logits written, not re-read"),
    M("logits-bwd", "cost/time.py", "parts[\"moe\"][\"bwd\"] + 2.0 * heads,",
      "parts[\"moe\"][\"bwd\"] + heads,", "logits backward = forward"),
    M("recompute-full", "cost/time.py",
      "rec=n * np.where(rc == 2, st.recomputed * fwd, sel[kind])",
      "rec=n * np.where(rc == 2, st.recomputed * (fwd + bwd), sel[kind])",
      "full recompute re-runs the backward too"),
    M("recompute-selective", "cost/time.py",
      'sel = {k: np.where(rc == 1, kinds[k][1], 0.0) for k in kinds}',
      'sel = {k: np.where(rc == 1, kinds[k][0], 0.0) for k in kinds}',
      "selective recompute re-runs the GEMMs, not core attention"),
    # ---- time.py: communication items
    M("tp-pairs", "cost/time.py", "_elementwise(problem, arch, t, False), arch.blocks * pair, attn_bwd,",
      "_elementwise(problem, arch, t, False), pair, attn_bwd,",
      "one TP pair per layer instead of two"),
    M("unfused-rope-bytes", "cost/unfused_paths.py", "ROPE_EXTRA_BYTES = (20.0, 16.0)",
      "ROPE_EXTRA_BYTES = (24.0, 20.0)", "unfused RoPE without TE's fused passes taken off",
      ("tests/test_unfused_paths.py",)),
    M("unfused-bias-rows", "cost/unfused_paths.py", "elements = routed_rows(problem, arch, t) * arch.hidden",
      "elements = routed_rows(problem, arch, t) * arch.expert_ffn * 2", "FC2 bias over the FC1 output, not the FC2 one",
      ("tests/test_unfused_paths.py",)),
    M("unfused-kv-heads", "cost/unfused_paths.py", "np.minimum(tp, arch.n_kv_heads))",
      "tp)", "K heads sharded beyond the KV heads", ("tests/test_unfused_paths.py",)),
    M("unfused-any-stack", "cost/unfused_paths.py",
      'return bool(problem.stack.transformer_engine) and problem.training.model_code == "fused"',
      "return True", "the unfused paths charged to every stack's model code",
      ("tests/test_unfused_paths.py",)),
    M("unfused-bwd-dropped", "cost/time.py", "2.0 * elem + code_b", "2.0 * elem",
      "the unfused paths' backward left out of the step", ("tests/test_unfused_paths.py",)),
    M("export-window-size", "exporters/megatron.py", 'f"{m.sliding_window - 1},0"',
      'f"{m.sliding_window},0"', "TE's window written without the key itself counted",
      ("tests/test_export_assumptions.py",)),
    M("export-window-alternation", "exporters/megatron.py",
      'return out + ["--window-attn-skip-freq", 2]', "return out",
      "alternating windows written on every layer", ("tests/test_export_assumptions.py",)),
    M("export-moe-interleave", "exporters/megatron.py", 'f"([0]*{step - 1}+[1])*{groups}"',
      'f"([1]+[0]*{step - 1})*{groups}"', "interleaved MoE layers first in each group, not last",
      ("tests/test_export.py",)),
    M("tp-moe-k", "cost/moe_dispatch.py", "received = etp * copies * h * 2.0",
      "received = etp * T_r * h * 2.0", "MoE TP traffic T h, not k T h (issue 27 item 6)",
      MOE),
    M("tp-recompute", "cost/time.py", "return tp_fwd * (2.0 + full)", "return tp_fwd * 2.0",
      "recomputed forward's TP collectives not counted"),
    M("tp-overlap-bwd", "cost/time.py",
      "return f * (1.0 + full) + _hidden_cost(prof, tp_fwd, 2.0 * gemm_f)",
      "return f * (1.0 + full) + _hidden_cost(prof, tp_fwd, gemm_f)",
      "TP backward hides behind the forward GEMM time"),
    M("ep-count", "cost/moe_dispatch.py", "bwd = 2.0 * combine", "bwd = combine",
      "one backward all-to-all per MoE layer instead of two", MOE),
    M("ep-bytes", "cost/moe_dispatch.py", "copies = k * T_r", "copies = T_r",
      "all-to-all of T tokens, not k T routed copies", MOE),
    M("ep-probs", "cost/moe_dispatch.py",
      "fwd = a2a(copies * h * q_dispatch) + combine + a2a(copies * PROBS_BYTES)",
      "fwd = a2a(copies * h * q_dispatch) + combine",
      "routing probabilities not sent with the tokens", MOE),
    M("ep-dedup", "cost/moe_dispatch.py", "hit = reach * (1.0 - (1.0 - 1.0 / reach) ** k)",
      "hit = reach * (1.0 - (1.0 - 1.0 / reach) ** (k / 2.0))",
      "DeepEP's node deduplication with half the experts per token", MOE),
    M("ep-nic", "cost/moe_dispatch.py",
      "nic_bwd = 2.0 * nic(copies * h * 2.0)", "nic_bwd = nic(copies * h * 2.0)",
      "hidden backward all-to-alls hold the NICs half as long", MOE + COMM),
    # ---- moe_layer.py: the MoE block (docs/moe.md)
    M("moe-router-fp32", "cost/moe_layer.py", "router = _fp32_gemm(problem, T_r, E, h)",
      "router = gemm_time(problem, T_r, E, h)",
      "fp32 router at the BF16 tensor-core rate", MOE),
    M("moe-router-scores", "cost/moe_layer.py",
      "ROUTER_PASSES[problem.stack.moe_fused_router] * 4.0 * T_r * E",
      "ROUTER_PASSES[problem.stack.moe_fused_router] * 2.0 * T_r * E",
      "router scores in bf16, not fp32", MOE),
    M("moe-expert-tail", "cost/moe_layer.py",
      "per_expert = 2.0 * problem.profile.grouped_gemm_expert_us * US * local",
      "per_expert = 2.0 * problem.profile.grouped_gemm_expert_us * US",
      "grouped-GEMM tail once per projection, not per local expert", MOE),
    M("moe-expert-etp", "cost/moe_layer.py", "    f = arch.expert_ffn / etp\n",
      "    f = arch.expert_ffn\n", "expert TP does not split the expert width", MOE),
    M("moe-imbalance", "cost/moe_layer.py",
      "* arch.top_k * routed_tokens(problem, t) * imbalance(problem)",
      "* arch.top_k * routed_tokens(problem, t)",
      "the busiest EP rank's extra tokens left out of the expert GEMMs", MOE),
    M("moe-capacity", "cost/moe_layer.py", "return float(tr.moe_capacity_factor)",
      "return 1.0", "capacity routing without the padding to capacity", MOE),
    M("moe-host-shapes", "cost/moe_layer.py", 'return tr.moe_routing != "capacity" and not (',
      'return tr.moe_routing == "capacity" and not (',
      "host time charged to static shapes, not to dynamic ones", MOE),
    M("moe-host-graphs", "cost/moe_layer.py",
      'share = {"none": 1.0, "scoped": SCOPED_GRAPH_SHARE, "full": 0.0}[graphs]',
      'share = {"none": 1.0, "scoped": 1.0, "full": 0.0}[graphs]',
      "scoped CUDA graphs hide no host time", MOE),
    M("moe-overlap-window", "cost/moe_layer.py",
      "hid_f = np.where(allowed, np.minimum(d.fwd, 2.0 * layer_fwd), hid_f)",
      "hid_f = np.where(allowed, d.fwd, hid_f)",
      "1F1B all-to-all overlap hides the dispatch whatever compute there is", MOE),
    M("moe-shared-overlap", "cost/moe_layer.py",
      "hid_f, hid_b = np.minimum(d.fwd, ffn.shared), np.minimum(d.bwd, 2.0 * ffn.shared)",
      "hid_f, hid_b = np.minimum(d.fwd, ffn.shared), np.minimum(d.bwd, ffn.shared)",
      "shared-expert overlap: backward behind the forward's shared experts", MOE),
    M("moe-etp-exposed", "cost/moe_layer.py",
      "return fwd * (1.0 + again) + bwd, d.etp_fwd * (1.0 + again) + d.etp_bwd",
      "return fwd * (1.0 + again) + bwd, d.etp_fwd + d.etp_bwd",
      "recomputed forward without its expert-TP gather", MOE),
    M("moe-a2a-rule", "cost/moe_layer.py",
      "return (t[\"ep\"] > 1) & (t[\"rc\"] != 2) & ((t[\"pp\"] == 1) | (t[\"vp\"] > 1))",
      "return (t[\"ep\"] > 1) & (t[\"rc\"] != 2)",
      "1F1B all-to-all overlap without its virtual-stage requirement", MOE),
    M("pp-p2p-count", "cost/time.py", "2.0 * (pp * vp - 1.0) * p2p", "2.0 * (pp - 1.0) * p2p",
      "pipeline sends ignore the virtual stages"),
    M("pp-sp", "cost/time.py",
      "seq_len / sub[\"cp\"] * arch.hidden / np.where(sp, tp, 1.0)",
      "seq_len / sub[\"cp\"] * arch.hidden",
      "stage boundary not SP-sharded"),
    M("tied-grad-bytes", "cost/time.py",
      "nbytes = float(problem.training.grad_bytes) * arch.p_embed / tp",
      "nbytes = 2.0 * arch.p_embed / tp", "tied embedding gradient all-reduced in bf16"),
    M("tied-off", "cost/time.py",
      "        pp_comm = pp_comm + tied_embedding_allreduce(problem, arch, sub)",
      "        pp_comm = pp_comm",
      "tied embedding all-reduce not timed (issue 27 item 5)"),
    M("bubble-vp", "cost/time.py", "bubble = (pp - 1.0) / vp * tau_max",
      "bubble = (pp - 1.0) * tau_max", "interleaving does not shrink the bubble"),
    M("bubble-zb-classic", "cost/time.py", "classic = (pp - 1.0) / vp * tau",
      "classic = pp / vp * tau", "bubble of p, not p - 1, micro-batch times (other schedules)"),
    M("dp-zero2-per-mb", "cost/time.py", "z2 = m * rs_b", "z2 = rs_b",
      "ZeRO-2 reduce-scatters once per step"),
    M("dp-zero3-bwd-gather", "cost/time.py", "z3 = m * (ag_f + hide(ag + rs, b_win))",
      "z3 = m * (ag_f + hide(rs, b_win))", "ZeRO-3 backward without its all-gather"),
    M("dp-zero0-tail", "cost/time.py", "z0 = hide(ar, b_win) + np.where(ar > 0, tail_ar, 0.0)",
      "z0 = hide(ar, b_win)", "last bucket hidden too"),
    M("dp-bucket", "cost/time.py", "DDP_BUCKET_PARAMS = 4e7", "DDP_BUCKET_PARAMS = 4e8",
      "Megatron's bucket ten times larger"),
    M("dp-overlap-window", "cost/time.py",
      "hide = lambda comm, window: _hidden_cost(prof, comm, ov * window)",
      "hide = lambda comm, window: _hidden_cost(prof, comm, 0.0 * window)",
      "data-parallel communication never overlaps"),
    M("sm-share", "cost/overlap.py",
      "return exposed + prof.overlap_sm_fraction * (comm - exposed)", "return exposed",
      "hidden communication is free"),
    M("opt-grad-bytes", "cost/time.py",
      "opt = memory_bound_time(problem, shard * (adam + gb))",
      "opt = memory_bound_time(problem, shard * adam)", "Adam does not read the gradient"),
    M("opt-adam-bytes", "cost/time.py", "ADAM_BYTES = 26.0", "ADAM_BYTES = 24.0",
      "Adam does not write the bf16 weight"),
    M("opt-bf16-moments", "cost/time.py", "ADAM_BF16_BYTES = 12.0", "ADAM_BF16_BYTES = 26.0",
      "bf16 moments streamed as if with an fp32 master copy"),
    M("opt-zero-cp", "cost/time.py", "d = (sub[\"dp\"] * sub[\"cp\"]).astype(np.float64)",
      "d = sub[\"dp\"].astype(np.float64)", "optimizer shard ignores CP"),
    M("opt-step-overhead", "cost/time.py",
      "opt = opt + problem.profile.step_overhead_ms * MS", "opt = opt",
      "fixed step overhead dropped"),
    # ---- placement.py: which ranks a group holds
    M("group-dpcp", "placement.py", '"dpcp": group(dp * cp, tp, sizes)',
      '"dpcp": group(dp, tp, sizes)', "gradients reduced over DP only with CP > 1"),
    M("group-edp", "placement.py", '"edp": group(tp * cp * dp / (etp * ep), etp * ep, sizes)',
      '"edp": group(tp * cp * dp / etp, etp * ep, sizes)', "experts reduced over the dense DP group"),
    # ---- comm.py: the ring inside one node (and across nodes: tests/test_comm.py)
    M("ring-phases", "cost/comm.py", "phases = 2.0 if ar else 1.0",
      "phases = 1.0", "all-reduce with the all-gather's bus factor"),
    M("ring-bus-factor", "cost/comm.py", "            factor = phases * (n - 1.0) / n\n",
      "            factor = phases\n", "ring moves S, not (n-1)/n S"),
    M("p2p-hop", "cost/comm.py", "fixed = base + hop\n",
      "fixed = base\n", "a send without its hop"),
    M("a2a-share", "cost/comm.py", "np.where(r0 > 1, (r0 - 1.0) / n, 0.0)",
      "np.where(r0 > 1, 1.0, 0.0)",
      "all-to-all sends its own share too"),
    # ---- comm.py across nodes and on meshes (nccl-tests bus bandwidths, tests/test_comm.py)
    M("ring-sum-of-links", "cost/comm.py",
      "bus = np.where(crossed, np.minimum(bus, share), bus)",
      "bus = np.where(crossed, 1.0 / (1.0 / bus + 1.0 / share), bus)",
      "multi-node ring as the sum of an NVLink and a NIC phase", COMM),
    M("tree-bytes", "cost/comm.py", "np.minimum(2.0, k_below / 2.0)", "np.minimum(2.0, k_below)",
      "double binary tree sends twice the bytes per node", COMM),
    M("mesh-links", "cost/comm.py", "return t0.bw * np.maximum(r0 - 1.0, 1.0) / t0.mesh_links",
      "return t0.bw", "a point-to-point mesh priced as a switch", COMM),
    # ---- memory.py: model states, activations, logits, overhead
    M("zero-cp", "cost/memory.py", "    d = dp * cp\n    d_e = edp(t)",
      "    d = dp\n    d_e = edp(t)", "ZeRO shards over DP only with CP > 1"),
    M("zero-experts", "cost/memory.py", "    d = dp * cp\n    d_e = edp(t)",
      "    d = dp * cp\n    d_e = d", "expert states sharded over the dense DP group"),
    M("zero3-params", "cost/memory.py", "params = sharded(2.0, 3)", "params = sharded(2.0, 2)",
      "ZeRO-2 shards the parameters"),
    M("zero2-grads", "cost/memory.py", "grads = sharded(float(tr.grad_bytes), 2)",
      "grads = sharded(float(tr.grad_bytes), 3)", "ZeRO-2 keeps whole gradients"),
    M("zero1-opt", "cost/memory.py", "optimizer = sharded(float(tr.optimizer_bytes), 1)",
      "optimizer = sharded(float(tr.optimizer_bytes), 2)", "ZeRO-1 keeps the whole optimizer"),
    M("kv-params-heads", "cost/memory.py",
      "kv_div = np.minimum(tp, arch.n_kv_heads)  # KV heads replicate once tp > n_kv",
      "kv_div = tp  # KV heads replicate once tp > n_kv", "K, V weights sharded beyond the heads"),
    M("tied-copy", "cost/memory.py",
      "np.where((t[\"pp\"] > 1) & (arch.p_output == 0), arch.p_embed, arch.p_output)",
      "arch.p_output", "tied model's last stage without its embedding copy"),
    M("embed-tp", "cost/memory.py", "+ st.embed * arch.p_embed / tp",
      "+ st.embed * arch.p_embed", "embedding not vocab-parallel"),
    M("full-recompute-sp", "cost/memory.py", "full = 2.0 * tokens * arch.hidden / rep_div",
      "full = 2.0 * tokens * arch.hidden", "layer input kept whole under SP"),
    M("sp-divides", "cost/memory.py", "    rep_div = np.where(sp, tp, 1.0)",
      "    rep_div = np.where(sp, 1.0, 1.0)", "SP does not shard the LN inputs"),
    M("moe-gathered-whole", "cost/moe_memory.py",
      "per = 2.0 * arch.hidden + arch.act_coef * f + PROB_BYTES",
      "per = 2.0 * arch.hidden / t[\"etp\"] + arch.act_coef * f + PROB_BYTES",
      "expert input divided by expert TP again (issue 27 item 6)", MOE),
    M("moe-probs-kept", "cost/moe_memory.py",
      "per = 2.0 * arch.hidden + arch.act_coef * f + PROB_BYTES",
      "per = 2.0 * arch.hidden + arch.act_coef * f",
      "fp32 routing probability not kept for the activation's backward", MOE),
    M("moe-copies-imbalance", "cost/moe_memory.py",
      "return t[\"etp\"] * arch.top_k * routed_tokens(problem, t) * imbalance(problem)",
      "return t[\"etp\"] * arch.top_k * routed_tokens(problem, t)",
      "routed activations of the balanced share, not the busiest rank's", MOE),
    M("moe-deepep-buffer", "cost/moe_memory.py",
      "nvl = channels * nvl_ranks * recv * (hidden + DEEPEP_TOKEN_EXTRA)",
      "nvl = channels * recv * (hidden + DEEPEP_TOKEN_EXTRA)",
      "DeepEP's NVLink buffer for one peer", MOE),
    M("logits-tp", "cost/memory.py", "loss_bytes * arch.vocab / tp)", "loss_bytes * arch.vocab)",
      "logits not vocab-parallel"),
    M("token-ids", "cost/memory.py", "embed = st.inflight_mb * (8.0 * tokens",
      "embed = st.inflight_mb * (4.0 * tokens", "token ids as int32"),
    M("logits-hidden", "cost/memory.py", "tokens * (4.0 * arch.hidden / rep_div",
      "tokens * (2.0 * arch.hidden / rep_div", "final-norm output dropped"),
    M("inflight", "cost/memory.py",
      "activations = problem.stack.activation_factor * st.inflight * (",
      "activations = problem.stack.activation_factor * (", "one micro-batch in flight"),
    M("zero3-gathered", "cost/memory.py",
      "gathered = np.where(zero == 3, 2.0 * two_units * (1.0 - 1.0 / d), 0.0)",
      "gathered = np.where(zero == 3, two_units * (1.0 - 1.0 / d), 0.0)", "no ZeRO-3 prefetch"),
    M("cp-buffers-on-step", "cost/memory.py",
      "out[\"overhead\"] = items[\"overhead\"] + np.maximum(items[\"step_gap\"], kv_buffers)",
      "out[\"overhead\"] = items[\"overhead\"] + np.maximum(items[\"step_gap\"], 0.0) + kv_buffers",
      "the CP buffers added to the optimizer step's peak as well as the backward's"),
    M("cp-form-grouped", "cost/memory.py",
      "MEMORY_BASE_COLUMNS = tuple(c for c in COLUMNS if c not in CP_FORM_COLUMNS)",
      "MEMORY_BASE_COLUMNS = tuple(c for c in COLUMNS if c not in CP_FORM_COLUMNS + (\"zero\",))",
      "rows of another ZeRO stage grouped as one (the CP-form grouping drops a column it reads)",
      COST + ("tests/test_distinct_rows.py",)),
    M("cp-inputs-grouped", "cost/context.py",
      "CP_FORM_INPUTS = (\"tp\", \"cp\", \"cc\", \"cu\", \"mb\")",
      "CP_FORM_INPUTS = (\"tp\", \"cp\", \"cc\", \"cu\")",
      "CP collectives and buffers of one micro-batch size copied to the others",
      COST + ("tests/test_distinct_rows.py",)),
    M("cp-seconds-by-form", "cost/time.py",
      "items[\"cp\"] = st.n_dense * layer + st.n_moe * layer",
      "items[\"cp\"] = st.n_dense * layer",
      "the CP form's seconds of the MoE layers dropped where the stage times are grouped",
      COST + ("tests/test_distinct_rows.py",)),
    M("recompute-working", "cost/memory.py",
      "working = np.where(recomputing & (np.asarray(st.recomputed) > 0), a_none, 0.0)",
      "working = np.where(recomputing & (np.asarray(st.recomputed) > 0), 0.0, 0.0)",
      "no working set for the recomputed layer"),
    # ---- context.py: the context-parallel forms
    M("cp-hops", "cost/context.py", "f = (r - 1) * _hidden_cost(prof, step, attn_f / r)",
      "f = r * _hidden_cost(prof, step, attn_f / r)", "ring of c hops instead of c - 1"),
    M("cp-hop-window", "cost/context.py", "_hidden_cost(prof, step, attn_f / r)",
      "_hidden_cost(prof, step, attn_f)", "a hop hides behind all the attention, not one block"),
    M("cp-bwd-bytes", "cost/context.py",
      "bwd = (r - 1) * _hidden_cost(prof, 2.0 * step, ATTN_BWD * attn_f / r)",
      "bwd = (r - 1) * _hidden_cost(prof, step, ATTN_BWD * attn_f / r)",
      "ring backward without dKV"),
    M("cp-kv-heads", "cost/context.py", "kv_div = np.minimum(tp, arch.n_kv_heads)",
      "kv_div = tp", "K, V sharded beyond the KV heads (hop, a2a, gather, buffers)"),
    M("cp-ring-size", "cost/context.py",
      "return np.where((t[\"cc\"] == RING) | (t[\"cc\"] == A2A_RING), cp / a2a_size(t), 1.0)",
      "return np.where((t[\"cc\"] == RING) | (t[\"cc\"] == A2A_RING), cp, 1.0)",
      "the hierarchical ring spans every CP rank"),
    M("cp-a2a-output", "cost/context.py",
      "for x in (b[\"q\"], b[\"k\"] * kv_split, b[\"v\"] * kv_split, b[\"o\"]))",
      "for x in (b[\"q\"], b[\"k\"] * kv_split, b[\"v\"] * kv_split))",
      "Ulysses without the output all-to-all"),
    M("cp-a2a-backward", "cost/context.py", "coll[\"a2a\"] * (2.0 + full)", "coll[\"a2a\"] * (1.0 + full)",
      "Ulysses backward all-to-alls not counted"),
    M("cp-a2a-group", "cost/context.py", "g = grp[\"a2a\"]", "g = grp[\"all\"]",
      "hierarchical all-to-all over every CP rank"),
    M("cp-kv-replicate", "cost/context.py",
      "kv_a2a = kv_a2a * np.maximum(1.0, a2a_size(t) / heads)", "kv_a2a = kv_a2a",
      "DeepSpeed's replicated KV heads sent unreplicated"),
    M("cp-ag-bytes", "cost/context.py",
      "collective_time(problem, Collective.ALL_GATHER, cp * T * b[\"k\"], g)",
      "collective_time(problem, Collective.ALL_GATHER, T * b[\"k\"], g)",
      "all-gather output sized as the local K shard"),
    M("cp-ag-rs", "cost/context.py", "f, bwd = ag, ag + rs", "f, bwd = ag, ag",
      "all-gather form without the dK, dV reduce-scatter"),
    M("cp-ag-overlap", "cost/context.py", "f = _hidden_cost(prof, ag, attn_f / cp)",
      "f = _hidden_cost(prof, ag, attn_f)", "PyTorch's gather hides behind all the attention"),
    M("cp-ring-buffers", "cost/context.py",
      "ring = np.maximum(ring_size(sub), RING_BWD_BUFFERS) * kv", "ring = 2.0 * kv",
      "two K, V buffers whatever the ring (the forward keeps c)"),
    M("cp-a2a-buffers", "cost/context.py", "a2a = 2.0 * T * (b[\"q\"] + b[\"kv_a2a\"])",
      "a2a = T * (b[\"q\"] + b[\"kv_a2a\"])", "one Q, K, V copy for the all-to-all"),
    M("cp-ag-buffers", "cost/context.py", "[ring, a2a, 2.0 * cp * kv, ring + a2a]",
      "[ring, a2a, cp * kv, ring + a2a]", "gathered K, V without dK, dV / the step copies"),
    M("cp-hier-buffers", "cost/context.py", "[ring, a2a, 2.0 * cp * kv, ring + a2a]",
      "[ring, a2a, 2.0 * cp * kv, ring]", "hierarchical form without the a2a buffers"),
    M("cp-heads-kv", "cost/context.py", "kv_ok = kv_heads % u == 0", "kv_ok = kv_heads > 0",
      "Ulysses does not check the KV heads (GQA)"),
    M("cp-heads-q", "cost/context.py", "((q_heads % u != 0) | ~kv_ok)", "(~kv_ok)",
      "Ulysses does not check the query heads"),
    M("cp-tiers", "cost/context.py", "grp = cp_groups(sub, tier_sizes(problem))",
      "grp = cp_groups(sub, problem.cluster.nvlink_domain)",
      "CP groups placed in NVLink domains only, blind to the network's tiers", COMM),
    M("cp-window", "cost/context.py", "return (t[\"cp\"] > 1) & ring & windowed",
      "return (t[\"cp\"] > 1) & windowed", "sliding windows refused with a2a and allgather too"),
    # ---- distinct_rows.py: stage times once per distinct row
    M("distinct-columns", "cost/distinct_rows.py", 'NOT_IN_STAGE_TIMES = ("zero", "oo")',
      'NOT_IN_STAGE_TIMES = ("zero", "oo", "mb")',
      "stage times shared by rows that differ in micro-batch size",
      ("tests/test_distinct_rows.py",)),
    M("sync-columns", "cost/time.py",
      'DP_SYNC_COLUMNS = ("tp", "pp", "vp", "lf", "ll", "sch", "ep", "etp", "dp", "cp")',
      'DP_SYNC_COLUMNS = ("tp", "pp", "vp", "lf", "ll", "sch", "ep", "etp", "dp")',
      "gradient-sync collectives shared by rows that differ in CP degree",
      ("tests/test_distinct_rows.py",)),
    M("dominance-one-figure", "search/dominated.py",
      "ca, cb = costs[:, a], costs[:, b]", "ca, cb = costs[:1, a], costs[:1, b]",
      "a split dropped on CP seconds without recompute alone",
      ("tests/test_dominated_splits.py",)),
    M("dominance-no-buffers", "search/dominated.py",
      "ca, cb = costs[:, a], costs[:, b]", "ca, cb = costs[:2, a], costs[:2, b]",
      "a split dropped though its CP buffers are smaller",
      ("tests/test_dominated_splits.py",)),
    M("dominance-ties", "search/dominated.py",
      "beaten[b[le & ~ge]] = True", "beaten[b[le]] = True",
      "of two tied splits one is dropped",
      ("tests/test_dominated_splits.py",)),
    M("dominance-schedules", "search/dominated.py",
      "PRUNED_SCHEDULES = (0, 1)", "PRUNED_SCHEDULES = (0, 1, 2, 3, 4, 5)",
      "splits compared under zero-bubble and DualPipe schedules",
      ("tests/test_dominated_splits.py",)),
    # ---- top.py: the ranking's head without every layout's memory
    M("top-stop-early", "search/top.py",
      "time_key(np.array([rest]), fastest)[0] > last",
      "time_key(np.array([rest]), fastest)[0] >= last",
      "the head's search stops while layouts tied with its last are unlooked",
      ("tests/test_ranked_top.py",)),
    M("top-no-tie-breaks", "search/top.py",
      "order = np.lexsort((simplicity(valid, found), total, time_key(step[found], fastest)))",
      "order = np.argsort(time_key(step[found], fastest), kind=\"stable\")",
      "the head's ties left in table order",
      ("tests/test_ranked_top.py",)),
    # ---- validation/plausible.py: the least model state a memory row can report
    M("least-state-no-optimizer", "validation/plausible.py",
      "per_param = weight + tr.optimizer_bytes * (1.0 - optimizer_offload)",
      "per_param = weight",
      "the memory floor without the optimizer states",
      ("tests/test_plausible.py",)),
    M("extends-tables-replaced", "presets/__init__.py",
      "merged[key] = {**base.get(key, {}), **data[key]}", "merged[key] = dict(data[key])",
      "a stack that extends another replaces its sources and profile tables whole",
      ("tests/test_stack_extends.py",)),
    M("automodel-read-as-fsdp", "validation/derive.py",
      '"megatron-core", "nemo-automodel",\n               "torchtitan"',
      '"megatron-core",\n               "torchtitan"',
      "NeMo AutoModel rows tried after the FSDP stacks whose words they carry",
      ("tests/test_validate.py",)),
    M("layout-fix-dp-kept", "validation/derive.py",
      "        dp = n_gpus // (tp * pp * cp)\n        assumptions.append(f\"layout from",
      "        assumptions.append(f\"layout from",
      "a row whose pipeline degree the recipe file corrects keeps its printed data-parallel "
      "degree", ("tests/test_megatron_bridge.py",)),
    M("head-dim-not-from-preset", "validation/modelspec.py",
      'if head_dim is not None and head_dim * need["heads"] != need["hidden"]:',
      'if False:',
      "a row whose heads are wider than hidden / heads keeps the narrower width",
      ("tests/test_stack_extends.py",)),
    M("window-not-from-preset", "validation/modelspec.py",
      'window = _window_from_preset(row)  # no row of the table prints one',
      'window = None',
      "a gpt-oss row built from the table's columns keeps full attention on every layer",
      ("tests/test_stack_extends.py",)),
    M("hybrid-stack-by-name", "cost/layer_rules.py",
      "    if not p.stack.hybrid_layers:\n        bad |= True",
      "    if p.stack.name not in (\"megatron-core\", \"megatron-bridge\"):\n        bad |= True",
      "hybrid models refused by stack name, whatever the stack declares", HYBRID),
    M("scan-flops-only", "cost/ssm_mixer.py",
      "    return np.maximum(compute, memory_bound_time(problem, nbytes))",
      "    return compute",
      "the scan priced by its FLOPs alone, its kernels' HBM traffic ignored", HYBRID),
    M("ssd-states-bf16", "cost/mamba.py",
      'SSD_FWD = {"D": 6.0, "DNQ": 12.0,',
      'SSD_FWD = {"D": 6.0, "DNQ": 8.0,',
      "the forward's fp32 chunk states counted at 2 bytes", HYBRID),
    M("delta-bytes-dropped", "cost/linear_attention.py",
      "        scan_bytes=delta_rule_bytes_per_token(g),\n",
      "",
      "the gated delta rule's kernel bytes left out of its scan's roofline", HYBRID),
    # ---- plan.py: nothing fits
    M("nearest-unsorted", "search/plan.py",
      'near = miss[np.argsort(mem["total"][miss], kind="stable")[:n_nearest]]',
      "near = miss[:n_nearest]",
      "the nearest misses are the first rows that do not fit, not the smallest",
      ("tests/test_search.py::test_nothing_fits_returns_nearest_misses",)),
    M("alternatives-farthest-batch", "search/explain.py",
      "sorted((v for v in ends if 0 < v < batch), reverse=True)",
      "sorted(v for v in ends if 0 < v < batch)",
      "the global batch named below the asked one is the farthest, not the nearest",
      ("tests/test_search.py::test_nothing_passing_the_rules_names_the_nearest_changes_that_would",)),
    M("alternatives-tp-rule-kept", "search/explain.py",
      'lifted = tuple(r for r in rules if r.name != "tp_in_node")', "lifted = tuple(rules)",
      "--allow-tp-across-nodes is probed with the rule it lifts still on",
      ("tests/test_search.py::test_tp_fixed_across_nodes_is_told_the_flag_that_admits_it",)),
    M("cp-hier-sizes", "search/enumerate.py",
      "[u for u in sizes if 1 < u < c and c % u == 0]",
      "[u for u in sizes if 1 < u <= c and c % u == 0]",
      "a2a+ring with the whole group as all-to-all (a2a twice)",
      ("tests/test_search.py::test_exact_count_small_case",)),
    # ---- stages.py: in-flight micro-batches
    M("inflight-1f1b", "cost/stages.py", "one_f_one_b = np.minimum(pp - rank, m)",
      "one_f_one_b = np.minimum(pp - rank + 1, m)", "1F1B holds one more"),
    M("inflight-interleaved", "cost/stages.py",
      "chunks = np.minimum(2 * (pp - rank - 1) + (vp - 1) * pp + 1, m * vp)",
      "chunks = np.minimum(2 * (pp - rank - 1) + vp * pp + 1, m * vp)",
      "interleaved warm-up one round too long"),
    M("micro-batches", "cost/stages.py",
      "return global_batch // np.maximum(t[\"dp\"] * t[\"mb\"], 1)",
      "return global_batch // np.maximum(t[\"dp\"], 1)", "micro-batch size ignored"),
    # ---- device_memory.py
    M("fragmentation", "cost/device_memory.py", "FRAGMENTATION = 0.066", "FRAGMENTATION = 0.06",
      "allocator fragmentation changed"),
    M("nccl-pair", "cost/device_memory.py", "NCCL_PER_PAIR = 544e6", "NCCL_PER_PAIR = 688e6",
      "2-GPU communicator priced as a large one"),
    M("nccl-embedding-group", "cost/device_memory.py",
      "pairs = pairs + np.where((pp > 1) & tied_embeddings, 1.0, 0.0)",
      "pairs = pairs + np.where(pp > 1, 1.0, 0.0)", "embedding group also for untied models"),
    # ---- offload.py
    M("offload-opt-copies", "cost/offload.py",
      "copies = moved * (float(problem.training.grad_bytes) + 2.0) / link",
      "copies = moved * 2.0 / link", "optimizer offload moves no gradients"),
    M("offload-act-bwd", "cost/offload.py",
      "return n_off * (np.maximum(0.0, copy - fwd_layer) + np.maximum(0.0, copy - bwd_layer))",
      "return n_off * np.maximum(0.0, copy - fwd_layer)", "no copy back before the backward"),
    M("module-offload-act", "cost/offload.py",
      "per = per + (arch.act_coef - 2.0) * arch.expert_ffn / t[\"etp\"]",
      "per = per + arch.act_coef * arch.expert_ffn / t[\"etp\"]",
      "moe_act offloads the FC2 input too", MOE),
    M("module-offload-fc1", "cost/offload.py",
      "per = per + _linear_bytes(problem) * arch.hidden",
      "per = per + _linear_bytes(problem) * arch.hidden / t[\"etp\"]",
      "expert_fc1's input split by expert TP", MOE),
    M("module-offload-transfer", "cost/memory.py",
      "* module_offload_in_transfer(problem, arch, t), 0.0)",
      "* 0.0 * module_offload_in_transfer(problem, arch, t), 0.0)",
      "no offloaded layer kept in transfer", MOE),
    M("module-offload-free", "cost/time.py",
      "                parts[kind][\"off\"] = parts[kind][\"off\"] + activation_offload_time(",
      "                parts[kind][\"off\"] = parts[kind][\"off\"] + 0.0 * activation_offload_time(",
      "module offload copies cost no time", MOE),
    M("a2a-overlap-mtp", "rules.py",
      "mtp = (a.n_mtp > 1) | ((a.n_mtp == 1) & (t[\"pp\"] == 1))", "mtp = a.n_mtp > 1",
      "the EP overlap with one MTP layer allowed without a pipeline", MOE),
    M("block-join-offset", "evaluate.py", "whole[i:i + len(v)] = v",
      "whole[i:i + len(v)] = v[::-1]", "a block's rows joined in the wrong order",
      ("tests/test_row_independence.py", "tests/test_lazy_ledger.py")),
    M("block-split-sliver", "evaluate.py", "blocks = -(-blocks // WORKERS) * WORKERS\n",
      "blocks = max(blocks, 1)\n", "a table split only by the block cap (one thread idle)",
      ("tests/test_row_independence.py",)),
    M("offload-all-layers", "rules.py", 'offload = t["ao"] >= n_layers',
      'offload = t["ao"] > n_layers', "every layer offloaded, which Megatron-Core refuses",
      ("tests/test_search.py",)),
    M("block-recompute-beyond-chunk", "rules.py",
      '(t["rn"] > chunk_layers(n_layers, t))', '(t["rn"] > chunk_layers(n_layers, t) + 1)',
      "block recompute of more layers than a chunk holds", ("tests/test_search.py",)),
    M("host-link-eff", "cost/offload.py",
      "return gpu.host_link_gb_per_s * 1e9 * problem.profile.host_link_efficiency",
      "return gpu.host_link_gb_per_s * 1e9", "host link at its spec"),
    # ---- capacity_model.py: goodput, cost, energy
    M("energy-node-overhead", "capacity_model.py",
      "NODE_OVERHEAD = (10.2e3 - 8 * 700) / (8 * 700)",
      "NODE_OVERHEAD = (10.2e3 - 8 * 700) / 10.2e3", "host power over the node's, not the GPUs'",
      CAPACITY),
    M("energy-pue", "capacity_model.py", "PUE = 1.10", "PUE = 1.20", "PUE changed", CAPACITY),
    M("energy-power-fraction", "capacity_model.py", "POWER_FRACTION = 1.0", "POWER_FRACTION = 0.9",
      "power fraction changed", CAPACITY),
    M("energy-formula", "capacity_model.py",
      "* a.power_fraction * (1.0 + a.node_overhead) * a.pue",
      "* a.power_fraction * a.node_overhead * a.pue", "energy of the host alone", CAPACITY),
    M("mtbf", "capacity_model.py", "LLAMA3_INTERRUPTIONS = 419", "LLAMA3_INTERRUPTIONS = 466",
      "interruption count changed", CAPACITY),
    M("young-interval", "capacity_model.py", "tau = math.sqrt(2.0 * C * M)",
      "tau = math.sqrt(C * M)", "Young's interval without the 2", CAPACITY),
    M("daly-loss", "capacity_model.py", "denom = 1.0 - (tau / 2.0 + R) / M",
      "denom = 1.0 - (tau + R) / M", "a whole interval lost per failure", CAPACITY),
    M("gpu-hours", "capacity_model.py", "gpu_h = days * 24.0 * n", "gpu_h = days * 24.0",
      "GPU-hours of one GPU", CAPACITY),
    M("days-goodput", "capacity_model.py", "days = tokens / tps / 86400.0 * factor",
      "days = tokens / tps / 86400.0", "days without the goodput loss", CAPACITY),
    # ---- hybrid layer types (cost/layer_types.py, cost/mamba.py, cost/linear_attention.py,
    # cost/ssm_mixer.py, cost/layer_rules.py)
    M("mamba-in-proj", "cost/mamba.py", "in_width=2 * d_in + 2 * G * N + H",
      "in_width=2 * d_in + G * N + H", "in_proj with one of B, C", HYBRID),
    M("ssd-state-terms", "cost/mamba.py", "H * (2.0 * Q * P + 4.0 * N * P + 2.0 * N * P / Q)",
      "H * (2.0 * Q * P + 2.0 * N * P + 2.0 * N * P / Q)", "SSD without the state output", HYBRID),
    M("delta-rule-state", "cost/linear_attention.py", "+ C * C / 3.0 + 6.0 * dk * dv)",
      "+ C * C / 3.0 + 4.0 * dk * dv)", "delta rule without the state update", HYBRID),
    M("scan-bwd", "cost/ssm_mixer.py", "SCAN_BWD = 2.0", "SCAN_BWD = 1.0",
      "scan backward as cheap as the forward", HYBRID),
    M("mixer-act-shard", "cost/ssm_mixer.py", "return 2.0 * self.in_width + 4.0 * self.out_in",
      "return 2.0 * self.in_width + 2.0 * self.out_in", "out_proj input not stored", HYBRID),
    M("mixer-tp-units", "cost/layer_rules.py", "bad |= (u % tp) != 0", "bad |= (u % tp) < 0",
      "Mamba groups not checked against TP", HYBRID),
    M("hybrid-block-pairs", "cost/layer_types.py", "single = dict(blocks=1.0,",
      "single = dict(blocks=2.0,", "a single-block layer with two TP pairs", HYBRID),
    M("hybrid-vp-chunks", "cost/layer_types.py", "a = np.clip((j * pp + r) * chunk, 0, L)",
      "a = np.clip((j + r) * chunk, 0, L)", "interleaved chunks taken as contiguous", HYBRID),
    M("hybrid-mtp-layers", "cost/layer_types.py",
      "c[k] = c[k] + np.asarray(st.mtp, dtype=np.float64)", "c[k] = c[k] + 0.0 * np.asarray(st.mtp)",
      "MTP modules without their attention and MoE layers", HYBRID),
    M("hybrid-split-weights", "splits.py",
      "w = np.array([per[c] for c in hy.letters], dtype=np.float64)",
      "w = np.ones(len(hy.letters))", "pipeline split by layer count on a hybrid model", HYBRID),
    M("hybrid-split-head", "splits.py", "out.append(cum[L] - cum[L - last] + w_last)",
      "out.append(cum[L] - cum[L - last])", "weighted split without the output layer", HYBRID),
    M("hybrid-no-vp", "cost/layer_rules.py", "| (t[\"rn\"] != -1) | (t[\"vp\"] > 1)",
      "| (t[\"rn\"] != -1)", "virtual pipeline stages on a Mamba stack", HYBRID),
    M("target-limits-grouped", "exporters/megatron.py",
      'MEGATRON_IGNORES = ("mb", "dp", "cp", "cc", "cu", "ep", "etp")',
      'MEGATRON_IGNORES = ("mb", "dp", "cp", "cc", "cu", "ep", "etp", "zero")',
      "plan --target decides a target's verdict on rows that differ in the ZeRO stage",
      EXPORT),
    M("bridge-grad-dtype", "exporters/megatron_bridge.py",
      'mp = {"grad_reduce_in_fp32": tr.grad_dtype == "fp32"}',
      'mp = {"grad_reduce_in_fp32": True}',
      "the Megatron-Bridge module keeps the preset's fp32 gradient reduction", EXPORT),
    M("bridge-split-first", "exporters/megatron_bridge.py",
      'return out | {"num_layers_in_first_pipeline_stage": sl[0],',
      'return out | {"num_layers_in_first_pipeline_stage": sl[1],',
      "the Megatron-Bridge module's first pipeline stage takes the second's layers", EXPORT),
)


def apply(src: str, m: Mutant) -> str:
    """`src` with the mutant's one change; ValueError unless `old` occurs exactly once."""
    n = src.count(m.old)
    if n != 1:
        raise ValueError(f"{m.name}: {m.file} holds the text {n} times, not once")
    return src.replace(m.old, m.new)


SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".pytest_cache")


def run_one(m: Mutant, python: str, snapshot: Path) -> tuple[str, float, str]:
    """('killed' | 'survived' | 'stale' | 'broken', seconds, last output line) for one mutant,
    run on a copy of `snapshot` (the repository as it was when the run started)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{m.name}-") as tmp:
        shutil.copytree(snapshot, tmp, dirs_exist_ok=True)
        path = Path(tmp) / "autoparallel" / m.file
        try:
            path.write_text(apply(path.read_text(), m))
        except ValueError as exc:
            return "stale", time.perf_counter() - t0, str(exc)
        # PYTHONSAFEPATH: `python -m` (pytest, the CLI runs of the tests) must not put the
        # repository, and its unmutated package, ahead of the copy on sys.path
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [tmp] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
            PYTHONDONTWRITEBYTECODE="1", PYTHONSAFEPATH="1")
        probe = subprocess.run([python, "-c", "import autoparallel; print(autoparallel.__file__)"],
                               env=env, capture_output=True, text=True, cwd=tmp)
        if not probe.stdout.strip().startswith(tmp):
            return "broken", time.perf_counter() - t0, (
                f"the copy is not imported first: {probe.stdout or probe.stderr}")
        # the subset's files this tree has (an older checkout may lack some)
        tests = [t for t in m.tests if (Path(tmp) / t.split("::")[0]).exists()]
        if not tests:
            return "broken", time.perf_counter() - t0, "none of its tests exist in this tree"
        # one process per mutant (`-o addopts=`: not the suite's pytest-xdist workers, under
        # which `-x` stopping the run exits 2, "interrupted", instead of 1)
        r = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                            "-o", "addopts=", *tests], env=env, capture_output=True, text=True,
                           cwd=tmp)
        last = (r.stdout.strip().splitlines() or [""])[-1]
        # pytest exit 1: a test failed; 0: all passed; anything else (usage error, no tests
        # collected, internal error) says nothing about the mutant
        state = {0: "survived", 1: "killed"}.get(r.returncode, "broken")
        return state, time.perf_counter() - t0, last if state != "broken" else (
            f"pytest exit {r.returncode}: {last}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at a time")
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="repository to mutate and test (default: this one), e.g. an older "
                         "checkout to see which mutants its tests let through")
    args = ap.parse_args(argv)
    chosen = list(MUTANTS)
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {m.name for m in MUTANTS}
        if unknown:
            ap.error(f"unknown mutant(s): {', '.join(sorted(unknown))}")
        chosen = [m for m in MUTANTS if m.name in names]
    if args.list:
        for m in chosen:
            print(f"{m.name:24} {m.file:24} {m.why}")
        return 0
    print(f"{len(chosen)} mutants, {args.jobs} at a time")
    outcomes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="mutants-snapshot-") as snap, \
            ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        # the package and its tests as they are now: editing the tree during a run changes nothing
        shutil.copytree(args.root, snap, ignore=SKIP, dirs_exist_ok=True)
        futures = {m.name: pool.submit(run_one, m, sys.executable, Path(snap)) for m in chosen}
        for m in chosen:
            state, secs, last = futures[m.name].result()
            outcomes[m.name] = state
            print(f"{state:9} {m.name:24} {secs:6.1f} s  {m.why}" +
                  ("" if state == "killed" else f"  [{last}]"), flush=True)
    survivors = [n for n, s in outcomes.items() if s == "survived"]
    stale = [n for n, s in outcomes.items() if s in ("stale", "broken")]
    killed = len(outcomes) - len(survivors) - len(stale)
    print(f"\n{killed} of {len(outcomes)} killed; {len(survivors)} survived"
          + (f": {', '.join(survivors)}" if survivors else "")
          + (f"; {len(stale)} no longer apply or broke the run: {', '.join(stale)}"
             if stale else ""))
    return 1 if survivors or stale else 0


if __name__ == "__main__":
    sys.exit(main())
