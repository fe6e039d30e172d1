"""Nanotron: the layout part of its YAML config (`parallelism`, plus the `tokens`, `optimizer`
and `model` keys that fix the batch, ZeRO and shapes), to merge into a full config and run with
`torchrun ... run_train.py --config-file cfg.yaml`.

Keys and checks follow launchers.md §5 (`src/nanotron/config/parallelism_config.py`,
`config.py`, `parallel/context.py`). Mapping: `parallelism.dp/tp/pp/context_parallel_size`
are the degrees (DP is given, not derived); SP = `tp_mode: REDUCE_SCATTER`; full recompute =
`recompute_layer: true`; ZeRO-1 = `optimizer.zero_stage: 1`; micro-batches per step =
`tokens.batch_accumulation_per_replica`. `pp_engine: 1f1b` matches the 1F1B in-flight
activations the cost model assumes (the default `afab` keeps every micro-batch's activations).

Refused (not expressible): interleaving (no VP), selective recompute (no such option), EP > 1
(the rank grid only works for ep = 1 in this version), ZeRO-2/3 (`zero_stage` is 0 or 1),
ZeRO-1 with CP > 1 (Nanotron shards the optimizer over dp only, the plan over dp x cp), TP above
the KV heads (`num_key_value_heads >= tp`), a context-parallel form other than allgather (its CP
is `llama3_ring_attention`, which all-gathers K and V).
"""

from __future__ import annotations


from ..specs.layout import Recompute
from ._base import Exporter, Job, architecture, comments, recompute_of


def nanotron_limits(job: Job) -> list[str]:
    """What Nanotron cannot run among layouts that pass autoparallel's hard rules."""
    lay, m, reasons = job.layout, job.problem.model, []
    if lay.vp > 1:
        reasons.append(f"interleaving (vp = {lay.vp}): Nanotron splits layers into one "
                       "contiguous block per pipeline rank (docs/export.md, nanotron row)")
    if recompute_of(job) == Recompute.SELECTIVE:
        reasons.append("selective recompute: Nanotron only has full per-layer recompute "
                       "(recompute_layer; docs/export.md, nanotron row)")
    if lay.ep > 1:
        reasons.append(f"expert parallelism (ep = {lay.ep}): Nanotron's rank grid only works "
                       "for ep = 1 in the version described (docs/export.md, nanotron row)")
    if lay.etp is not None:
        reasons.append(f"expert tensor parallelism etp = {lay.etp} other than tp = {lay.tp}: "
                       "Nanotron has no parallel folding (experts follow its TP); megatron "
                       "writes it (--expert-tensor-parallel-size)")
    if lay.zero > 1:
        reasons.append(f"ZeRO-{lay.zero}: Nanotron's optimizer.zero_stage is 0 or 1 "
                       "(docs/export.md, nanotron row)")
    elif lay.zero == 1 and lay.cp > 1:
        reasons.append(f"ZeRO-1 with cp = {lay.cp}: Nanotron shards the optimizer over dp "
                       "only, the plan over dp x cp, so memory would exceed the estimate; use "
                       "zero 0 or cp = 1")
    if lay.cp > 1 and lay.cp_form.value != "allgather":
        reasons.append(f"context-parallel form {lay.cp_form.value}: Nanotron's context "
                       "parallelism is llama3_ring_attention, which all-gathers K and V (form "
                       "allgather); megatron and slurm write --cp-comm-type "
                       + {"ring": "p2p", "a2a": "a2a", "a2a+ring": "a2a+p2p"}[lay.cp_form.value])
    if m.activation != "swiglu":
        reasons.append(f"{m.activation} MLP: Nanotron's Llama model is a gated-SiLU, RMSNorm, "
                       "bias-free decoder (LlamaConfig), so it cannot build this model")
    if m.kv_heads < lay.tp:
        reasons.append(f"tp = {lay.tp} exceeds the KV heads ({m.kv_heads}): Nanotron needs "
                       "num_key_value_heads >= tp (docs/export.md, nanotron row)")
    return reasons


def config(job: Job) -> dict:
    """The YAML keys, in file order."""
    lay, m, tr = job.layout, job.problem.model, job.problem.training
    parallelism = {
        "dp": int(lay.dp), "tp": lay.tp, "pp": lay.pp, "pp_engine": "1f1b",
        "tp_mode": "REDUCE_SCATTER" if lay.sp else "ALL_REDUCE",
        "tp_linear_async_communication": bool(lay.sp),
        "tp_recompute_allgather": True,
        "recompute_layer": recompute_of(job) == Recompute.FULL,
        "context_parallel_size": lay.cp,
        "expert_parallel_size": lay.ep,
    }
    model_config = {
        "num_hidden_layers": m.n_layers, "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size, "num_attention_heads": m.n_heads,
        "num_key_value_heads": m.kv_heads, "vocab_size": m.vocab_size,
        "max_position_embeddings": tr.seq_len, "tie_word_embeddings": m.tied_embeddings,
        "hidden_act": "silu",
    }
    rope = architecture(job).rope_theta
    if rope is not None:
        model_config["rope_theta"] = float(rope)
    if lay.cp > 1:
        model_config["_attn_implementation"] = "llama3_ring_attention"
    return {
        "parallelism": parallelism,
        "tokens": {"sequence_length": tr.seq_len, "micro_batch_size": lay.micro_batch,
                   "batch_accumulation_per_replica": job.micro_batches},
        # fp32 gradient accumulation buffers are what `grad_dtype: fp32` counts (4 bytes each)
        "optimizer": {"zero_stage": lay.zero,
                      "accumulate_grad_in_fp32": tr.grad_dtype == "fp32"},
        "model": {"dtype": "bfloat16", "model_config": model_config},
    }


class NanotronExporter(Exporter):
    """Nanotron YAML: parallelism, tokens, optimizer.zero_stage and model shape keys."""

    name = "nanotron"
    suffix = ".yaml"
    summary = "Nanotron YAML config keys (parallelism block + batch, ZeRO, shapes)"

    def limits(self, job: Job) -> list[str]:
        return nanotron_limits(job)

    def text(self, job: Job) -> str:
        m = job.problem.model
        notes = [
            "Nanotron config keys that fix the layout: merge them into a full config, then "
            f"CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes {job.n_nodes} --nproc_per_node "
            f"{job.gpus_per_node} run_train.py --config-file cfg.yaml",
            "pp_engine 1f1b: the plan assumes 1F1B in-flight activations (afab keeps all).",
        ]
        if m.moe is not None or m.mla is not None:
            notes.append("This model's MoE / MLA keys are not written: add them for your "
                         "Nanotron model class.")
        head = "\n".join(comments(job.header + notes))
        import yaml  # only when a Nanotron file is written (its import is the slow part)

        body = yaml.safe_dump(config(job), sort_keys=False, default_flow_style=False)
        return head + "\n" + body
